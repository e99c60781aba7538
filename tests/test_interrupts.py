"""pipeline.interrupts without Beam: when a signal raises, waits, or stops a publish."""
from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import threading

import pytest

from pipeline import interrupts
from pipeline.errors import RunFailed

pytestmark = pytest.mark.unit


def test_handled_restores_the_handlers_and_the_thread_hook():
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), threading.excepthook)
    with interrupts.handled():
        assert signal.getsignal(signal.SIGTERM) == interrupts.on_signal
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), threading.excepthook) == before


def test_a_signal_after_main_does_not_claim_that_nothing_was_written():
    """After main(), the entry point only exits: a signal then must not end it with the start-up
    line, "nothing was written", when main() had just published."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        interrupts.exit_until_handled()
        with interrupts.handled():
            pass
        assert signal.getsignal(signal.SIGINT) == signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_signal_is_forgotten_after_main():
    """A later run() in the same process, without handlers, must not stop for main()'s signal."""
    with interrupts.handled():
        interrupts.on_signal(signal.SIGTERM, None)
    assert interrupts.received() is None
    with interrupts.interruptible(), interrupts.publishing():
        pass


def test_a_signal_raises_only_while_the_pipeline_runs():
    with interrupts.handled():
        interrupts.on_signal(signal.SIGTERM, None)  # before the pipeline: recorded
        assert interrupts.received() == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):  # takes effect when it would start
            with interrupts.interruptible():
                pass
    with interrupts.handled():
        assert interrupts.received() is None
        with pytest.raises(KeyboardInterrupt, match="signal 2"):
            with interrupts.interruptible():
                interrupts.on_signal(signal.SIGINT, None)
        interrupts.on_signal(signal.SIGINT, None)  # a second one: the clean-up goes on
        assert interrupts.received() == signal.SIGINT


def test_a_publish_under_way_finishes_and_none_begins_after_a_signal():
    with interrupts.handled(), interrupts.interruptible():
        with interrupts.publishing():
            interrupts.on_signal(signal.SIGTERM, None)  # deferred: no KeyboardInterrupt here
            renamed = True
        assert renamed and interrupts.received() == signal.SIGTERM
        with pytest.raises(RunFailed, match="before publishing; nothing was published"):
            with interrupts.publishing():
                raise AssertionError("a publish began after the signal")
        assert interrupts.wait_for_publishing(timeout=1)


def test_the_driver_waits_for_a_publish_in_another_thread():
    entered, release, done = threading.Event(), threading.Event(), []

    def publish() -> None:
        with interrupts.publishing():
            entered.set()
            release.wait(5)
            done.append(True)

    with interrupts.handled():
        worker = threading.Thread(target=publish)
        worker.start()
        entered.wait(5)
        assert not interrupts.wait_for_publishing(timeout=0.2)  # still under way: staging stays
        release.set()
        assert interrupts.wait_for_publishing(timeout=5) and done == [True]
        worker.join()


RUN_IN_CHILD = """
import os, signal, sys, threading
from pipeline import interrupts

never = threading.Event()
threading.Thread(target=never.wait, daemon=True).start()  # a thread the kernel may hand signals to
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # ... and here it must
with interrupts.handled():
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    {body}
"""


def run_child(body: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN_IN_CHILD.replace("{body}", body)], capture_output=True, text=True,
                          timeout=30, cwd=pathlib.Path(__file__).parent.parent)


def test_a_signal_another_thread_took_still_interrupts_the_main_threads_endless_wait():
    """Beam's main thread waits with no timeout for workers a process-group kill has also killed;
    Python runs handlers only in the main thread, and the kernel had given the signal to another."""
    child = run_child("""try:
        with interrupts.interruptible():
            never.wait()
    except KeyboardInterrupt as exc:
        print("interrupted:", exc)""")
    assert child.stdout == "interrupted: signal 15\n", child.stderr


def test_the_third_signal_ends_the_process_even_if_the_main_thread_never_runs_again():
    child = run_child("""threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGURG})  # the main thread is never woken
    never.wait()""")
    assert child.returncode == 130
    assert child.stderr == "imgrec: error: interrupted again: exiting without cleaning up; run the same command again\n"


def test_a_signal_before_the_pipeline_runs_costs_no_cpu_while_the_run_waits():
    """A SIGTERM while the run prepares (a listing, a read) is kept for when the pipeline would
    start; the thread that wakes the main thread took its own wake-up signal for a new one and
    woke it again and again, at 70% of a core, until then."""
    child = run_child("""import resource, time
    time.sleep(1.0)  # the signal comes at 0.5 s
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(2.0)
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)""")
    assert float(child.stdout) < 0.3, child.stdout + child.stderr
