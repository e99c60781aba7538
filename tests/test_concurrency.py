"""transforms.write.concurrency.InflightDoFn (inline, threads, converter processes) in real pipelines, and
transforms.write.process_pool.SubprocessPool: input problems become rejections, anything else fails loudly."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import apache_beam as beam
import psutil
import pytest
from apache_beam.testing.util import assert_that, equal_to

from pipeline import reaper
from tests.helpers import REPO, test_pipeline
from transforms.files import read_input
from transforms.images.limits import Converter
from transforms.rejections import InputRejected
from transforms.write.concurrency import InflightDoFn, close_shared_pools, shared_process_pool
from transforms.write.process_pool import SubprocessPool, WorkerDied, note

pytestmark = [pytest.mark.beam, pytest.mark.timeout(120)]

REJECTED = "rejected"


def read_or_rejection(path):
    """The file's bytes, or the InputRejected reading it raised: as the product's tasks do, an input
    problem is a result, anything else an exception."""
    try:
        return read_input(path, 1000)
    except InputRejected as exc:
        return exc


class ReadFiles(InflightDoFn):
    """path → (name, size); a missing file → a rejection; anything else must fail the bundle."""

    def task(self, path):
        return read_or_rejection, (path,)

    def emit(self, path, data):
        if isinstance(data, InputRejected):
            yield beam.pvalue.TaggedOutput(REJECTED, (pathlib.Path(path).name, type(data).__name__))
        else:
            yield pathlib.Path(path).name, len(data)


def files(tmp_path: pathlib.Path, count: int = 12) -> list[str]:
    paths = []
    for i in range(count):
        path = tmp_path / f"{i:02d}.bin"
        path.write_bytes(b"x" * (i + 1))
        paths.append(str(path))
    return paths


class ReadLargestFirst(ReadFiles):
    """ReadFiles that starts the largest files of a bundle first, noting the order it starts them."""

    def task(self, path):
        return read_noting_start, (path,)

    def size(self, path):
        return os.path.getsize(path) if os.path.exists(path) else 0


STARTED: list[str] = []


def read_noting_start(path: str) -> bytes:
    STARTED.append(pathlib.Path(path).name)
    return read_or_rejection(path)


MODES = {"inline": (0, False), "threads": (2, False), "processes": (2, True)}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("dofn", [ReadFiles, ReadLargestFirst])
def test_results_and_rejections_in_every_mode(tmp_path, mode, dofn):
    paths = [*files(tmp_path), str(tmp_path / "missing.bin"), str(tmp_path / "empty.bin")]
    (tmp_path / "empty.bin").write_bytes(b"")
    workers, processes = MODES[mode]
    with test_pipeline() as p:
        out = p | beam.Create(paths) | beam.ParDo(dofn(workers, processes)).with_outputs(REJECTED, main="read")
        assert_that(out.read, equal_to([(f"{i:02d}.bin", i + 1) for i in range(12)]), label="read")
        assert_that(out[REJECTED], equal_to([("missing.bin", "UnreadableFile"), ("empty.bin", "EmptyFile")]),
                    label="rejected")


def test_a_pool_starts_the_largest_elements_of_a_bundle_first(tmp_path):
    """Longest processing time first: the element that finishes last is a small one."""
    paths = files(tmp_path)
    STARTED.clear()
    with test_pipeline() as p:
        out = p | beam.Create([paths]) | beam.FlatMap(lambda bundle: bundle) | beam.ParDo(ReadLargestFirst(1))
        assert_that(out, equal_to([(f"{i:02d}.bin", i + 1) for i in range(12)]))
    assert STARTED == [f"{i:02d}.bin" for i in reversed(range(12))]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_programming_error_fails_the_pipeline(tmp_path, mode):
    """Only InputRejected may become a dead letter; a bug (here: a path that is not a string) must
    fail the run, not be counted as a bad input."""
    workers, processes = MODES[mode]
    with pytest.raises(AttributeError, match="'int' object has no attribute 'startswith'"):
        with test_pipeline() as p:
            _ = p | beam.Create([*files(tmp_path, 3), 42]) | beam.ParDo(ReadFiles(workers, processes)).with_outputs(
                REJECTED, main="read")


@pytest.mark.converter
def test_subprocess_pool_runs_tasks_in_other_processes():
    pool = SubprocessPool(2)
    try:
        pids = {pool.submit(os.getpid).result(timeout=60) for _ in range(8)}
        assert os.getpid() not in pids and 1 <= len(pids) <= 2
        assert pool.submit(pow, 3, 4).result(timeout=60) == 81
        with pytest.raises(ZeroDivisionError):
            pool.submit(divmod, 1, 0).result(timeout=60)
        assert pool.submit(sum, [1, 2, 3]).result(timeout=60) == 6  # the worker survived the exception
    finally:
        pool.shutdown(wait=True)


def exit_after_noting(value: int) -> None:
    note(value)
    os._exit(7)


@pytest.mark.converter
def test_a_worker_that_dies_fails_its_task_with_its_note_and_is_replaced():
    pool = SubprocessPool(1)
    try:
        first = pool.submit(os.getpid).result(timeout=60)
        with pytest.raises(WorkerDied, match=r"converter process \d+ died") as died:
            pool.submit(exit_after_noting, 5).result(timeout=60)
        assert (died.value.returncode, died.value.note) == (7, 5)
        with pytest.raises(WorkerDied) as died:
            pool.submit(os._exit, 7).result(timeout=60)
        assert died.value.note is None  # a note is its own task's
        assert pool.submit(os.getpid).result(timeout=60) not in (first, os.getpid())
    finally:
        pool.shutdown(wait=True)


@pytest.mark.converter
def test_a_worker_that_died_while_idle_takes_the_next_task_in_a_new_process():
    """A kept pool's process may be gone by the next run (the OOM killer, a stray kill): that is
    no task's failure."""
    pool = SubprocessPool(1)
    try:
        first = pool.submit(os.getpid).result(timeout=60)
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while reaper.process_start_time(first) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.submit(os.getpid).result(timeout=60) not in (first, os.getpid())
    finally:
        pool.shutdown(wait=True)


