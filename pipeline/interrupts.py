"""SIGINT and SIGTERM stop a run cleanly, and never halfway through publishing.

`python -m pipeline.run` handles both (a scheduler's timeout and `docker stop` send SIGTERM)
while its `main()` runs (`handled`), and restores what was there after. A signal is recorded,
and raises KeyboardInterrupt in the driver's main thread only while the pipeline runs
(`interruptible`); one that comes earlier takes effect when the pipeline would start, one that
comes later (the lock's release, reading the result back) changes nothing. Then:

- Beam's multi_processing workers are killed first: the FnApiRunner joins the threads that wait
  for them, and a worker whose job is gone would keep the driver (and its lock) forever.
- A publish under way in the driver's process (the default in_memory mode, Prism's loopback
  workers) finishes first, and one not yet begun does not begin: the output holds either the
  old dataset or the new one, never the journal of a half-finished publish.
- A second signal does not cut the clean-up short; a third exits at once (a hung filesystem).

Python runs a signal's handler in the main thread, once that thread runs again, but the kernel
may deliver the signal to any thread. Beam's main thread can wait without a timeout for workers
the same signal killed (multi_processing, a kill of the process group), and would never run it.
So a thread of imgrec's reads the signal numbers Python writes to its wakeup fd, interrupts the
main thread's wait with a signal whose handler does nothing (Python then runs the pending
handlers), and on the third signal exits by itself.

What the user is told comes from the output (`pipeline.output.publish.interrupted_outcome`), not from
when the signal came.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
from typing import Iterator, NoReturn, Optional

from pipeline.errors import RunFailed
from pipeline.reaper import DRIVER_ENV, kill_marked

# Beam's SubprocessSdkWorker passes this to every worker it starts (and to their `sh -c`).
_SDK_WORKER_ENV = b"CONTROL_API_SERVICE_DESCRIPTOR="
_PUBLISH_WAIT_SECONDS = 60.0  # a publish is renames; a minute is a hung filesystem
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_GIVE_UP_AFTER = 3  # signals
_NUDGE = signal.SIGURG  # ignored by default; nothing in the driver uses out-of-band socket data

# Process-wide: one conversion at a time per process is handled (`main()` runs one).
_publishing = 0  # threads of this process inside `publishing()`
_idle = threading.Condition()
_received: list[int] = []  # the signals since `handled()` began
_interruptible = False


def received() -> Optional[int]:
    """The first signal since `handled()` began, if any (Beam may have wrapped the
    KeyboardInterrupt it raised in a RuntimeError on its way up)."""
    return _received[0] if _received else None


def on_signal(signum: int, _frame) -> None:
    """Records the signal; interrupts the pipeline if it is running and not publishing."""
    _received.append(signum)
    if len(_received) > 1 or _publishing or not _interruptible:
        return
    marker = os.environ.get(DRIVER_ENV)
    if marker:  # the Beam SDK worker processes this driver started (multi_processing mode)
        kill_marked(marker, also=_SDK_WORKER_ENV)
    raise KeyboardInterrupt(f"signal {signum}")


def _before_the_run(signum: int, _frame) -> NoReturn:
    os.write(2, b"imgrec: interrupted while starting; nothing was written\n")
    os._exit(130)


def exit_until_handled() -> None:
    """From the entry point's first line until `handled()`: a signal ends the process at once,
    with one line. Importing Beam takes a second, nothing has been touched yet, and Python's
    default would print the traceback of whichever import it cut short."""
    for signum in _SIGNALS:
        signal.signal(signum, _before_the_run)


def _wake_main_thread(wakeups: int) -> None:
    """Until `handled()` closes the wakeup pipe: each SIGINT/SIGTERM interrupts the main thread's
    wait; the third ends the process."""
    main, count = threading.main_thread().ident, 0
    with os.fdopen(wakeups, "rb", buffering=0) as pipe:
        while numbers := pipe.read(64):
            new = sum(number in _SIGNALS for number in numbers)  # not the nudges', which come here too
            count += new
            if count >= _GIVE_UP_AFTER:
                os.write(2, b"imgrec: error: interrupted again: exiting without cleaning up; run the same command "
                            b"again\n")
                os._exit(130)
            if new:
                signal.pthread_kill(main, _NUDGE)


@contextlib.contextmanager
def _main_thread_woken() -> Iterator[None]:
    """Runs `_wake_main_thread` on this process's signals while the block runs (main thread)."""
    wakeups, write_end = os.pipe()
    os.set_blocking(write_end, False)
    nudge_before = signal.signal(_NUDGE, lambda *_: None)
    wakeup_before = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    threading.Thread(target=_wake_main_thread, args=(wakeups,), name="imgrec-signals", daemon=True).start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(wakeup_before)
        os.close(write_end)  # the thread reads to the end and stops
        signal.signal(_NUDGE, nudge_before)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Handles both signals in this (main) thread, and restores the previous handlers after.
    Once interrupted, what Beam reports about the steps and worker threads it cut short (a
    traceback each) is noise: the one line is the news."""
    previous = {signum: signal.getsignal(signum) for signum in _SIGNALS}
    default_hook = threading.excepthook

    def beam_noise(record: logging.LogRecord) -> bool:
        return not _received or not record.name.startswith("apache_beam")

    def thread_died(args) -> None:
        grpc = sys.modules.get("grpc")
        # Beam's reader of a portable job's messages dies with the job service; the run says so in one line.
        job_service_gone = (grpc is not None and isinstance(args.exc_value, grpc.RpcError)
                            and args.thread is not None and args.thread.name == "wait_until_finish_read")
        if not _received and not job_service_gone:
            default_hook(args)

    handlers = list(logging.getLogger().handlers)
    _received.clear()
    for signum in _SIGNALS:
        signal.signal(signum, on_signal)
    for handler in handlers:
        handler.addFilter(beam_noise)
    threading.excepthook = thread_died
    try:
        with _main_thread_woken():
            yield
    finally:
        _received.clear()  # a later run(), unhandled, must not find this one's signal
        for signum, handler_before in previous.items():
            # The entry point's start-up handler would say "nothing was written" after a publish;
            # only `exit_quietly` follows, which ignores signals too.
            signal.signal(signum, signal.SIG_IGN if handler_before is _before_the_run else handler_before)
        for handler in handlers:
            handler.removeFilter(beam_noise)
        threading.excepthook = default_hook


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """The pipeline's run: a signal (or one that came before it) raises KeyboardInterrupt."""
    global _interruptible
    if _received:
        raise KeyboardInterrupt(f"signal {_received[0]}")
    _interruptible = True
    try:
        yield
    finally:
        _interruptible = False


