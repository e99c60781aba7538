"""Capturing what native code writes to file descriptor 2, and giving it back."""
from __future__ import annotations

import os
import pathlib
import signal

import pytest

from transforms.images.native_stderr import call_capturing_stderr, write_stderr

pytestmark = pytest.mark.unit


def test_returns_the_result_and_what_was_written_to_fd_2(capfd):
    result, printed = call_capturing_stderr(lambda: os.write(2, b"from native code\n") and "done")
    assert (result, printed) == ("done", "from native code\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"  # fd 2 is restored, and the capture is not echoed


def test_each_call_sees_only_its_own_output():
    call_capturing_stderr(lambda: os.write(2, b"a long first message\n"))
    assert call_capturing_stderr(lambda: os.write(2, b"second\n"))[1] == "second\n"
    assert call_capturing_stderr(lambda: None)[1] == ""


def test_output_of_a_call_that_raises_goes_on_to_stderr(capfd):
    def fails():
        os.write(2, b"native diagnostics\n")
        raise ValueError("decoder failed")

    with pytest.raises(ValueError, match="decoder failed"):
        call_capturing_stderr(fails)
    assert capfd.readouterr().err == "native diagnostics\n"


def test_write_stderr_passes_text_on(capfd):
    write_stderr("passed on\n")
    assert capfd.readouterr().err == "passed on\n"


def test_a_closed_stderr_neither_fails_the_call_nor_stays_open(tmp_path):
    """A process started with fd 2 closed: the capture works, and fd 2 is closed again after."""
    import subprocess
    import sys

    script = ("import os; from transforms.images.native_stderr import call_capturing_stderr, write_stderr\n"
              "result, printed = call_capturing_stderr(lambda: os.write(2, b'native\\n') and 7)\n"
              "write_stderr('nowhere to go\\n')\n"
              "closed = False\n"
              "try:\n    os.fstat(2)\nexcept OSError:\n    closed = True\n"
              "print(result, repr(printed), closed)\n")
    out = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         cwd=pathlib.Path(__file__).parent.parent, check=True, pass_fds=(),
                         preexec_fn=lambda: os.close(2), text=True).stdout
    assert out == "7 'native\\n' True\n"


def test_a_fork_while_another_thread_captures_leaves_the_child_a_working_capture_and_stderr(capfd):
    """Library use: a program that forks while one of its threads decodes. The child's capture
    must neither wait for the parent's nor share its file (the parent's capture stays whole)."""
    import threading

    inside, release, parent_captured = threading.Event(), threading.Event(), []

    def hold() -> None:
        os.write(2, b"parent's decode\n")
        inside.set()
        release.wait(10)

    holder = threading.Thread(target=lambda: parent_captured.append(call_capturing_stderr(hold)[1]))
    holder.start()
    inside.wait(10)
    child = os.fork()
    if child == 0:  # the child: its capture must work, and its stderr be the parent's real one
        signal.alarm(10)  # a child stuck on the lock dies of SIGALRM: the test fails, not hangs
        ok = False
        try:
            ok = call_capturing_stderr(lambda: os.write(2, b"x") and 1) == (1, "x")
            os.write(2, b"child's stderr\n")
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    release.set()
    holder.join()
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent_captured == ["parent's decode\n"]
    assert "child's stderr\n" in capfd.readouterr().err


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd_create: the capture is a temporary file")
def test_the_capture_lives_in_memory_so_a_full_temporary_folder_cannot_swallow_a_warning():
    from transforms.images import native_stderr

    call_capturing_stderr(lambda: None)
    assert os.readlink(f"/proc/self/fd/{native_stderr._sink()}").startswith("/memfd:imgrec-stderr")