@pytest.mark.converter
def test_a_pool_that_cannot_start_a_process_fails_each_task_and_recovers(monkeypatch):
    """Nothing waits forever for a process that cannot be started (here: no interpreter)."""
    pool = SubprocessPool(1)
    try:
        with pytest.raises(WorkerDied):
            pool.submit(os._exit, 7).result(timeout=60)
        monkeypatch.setattr(sys, "executable", "/nonexistent/python")
        for _ in range(2):
            with pytest.raises(WorkerDied, match="could not start a converter process"):
                pool.submit(os.getpid).result(timeout=60)
        monkeypatch.undo()
        assert pool.submit(pow, 2, 5).result(timeout=60) == 32
    finally:
        pool.shutdown(wait=True)


def test_steps_with_equal_converter_setups_share_one_pool_which_a_later_run_started_alike_finds(tmp_path, monkeypatch):
    """Reading, converting and concatenating each ask for the run's pool with their own (equal)
    `Converter`: one pool, whose processes (a Python start and OpenCV's import each) start once.
    A run keeps it for the next run in this process, unless that one's processes would start
    otherwise: in another folder (relative paths), another environment or another setup."""
    try:
        pool = shared_process_pool(1, Converter(100, 200))
        assert shared_process_pool(1, Converter(100, 200)) is pool
        other = shared_process_pool(1, Converter(101, 200))
        assert other is not pool
        close_shared_pools(keep=pool)
        assert shared_process_pool(1, Converter(100, 200)) is pool
        assert shared_process_pool(1, Converter(101, 200)) is not other
        monkeypatch.chdir(tmp_path)
        assert shared_process_pool(1, Converter(100, 200)) is not pool
        monkeypatch.undo()
        monkeypatch.setenv("AWS_PROFILE", "another")
        assert shared_process_pool(1, Converter(100, 200)) is not pool
    finally:
        close_shared_pools()


# ----------------------------------------------------------------------------- the reaper

def test_driver_markers_tell_a_live_driver_from_a_gone_or_reused_pid():
    marker = reaper.driver_marker()
    pid, _, started = marker.partition(":")
    assert int(pid) == os.getpid() and started == reaper.process_start_time(os.getpid())
    assert reaper.driver_alive(marker)
    assert not reaper.driver_alive(f"{os.getpid()}:{int(started) + 1}")  # the pid, reused later
    assert reaper.process_start_time(2**22 + 12345) is None
    assert not reaper.driver_alive(f"{2**22 + 12345}:")
    assert abs(reaper.process_started_at(os.getpid()) - psutil.Process().create_time()) < 0.05


@pytest.mark.converter
def test_processes_a_killed_driver_leaves_behind_are_reaped():
    """A stand-in driver starts the reaper and two processes, one carrying its marker (as every
    process a driver starts does), one not, then dies: only the marked one must not outlive it."""
    driver = (
        "import os, subprocess, sys\n"
        "from pipeline.reaper import reaped\n"
        "sleep = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
        "quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)\n"
        "with reaped():\n"
        "    marked = subprocess.Popen(sleep, **quiet)\n"
        "unmarked = subprocess.Popen(sleep, **quiet)  # started after the run: not the run's\n"
        "print(marked.pid, unmarked.pid, flush=True)\n"
        "with reaped():\n"
        "    os.kill(os.getpid(), 9)\n")
    env = {k: v for k, v in os.environ.items() if k != reaper.DRIVER_ENV}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", driver], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    marked, unmarked = (int(pid) for pid in done.stdout.split())
    try:
        for _ in range(200):
            if reaper.process_start_time(marked) is None:
                break
            time.sleep(0.05)
        assert reaper.process_start_time(marked) is None, "a process of the killed run outlived its driver"
        assert reaper.process_start_time(unmarked) is not None, "the reaper killed a process it did not own"
    finally:
        for pid in (marked, unmarked):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
