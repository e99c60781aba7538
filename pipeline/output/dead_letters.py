"""Dead letters in bounded memory: sorted runs written as rejections arrive, merged into one
sorted file when the run publishes.

A run may reject millions of inputs (a Pascal VOC tree has an annotation file beside every
image), so no step holds them all: each worker sorts up to `RUN_ROWS` rows at a time into a
run file in the staging folder and emits its name, and the last step merges the runs a row at
a time. Only runs named in the pipeline's output are merged, so the leftovers of a retried
bundle never count twice. The rows are sorted, so dead letters are byte-identical on every
runner however the work was bundled.
"""
from __future__ import annotations

import contextlib
import heapq
import uuid
from typing import Iterable, Sequence

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from transforms import files
from transforms.dataset_format import DEAD_LETTERS_FILE, join
from transforms.rejections import Rejection

RUN_ROWS = 50_000  # rows sorted in memory at a time (a row is ~250 bytes)
MAX_OPEN_RUNS = 256  # runs merged at once; more are merged in passes
RUNS_DIR = "dead-letter-runs"  # in the run's staging folder


def run_path(directory: str) -> str:
    """A new run file's path, in the run's staging folder `directory`."""
    return join(directory, f"{RUNS_DIR}/{uuid.uuid4().hex}.jsonl")


def write_run(rows: list[str], directory: str) -> str:
    """The rows sorted into a new run file; its path."""
    path = run_path(directory)
    with files.create(path) as handle:
        handle.write("".join(f"{row}\n" for row in sorted(rows)).encode("ascii"))
    return path


def merge_runs(runs: Sequence[str], destination: str, directory: str, max_open: int = MAX_OPEN_RUNS) -> None:
    """Sorted run files → one sorted file, holding one row per run in memory."""
    runs = sorted(runs)  # whatever order the runner delivered them in
    while len(runs) > max_open:
        runs = [_merge(runs[i:i + max_open], run_path(directory)) for i in range(0, len(runs), max_open)]
    _merge(runs, destination)


def _merge(runs: list[str], destination: str) -> str:
    with contextlib.ExitStack() as stack, files.create(destination) as out:
        for row in heapq.merge(*(stack.enter_context(files.open_read(run)) for run in runs)):  # by line
            out.write(row)
    return destination


def write_dead_letters(runs: Sequence[str], directory: str) -> str:
    """The run's dead-letter file in `directory`, from its runs (then removed); its name."""
    merge_runs(runs, join(directory, DEAD_LETTERS_FILE), directory)
    if files.present(join(directory, RUNS_DIR)):  # on a store, a prefix
        files.delete([join(directory, RUNS_DIR)])
    return DEAD_LETTERS_FILE


class WriteSortedRuns(beam.DoFn):
    """Rejection → the paths of the run files holding them (one per `RUN_ROWS` and bundle)."""

    def __init__(self, directory: str, run_rows: int = RUN_ROWS):
        self._directory, self._run_rows = directory, run_rows

    def start_bundle(self) -> None:
        self._rows: list[str] = []

    def process(self, rejection: Rejection) -> Iterable[str]:
        self._rows.append(rejection.to_json())
        if len(self._rows) >= self._run_rows:
            yield self._flush()

    def finish_bundle(self):
        if self._rows:
            yield GlobalWindows.windowed_value(self._flush())

    def _flush(self) -> str:
        rows, self._rows = self._rows, []
        return write_run(rows, self._directory)
