"""A small pool of worker processes that import only what their tasks need (not Beam).

`concurrent.futures.ProcessPoolExecutor` re-imports the parent's `__main__` in every worker
(`python -m pipeline.run` imports Beam: 1.3 s each) and forking a process that holds gRPC
threads is unsafe. These workers are fresh interpreters (`python -m transforms.write.process_pool`)
with the parent's `sys.path`; a task is a pickled (function, args), so a worker imports just the
function's module. Each worker is killed by the kernel when its parent dies, and a worker that
dies is replaced (`concurrent.futures` would mark the whole pool broken); what its task last
`note`d tells the parent what it was doing then.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from typing import Any, BinaryIO, Callable, Optional

_PR_SET_PDEATHSIG = 1
_NOTE = struct.Struct("<q")
_NO_NOTE = -1
_note_descriptor: Optional[int] = None  # in a worker: where `note` writes


class WorkerDied(RuntimeError):
    """A worker process exited while running a task (a crash in a decoder, or it was killed):
    its exit code (-N: signal N) and the last `note` of the task, if it made one."""

    def __init__(self, message: str, returncode: Optional[int] = None, note: Optional[int] = None):
        super().__init__(message)
        self.returncode, self.note = returncode, note


def note(value: int) -> None:
    """In a worker, records a number (>= 0) about the task under way, for the parent to read if
    the worker dies; anywhere else, nothing. One write to a file in memory."""
    if _note_descriptor is not None:
        os.pwrite(_note_descriptor, _NOTE.pack(value), 0)


def _note_file() -> int:
    """A descriptor the parent and its worker share: in memory where the system allows (Linux)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("imgrec-note")
    descriptor, path = tempfile.mkstemp()
    os.unlink(path)
    return descriptor


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _send(stream: BinaryIO, value: Any) -> None:
    """Pickled whole before any byte is written: a value that cannot be pickled leaves the
    stream as it was. Pickles delimit themselves, so the other end reads one with `pickle.load`."""
    stream.write(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    stream.flush()


class _Worker:
    """One process and the thread that feeds it tasks from the shared queue. A process that dies
    fails its task and is replaced for the next one; if none can be started, each task fails
    (nothing waits forever)."""

    def __init__(self, tasks: "queue.Queue", initializer: Optional[Callable[[], None]]):
        self._tasks, self._initializer = tasks, initializer
        self._note = _note_file()
        self.process: Optional[subprocess.Popen] = self._start()
        self.thread = threading.Thread(target=self._serve, name="imgrec-pool", daemon=True)
        self.thread.start()

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        process = subprocess.Popen([sys.executable, "-m", "transforms.write.process_pool", str(self._note)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, pass_fds=(self._note,))
        _send(process.stdin, self._initializer)
        return process

    def _noted(self) -> Optional[int]:
        (value,) = _NOTE.unpack(os.pread(self._note, _NOTE.size, 0).ljust(_NOTE.size, b"\xff"))
        return None if value == _NO_NOTE else value

    def _serve(self) -> None:
        while (item := self._tasks.get()) is not None:
            future, function, args = item
            if future.set_running_or_notify_cancel():
                self._run(future, function, args)
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait()
        os.close(self._note)

    def _run(self, future: concurrent.futures.Future, function: Callable, args: tuple) -> None:
        os.pwrite(self._note, _NOTE.pack(_NO_NOTE), 0)
        try:
            if self.process is None or self.process.poll() is not None:  # none yet, or it died idle
                self.process = self._start()
            _send(self.process.stdin, (function, args))
            ok, value = pickle.load(self.process.stdout)
        except (EOFError, OSError, pickle.PickleError) as exc:
            if self.process is None:  # none could be started
                future.set_exception(WorkerDied(f"could not start a converter process: {exc!r}"))
                return
            self.process.kill()  # if it still runs (a task that could not be sent), it is replaced too
            code = self.process.wait()
            future.set_exception(WorkerDied(f"converter process {self.process.pid} died (exit code {code}): "
                                            f"{exc!r}", code, self._noted()))
            self.process = None
            return
        (future.set_result if ok else future.set_exception)(value)


class SubprocessPool(concurrent.futures.Executor):
    def __init__(self, workers: int, initializer: Optional[Callable[[], None]] = None):
        self._tasks: "queue.Queue" = queue.Queue()
        self._workers = [_Worker(self._tasks, initializer) for _ in range(workers)]

    def submit(self, function: Callable, /, *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._tasks.put((future, function, args))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            while True:
                try:
                    item = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in self._workers:
            self._tasks.put(None)
        if wait:
            for worker in self._workers:
                worker.thread.join()


def main() -> None:
    """Worker loop: (function, args) in, (ok, result or exception) out, until stdin closes."""
    global _note_descriptor
    die_with_parent()
    _note_descriptor = int(sys.argv[1]) if len(sys.argv) > 1 else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the driver stops the pool
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # tasks that print must not corrupt the result stream
    initializer = pickle.load(stdin)
    if initializer is not None:
        initializer()
    while True:
        try:
            function, args = pickle.load(stdin)
        except EOFError:
            return
        try:
            result = (True, function(*args))
        except Exception as exc:  # sent back to be raised in the parent
            result = (False, exc)
        try:
            _send(stdout, result)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            _send(stdout, (False, RuntimeError(f"unpicklable task result: {result[1]!r} ({exc})")))


if __name__ == "__main__":  # run as the named module, whose `note` the tasks import
    from transforms.write.process_pool import main as named_main

    named_main()
