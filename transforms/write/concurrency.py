"""Bounded concurrency inside a DoFn, and the converter pool a process's DoFns share.

Runners that execute a stage in one process (the FnApiRunner's in_memory mode, Prism's loopback
workers) run a DoFn's bundle on one thread. `InflightDoFn` lets such a DoFn keep every core
busy: it submits each element's work to a thread or process pool, keeps at most a few elements
in flight (memory stays bounded), and emits results as they complete. On runners with one
worker per core it is given one worker and simply runs the work inline.
"""
from __future__ import annotations

import collections
import concurrent.futures
import os
import sys
import threading
from typing import Any, Callable, Iterable, Optional

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from transforms.write.process_pool import SubprocessPool

# By (workers, initializer, what a new process inherits: its folder, environment and sys.path).
_pools: dict[tuple, SubprocessPool] = {}
_pools_lock = threading.Lock()
_PER_TEST = "PYTEST_CURRENT_TEST"  # pytest sets it anew for each test: it says nothing of a conversion


def shared_process_pool(workers: int, initializer: Optional[Callable[[], None]]) -> SubprocessPool:
    """One pool per process and setup, shared by every DoFn that converts or reads: its workers
    start once (they are idle while Beam plans between steps). A pool is only shared by callers
    whose processes would start alike: in the same folder (relative paths), with the same
    environment (credentials) and the same setup (limits)."""
    with _pools_lock:
        environment = tuple(sorted(item for item in os.environ.items() if item[0] != _PER_TEST))
        key = workers, initializer, os.getcwd(), environment, tuple(sys.path)
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = SubprocessPool(workers, initializer)
        return pool


def close_shared_pools(keep: Optional[SubprocessPool] = None) -> None:
    """The pools' processes exit, but for `keep`'s: a run keeps its own for the next run in this
    process (a notebook, a scheduler, a test suite), which finds them started if it sets them up
    alike (a Python start and OpenCV's import each, 0.4 s of CPU time)."""
    with _pools_lock:
        closing = [_pools.pop(key) for key, pool in list(_pools.items()) if pool is not keep]
    for pool in closing:
        pool.shutdown(wait=True, cancel_futures=True)


class InflightDoFn(beam.DoFn):
    """Runs `task(element)` on a pool with at most `2 * workers` elements in flight.

    Subclasses define `task` (a picklable function and its arguments, for process pools), and
    may define `emit` (outputs for a result; by default the result). A task's exception fails
    the bundle: only input problems may become dead letters, and tasks return those.
    `workers=0` runs tasks inline; `processes=True` uses a process pool, whose processes run
    `initializer` first.

    A subclass whose elements differ much in cost defines `size`: on a pool, the bundle's
    elements are then held and started largest first, so the work that finishes last is small
    and no worker idles long while another finishes a large element (longest processing time
    first: within 4/3 of the best schedule). Elements held must be small (references).
    """

    size: Optional[Callable[[Any], int]] = None

    def __init__(self, workers: int, processes: bool = False, initializer: Optional[Callable[[], None]] = None):
        super().__init__()
        self._workers, self._processes, self._initializer = workers, processes, initializer

    # -- for subclasses
    def task(self, element: Any) -> tuple[Callable[..., Any], tuple]:
        raise NotImplementedError

    def emit(self, element: Any, result: Any) -> Iterable[Any]:
        yield result

    # -- Beam
    def setup(self) -> None:
        self._pending: collections.deque = collections.deque()
        self._held: list = []
        if self._workers <= 0:
            self._executor = None
        elif self._processes:
            self._executor = shared_process_pool(self._workers, self._initializer)
        else:
            self._executor = concurrent.futures.ThreadPoolExecutor(self._workers, thread_name_prefix="imgrec")

    def teardown(self) -> None:
        executor, self._executor = getattr(self, "_executor", None), None
        if executor is not None and not isinstance(executor, SubprocessPool):
            executor.shutdown(wait=True, cancel_futures=True)

    def process(self, element: Any):
        if self._executor is None:
            function, args = self.task(element)
            yield from self.emit(element, function(*args))
        elif self.size is not None:
            self._held.append(element)
        else:
            yield from self._submit(element)

    def finish_bundle(self):
        held, self._held = self._held, []
        for element in sorted(held, key=self.size, reverse=True):
            yield from map(_in_global_window, self._submit(element))
        while self._pending:
            done, future = self._pending.popleft()
            yield from map(_in_global_window, self.emit(done, future.result()))

    def _submit(self, element: Any) -> Iterable[Any]:
        """Starts the element's task; outputs of the tasks done meanwhile, in order."""
        function, args = self.task(element)
        self._pending.append((element, self._executor.submit(function, *args)))
        while len(self._pending) >= 2 * self._workers or (self._pending and self._pending[0][1].done()):
            done, future = self._pending.popleft()
            yield from self.emit(done, future.result())


def _in_global_window(output: Any) -> Any:
    """An output of finish_bundle, which Beam takes only as a WindowedValue (tagged or not)."""
    if isinstance(output, beam.pvalue.TaggedOutput):
        return beam.pvalue.TaggedOutput(output.tag, GlobalWindows.windowed_value(output.value))
    return GlobalWindows.windowed_value(output)