@contextlib.contextmanager
def publishing() -> Iterator[None]:
    """Marks the renames of a publish: a signal arriving meanwhile takes effect after them, and
    after a signal no publish begins. The count goes up before the signal is looked at, and the
    handler records before it looks at the count, so one of them always sees the other."""
    global _publishing
    with _idle:
        _publishing += 1
    try:
        if _received:
            raise RunFailed(f"interrupted (signal {_received[0]}) before publishing; nothing was published")
        yield
    finally:
        with _idle:
            _publishing -= 1
            _idle.notify_all()


def wait_for_publishing(timeout: float = _PUBLISH_WAIT_SECONDS) -> bool:
    """Blocks while another thread of this process publishes (Prism's loopback workers): the
    interrupted driver must not remove the staging that is being moved. False on a timeout."""
    with _idle:
        return _idle.wait_for(lambda: not _publishing, timeout)


def exit_quietly(code: int) -> NoReturn:
    """`sys.exit` for the entry points, after `main()`. What is left is Beam's clean-up (stopping
    Prism takes a second, in an atexit hook) and the interpreter's; a signal now would only turn
    the outcome into a traceback or a death by signal. So both are ignored, at the C level: Python
    restores the default action of signals with Python handlers while it finalizes."""
    for signum in _SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    gc.freeze()  # at exit the collector would walk every object once more, to free what the OS frees anyway
    sys.exit(code)
