"""What native code prints on the process's stderr (file descriptor 2) while one call runs.

libjpeg reports pixels it had to make up (a scan cut short and padded with grey, a bad Huffman
code) only as a warning printed on stderr, and OpenCV returns the padded image as a success.
Redirecting fd 2 around the decode is the one way to see that from Python. fd 2 belongs to the
whole process, so captures take turns: in a process that decodes on several threads, the
captured calls run one at a time.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import threading
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

_LOCK = threading.Lock()
_sink_descriptor: Optional[int] = None  # this process's capture file, opened on first use
_real_stderr: Optional[int] = None  # while a capture runs: a duplicate of what fd 2 was before


def _after_fork_in_child() -> None:
    """A fork while another thread captures would leave the child's lock held for good, and its
    fd 2 on the parent's capture file; and a capture file the child shared with its parent
    would mix their output."""
    global _LOCK, _sink_descriptor
    _LOCK, _sink_descriptor = threading.Lock(), None
    if _real_stderr is not None:
        os.dup2(_real_stderr, 2)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _sink() -> int:
    """This process's capture file, as a descriptor above 2: in a process started with stderr
    closed, a new file would otherwise become fd 2 itself. In memory where the system allows
    (Linux), so that a full temporary folder cannot swallow a warning."""
    global _sink_descriptor
    if _sink_descriptor is None:
        if hasattr(os, "memfd_create"):
            descriptor = os.memfd_create("imgrec-stderr", os.MFD_CLOEXEC)
            _sink_descriptor = fcntl.fcntl(descriptor, fcntl.F_DUPFD_CLOEXEC, 3)
            os.close(descriptor)
        else:
            with tempfile.TemporaryFile() as opened:
                _sink_descriptor = fcntl.fcntl(opened.fileno(), fcntl.F_DUPFD_CLOEXEC, 3)
    return _sink_descriptor


def write_stderr(text: str) -> None:
    """Passes captured text on to the real stderr; like C's fprintf, ignores a stderr that is
    closed or whose reader has gone (`... 2>&1 | head`): a decode must not fail for that."""
    data = text.encode("utf-8", "surrogateescape")
    try:
        while data:
            data = data[os.write(2, data):]
    except OSError:
        pass


def call_capturing_stderr(function: Callable[[], T], on_raise: Callable[[str], None] = write_stderr) -> tuple[T, str]:
    """`function()`'s result and what was written to fd 2 while it ran. If it raises, whatever it
    printed goes to `on_raise` (by default on to stderr) before the exception propagates."""
    global _real_stderr
    with _LOCK:
        sink = _sink()
        os.ftruncate(sink, 0)
        os.lseek(sink, 0, os.SEEK_SET)
        try:
            _real_stderr = os.dup(2)
        except OSError:  # fd 2 is closed: there is nothing to restore afterwards
            _real_stderr = None
        os.dup2(sink, 2)
        finished = False
        try:
            result = function()
            finished = True
        finally:
            saved, _real_stderr = _real_stderr, None
            if saved is None:
                os.close(2)
            else:
                os.dup2(saved, 2)
                os.close(saved)
            size = os.lseek(sink, 0, os.SEEK_END)
            printed = os.pread(sink, size, 0).decode("utf-8", "surrogateescape") if size else ""
            if not finished and printed:
                on_raise(printed)
    return result, printed
