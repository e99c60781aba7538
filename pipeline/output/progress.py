"""Progress of a long run: images done / total, rate and ETA, on every runner.

The pipeline leaves small markers in the run's staging folder (the planned total once known,
then one file per finished part, named with its image count, which it also holds: no marker is
an empty object, which Beam cannot write on S3); the driver polls them.
That works the same on the DirectRunner, Prism, Flink, Spark and Dataflow (Beam counters,
`images_converted` and `parts_done`, carry the same numbers to Dataflow's UI).
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator, Optional, TextIO

import apache_beam as beam

from pipeline.output.lock import check_run_goes_on
from pipeline.standard_streams import say
from transforms import files
from transforms.dataset_format import join
from transforms.files import list_names

PROGRESS_DIR = "progress"
TOTAL_FILE = "total"


def _touch(path: str, text: str) -> None:
    with files.create(path) as handle:
        handle.write(text.encode("ascii"))


def _part_done(part, directory: str, lock: tuple[str, str]) -> None:
    check_run_goes_on(*lock)  # a job its stopped driver could not cancel stops here
    _touch(join(directory, f"{part.digest}-{part.images}"), str(part.images))


@beam.ptransform_fn
def RecordProgress(inputs, run_dir: str, lock: tuple[str, str]) -> beam.pvalue.PDone:
    """(planned counts {split: n}, PartResult) → markers in `run_dir/progress/`; each finished
    part first checks that the run still holds the output's lock (`lock`: output, run id)."""
    planned_counts, parts = inputs
    directory = join(run_dir, PROGRESS_DIR)
    _ = planned_counts | "Total" >> beam.Map(
        lambda counts: _touch(join(directory, TOTAL_FILE), str(sum(counts.values()))))
    _ = parts | "PartDone" >> beam.Map(_part_done, directory, lock)
    return beam.pvalue.PDone(parts.pipeline)


def read_progress(run_dir: str) -> tuple[Optional[int], int]:
    """(planned total or None while planning, images in finished parts)."""
    directory = join(run_dir, PROGRESS_DIR)
    total, done = None, 0
    for name in list_names(directory):
        if name == TOTAL_FILE:
            total = int(files.read_bytes(join(directory, name)) or 0)  # S3: imgrec's client, which fails fast
        elif "-" in name and not name.startswith("."):
            done += int(name.rsplit("-", 1)[1])
    return total, done


def format_progress(done: int, total: Optional[int], elapsed: float, rate: Optional[float]) -> str:
    """Images processed (written, or rejected while converting) of those planned."""
    if total is None:
        return f"reading and planning inputs ({elapsed:.0f} s)"
    percent = 100 * done / total if total else 100.0
    line = f"processed {done:,}/{total:,} images ({percent:.0f}%)"
    if rate:
        remaining = (total - done) / rate
        line += f", {rate:,.0f} images/s, ETA {remaining:.0f} s"
    return line


class ProgressReporter:
    """Polls `read_progress` on a thread and prints a line every `interval` seconds when it
    changed (every few seconds on a terminal, rarely in logs, never with interval 0)."""

    def __init__(self, run_dir: str, interval: float, stream: Optional[TextIO] = None,
                 clock: Callable[[], float] = time.monotonic):
        self._run_dir, self._interval, self._stream, self._clock = run_dir, interval, stream, clock
        self._stop = threading.Event()
        self._started = clock()
        self._first_done: Optional[tuple[float, int]] = None
        self._seen: tuple[Optional[int], int] = (None, 0)  # the last (total, done) reported
        self._last_line = ""

    def poll_once(self) -> Optional[str]:
        """The line for now; None when there is nothing to say (no markers yet, nothing
        planned: an unchanged dataset is kept, or markers going: the published run's staging
        being removed, which would read as planning again, or as fewer images done)."""
        try:
            total, done = read_progress(self._run_dir)
        except Exception:  # the folder may not exist yet, or be gone after publishing
            return None
        if total == 0 or (self._seen[0] is not None and (total is None or done < self._seen[1])):
            return None
        self._seen = (total, done)
        now = self._clock()
        if done and self._first_done is None:
            self._first_done = (now, done)
        rate = None
        if self._first_done and now > self._first_done[0] and done > self._first_done[1]:
            rate = (done - self._first_done[1]) / (now - self._first_done[0])
        return format_progress(done, total, now - self._started, rate)

    def _print(self, line: Optional[str]) -> None:
        if line and line != self._last_line:
            say(f"imgrec: {line}", self._stream)  # best effort: a scheduler may stop reading
            self._last_line = line

    def _run(self) -> None:
        """Polls every half second until the plan is known and prints it at once, then polls
        only when a line is due, every `interval`: a poll lists one marker per finished part
        (150,000 parts took 0.2 s of CPU a poll)."""
        printed_at, planned = self._clock(), False
        while not self._stop.wait(min(0.5, self._interval)):
            if planned and self._clock() - printed_at < self._interval:
                continue
            line = self.poll_once()
            if line is None:
                continue
            first_plan = not planned and not line.startswith("reading")
            if first_plan or self._clock() - printed_at >= self._interval:
                self._print(line)
                printed_at, planned = self._clock(), planned or first_plan

    def finish(self, planned: int) -> None:
        """After the run published (its staging, markers included, is gone): the final count of
        the images it planned to convert, from the published metadata, so a run that ended
        before a poll saw its markers shows it too."""
        if self._interval > 0 and planned:
            self._print(format_progress(planned, planned, self._clock() - self._started, None))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        if self._interval <= 0:
            yield
            return
        thread = threading.Thread(target=self._run, name="imgrec-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._stop.set()
            thread.join()


def default_interval(stream: TextIO) -> float:
    return 5.0 if stream.isatty() else 30.0
