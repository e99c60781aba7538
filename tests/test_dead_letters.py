"""Dead letters in bounded memory (pipeline/output/dead_letters.py): sorted runs, merged."""
from __future__ import annotations

import pathlib
import random

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that

from pipeline.output.dead_letters import RUNS_DIR, WriteSortedRuns, merge_runs, write_dead_letters, write_run
from tests.helpers import beam_matcher, test_pipeline
from transforms.rejections import Rejection

pytestmark = pytest.mark.unit


def rejections(n: int, seed: int = 0) -> list[Rejection]:
    rng = random.Random(seed)
    return [Rejection(f"/in/{rng.randrange(10**6):06d}/\udcff{i}.xml", "discover", "SkippedFile", "no image extension",
                      rng.choice([None, "train"])) for i in range(n)]


def rows(rejected: list[Rejection]) -> bytes:
    return "".join(f"{row}\n" for row in sorted(r.to_json() for r in rejected)).encode("ascii")


@pytest.mark.parametrize("max_open", [2, 3, 256])
def test_merged_runs_are_every_row_sorted_in_passes_when_there_are_many_runs(tmp_path, max_open):
    rejected = rejections(500)
    runs = [write_run([r.to_json() for r in rejected[i:i + 37]], str(tmp_path)) for i in range(0, 500, 37)]
    runs.append(write_run([], str(tmp_path)))  # an empty run, and one row twice
    runs.append(write_run([rejected[0].to_json()], str(tmp_path)))
    destination = tmp_path / "errors.jsonl"
    merge_runs(runs[::-1], str(destination), str(tmp_path), max_open=max_open)
    assert destination.read_bytes() == rows([*rejected, rejected[0]])


def test_no_runs_is_an_empty_file(tmp_path):
    name = write_dead_letters([], str(tmp_path))
    assert (tmp_path / name).read_bytes() == b""


@pytest.mark.beam
def test_sorted_runs_hold_every_rejection_once(tmp_path):
    rejected = rejections(1000, seed=1)
    with test_pipeline() as p:
        runs = p | beam.Create(rejected) | beam.ParDo(WriteSortedRuns(str(tmp_path), run_rows=64))

        def check(paths):
            assert len(paths) >= 1000 // 64 and all(pathlib.Path(path).parent.name == RUNS_DIR for path in paths)
            name = write_dead_letters(paths, str(tmp_path))
            assert (tmp_path / name).read_bytes() == rows(rejected)
            assert not (tmp_path / RUNS_DIR).exists()  # merged: nothing twice in staging

        assert_that(runs, beam_matcher(check))
