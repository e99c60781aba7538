"""Bounded concurrency inside a DoFn, and keeping worker processes from outliving their parent.

Runners that execute a stage in one process (the FnApiRunner's in_memory mode, Prism's loopback
workers) run a DoFn's bundle on one thread. `InflightDoFn` lets such a DoFn keep every core
busy: it submits each element's work to a thread or process pool, keeps at most a few elements
in flight (memory stays bounded), and emits results as they complete. On runners with one
worker per core it is given one worker and simply runs the work inline.
"""
from __future__ import annotations

import collections
import concurrent.futures
import threading
from typing import Any, Callable, Iterable, Optional

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from transforms.process_pool import SubprocessPool
from transforms.rejections import InputRejected

_pools: dict[tuple[int, Optional[Callable[[], None]]], SubprocessPool] = {}
_pools_lock = threading.Lock()


def shared_process_pool(workers: int, initializer: Optional[Callable[[], None]]) -> SubprocessPool:
    """One pool per process and size, shared by every DoFn that converts or reads: its workers
    start once (they are idle while Beam plans between steps) and live as long as this process."""
    with _pools_lock:
        pool = _pools.get((workers, initializer))
        if pool is None or not pool.healthy:
            pool = _pools[(workers, initializer)] = SubprocessPool(workers, initializer)
        return pool


def close_shared_pools() -> None:
    """After a run: the pools' processes exit (and their CPU time is accounted to this process)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)


class InflightDoFn(beam.DoFn):
    """Runs `task(element)` on a pool with at most `2 * workers` elements in flight.

    Subclasses define `task` (a picklable function and its arguments, for process pools),
    `emit` (outputs for a result) and `reject` (outputs for an InputRejected). Any other
    exception fails the bundle: only input problems may become dead letters.
    `workers=0` runs tasks inline; `processes=True` uses a process pool.
    """

    def __init__(self, workers: int, processes: bool = False):
        super().__init__()
        self._workers, self._processes = workers, processes

    # -- for subclasses
    def task(self, element: Any) -> tuple[Callable[..., Any], tuple]:
        return self.work, (element,)

    def work(self, element: Any) -> Any:
        raise NotImplementedError

    def emit(self, element: Any, result: Any) -> Iterable[Any]:
        raise NotImplementedError

    def reject(self, element: Any, exc: InputRejected) -> Iterable[Any]:
        raise NotImplementedError

    def pool_initializer(self) -> Optional[Callable[[], None]]:
        return None

    # -- Beam
    def setup(self) -> None:
        self._pending: collections.deque = collections.deque()
        if self._workers <= 0:
            self._executor = None
        elif self._processes:
            self._executor = shared_process_pool(self._workers, self.pool_initializer())
        else:
            self._executor = concurrent.futures.ThreadPoolExecutor(self._workers, thread_name_prefix="imgrec")

    def teardown(self) -> None:
        executor, self._executor = getattr(self, "_executor", None), None
        if executor is not None and not isinstance(executor, SubprocessPool):
            executor.shutdown(wait=True, cancel_futures=True)

    def process(self, element: Any):
        function, args = self.task(element)
        if self._executor is None:
            yield from self._outputs(element, lambda: function(*args))
            return
        self._pending.append((element, self._executor.submit(function, *args)))
        while len(self._pending) >= 2 * self._workers or (self._pending and self._pending[0][1].done()):
            done, future = self._pending.popleft()
            yield from self._outputs(done, future.result)

    def finish_bundle(self):
        while self._pending:
            done, future = self._pending.popleft()
            for output in self._outputs(done, future.result):
                if isinstance(output, beam.pvalue.TaggedOutput):
                    yield beam.pvalue.TaggedOutput(output.tag, _in_global_window(output.value))
                else:
                    yield _in_global_window(output)

    def _outputs(self, element: Any, result: Callable[[], Any]) -> Iterable[Any]:
        try:
            value = result()
        except InputRejected as exc:
            return self.reject(element, exc)
        return self.emit(element, value)


def _in_global_window(value: Any) -> WindowedValue:
    return WindowedValue(value, MIN_TIMESTAMP, [GlobalWindow()])
