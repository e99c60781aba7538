"""SIGINT and SIGTERM stop a run cleanly, and never halfway through publishing.

`python -m pipeline.run` installs `on_signal` for both (a scheduler's timeout and `docker stop`
send SIGTERM). A signal raises KeyboardInterrupt in the driver's main thread, as Ctrl-C does,
so the lock is released and the run's staging removed (finished parts stay for a restart), with
two exceptions that keep the output whole:

- While publishing runs in the driver's process (the default in_memory mode, Prism's loopback
  workers), the signal waits until the renames are done: the output then holds either the old
  dataset or the new one, never the journal of a half-finished publish.
- Beam's multi_processing workers are killed first: the FnApiRunner joins the threads that wait
  for them, and a worker whose job is gone would keep the driver (and its lock) forever.

A second signal does not interrupt the clean-up of the first, and once the outcome is known
(`settle`) signals are ignored. What the user is told comes from the output
(`pipeline.publish.interrupted_outcome`), not from when the signal came.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Iterator, Optional

from pipeline.reaper import DRIVER_ENV, marked_processes

# Beam's SubprocessSdkWorker passes this to every worker it starts (and to their `sh -c`).
_SDK_WORKER_ENV = b"CONTROL_API_SERVICE_DESCRIPTOR="
_PUBLISH_WAIT_SECONDS = 60.0  # a publish is renames; a minute is a hung filesystem

_publishing = 0  # threads of this process inside `publishing()`
_idle = threading.Condition()
_received: Optional[int] = None  # the first signal of this run, if any


def received() -> Optional[int]:
    """The signal that interrupted this process, if one did (Beam may have wrapped the
    KeyboardInterrupt in a RuntimeError on its way up)."""
    return _received


def on_signal(signum: int, _frame) -> None:
    """Defers while this process publishes; otherwise kills Beam's SDK workers and interrupts.
    A later signal only adds to the first: interrupting the clean-up would leave staging behind."""
    global _received
    first = _received is None
    _received = _received or signum
    if _publishing or not first:
        return  # the renames are under way (the driver raises after the run), or the run is stopping
    kill_sdk_workers()
    raise KeyboardInterrupt(f"signal {signum}")


def install() -> None:
    """Handles both signals in this (main) thread. Once interrupted, what Beam reports about the
    steps and worker threads it cut short (a traceback each) is noise: the one line is the news."""
    global _received
    _received = None
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    for handler in logging.getLogger().handlers:
        handler.addFilter(lambda record: _received is None or not record.name.startswith("apache_beam"))
    default_hook = threading.excepthook

    def thread_died(args) -> None:
        if _received is None:
            default_hook(args)

    threading.excepthook = thread_died


def settle() -> None:
    """The run is over and its outcome known; what is left is Beam's clean-up (stopping Prism takes
    a second, in an atexit hook) and the interpreter's. A signal now would only turn that outcome
    into a traceback or a death by signal, so both are ignored: at the C level, because Python
    restores the default action of signals with Python handlers while it finalizes."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def publishing() -> Iterator[None]:
    """Marks the renames of a publish: a signal arriving meanwhile takes effect after them.
    (The handler only reads the count, so it never waits for `_idle`, even in the thread inside.)"""
    global _publishing
    with _idle:
        _publishing += 1
    try:
        yield
    finally:
        with _idle:
            _publishing -= 1
            _idle.notify_all()


def wait_for_publishing(timeout: float = _PUBLISH_WAIT_SECONDS) -> None:
    """Blocks while another thread of this process publishes (Prism's loopback workers): the
    interrupted driver must not remove the staging that is being moved."""
    deadline = time.monotonic() + timeout
    with _idle:
        while _publishing and time.monotonic() < deadline:
            _idle.wait(0.1)


def kill_sdk_workers() -> None:
    """Kills the Beam SDK worker processes this driver started (multi_processing mode)."""
    marker = os.environ.get(DRIVER_ENV)
    if not marker:
        return
    for pid in marked_processes(marker, also=_SDK_WORKER_ENV):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
