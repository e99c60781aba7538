"""What the terminal shows: pipeline.tables, pipeline.summary and pipeline.output.progress."""
from __future__ import annotations

import dataclasses
import io
import pathlib
import time

import pytest

from pipeline.output.progress import (
    PROGRESS_DIR,
    TOTAL_FILE,
    ProgressReporter,
    default_interval,
    format_progress,
    read_progress,
)
from pipeline.summary import format_header, format_summary
from pipeline.tables import format_bytes, format_table
from transforms.dataset_format import (
    DatasetMetadata,
    DuplicateSummary,
    InputAccounting,
    ObjectAccounting,
    ReuseSummary,
    SplitInfo,
)
from transforms.rejections import is_error_class
from transforms.specs import ConversionSpec, ImageSpec, InputSpec, OutputSpec

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------------------- tables

def test_format_table_aligns_columns():
    table = format_table(["split", "examples", "bytes"], [["train", 24, "1.0 KiB"], ["validation", 3, "12 B"]],
                         indent="  ")
    assert table.splitlines() == [
        "  split       examples    bytes",
        "  ----------  --------  -------",
        "  train             24  1.0 KiB",
        "  validation         3     12 B",
    ]


def test_format_table_keeps_each_row_on_one_line():
    table = format_table(["split", "new\nline", "tab\there"], [["train", 1, "caf\u00e9"]])
    assert table.splitlines()[0] == "split  new\\nline  tab\\there"
    assert len(table.splitlines()) == 3 and "caf\u00e9" in table


def test_format_table_strips_trailing_blanks_and_handles_no_rows():
    table = format_table(["a", "b"], [["x", ""]])
    assert all(line == line.rstrip() for line in table.splitlines())
    assert format_table(["name", "n"], []).splitlines() == ["name  n", "----  -"]


@pytest.mark.parametrize("num_bytes,text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (5.5 * 2**20, "5.5 MiB"),
    (3 * 2**30, "3.0 GiB"), (2**40, "1024.0 GiB"),
])
def test_format_bytes(num_bytes, text):
    assert format_bytes(num_bytes) == text


# ----------------------------------------------------------------------------- summary

def summary_metadata(classes: list[str], rejected_by_error=None, duplicates=None, reuse=None,
                     config=None) -> DatasetMetadata:
    rejected_by_error = rejected_by_error or {}
    rejected = sum(rejected_by_error.values())
    errors = sum(n for error, n in rejected_by_error.items() if is_error_class(error))
    n = 2 * len(classes)
    split = SplitInfo(num_examples=n, num_bytes=2048, files=("train-00000-of-00001.tfrecord",), shard_lengths=(n,),
                      label_counts={c: 2 for c in classes}, rejected=0)
    return DatasetMetadata(
        splits={"train": split}, features={}, image={}, compression="none",
        label_map={c: i for i, c in enumerate(classes)},
        inputs=InputAccounting(n + rejected, n, rejected, errors, rejected_by_error, {}),
        duplicates=duplicates or DuplicateSummary(), error_files=("errors-00000-of-00001.jsonl",), fingerprint="",
        pixel_fingerprint="",
        config=config or {}, run={}, versions={}, reuse=reuse)


def test_summary_has_a_column_per_class_when_there_are_few():
    text = format_summary(summary_metadata(["cat", "dog"]), "out")
    lines = text.splitlines()
    assert lines[0].split() == ["split", "examples", "cat", "dog", "shards", "bytes", "rejected"]
    assert lines[2].split() == ["train", "4", "2", "2", "1", "2.0", "KiB", "0"]
    assert lines[3].split() == ["total", "4", "0"]
    assert "inputs: 4 = 4 written + 0 skipped (not images) + 0 rejected" in lines
    assert lines[-1] == "output: out (metadata.json, 1 shard)"
    assert not any(line.startswith(("dead letters", "duplicates", "reused", "time")) for line in lines)


def test_summary_warns_of_classes_without_examples_which_still_take_ids():
    """A rejected listing's typo'd label (or an empty class folder) is a class of the label map."""
    metadata = summary_metadata(["cat", "dgo", "dog"])
    metadata.splits["train"].label_counts.update({"dgo": 0})
    lines = format_summary(dataclasses.replace(metadata, label_map={"cat": 0, "dgo": 1, "dog": 2, "zebra": 3}),
                           "out").splitlines()
    assert ("warning: 2 of 4 classes have no examples but keep their ids (an empty class folder, a class_names "
            "entry no image has, or a label whose every listing was rejected): 'dgo', 'zebra'") in lines
    odd = format_summary(dataclasses.replace(metadata, label_map={"cat": 0, "dog": 1, "x,\nwarning: y": 2}), "out")
    assert odd.count("\nwarning: ") == 1 and "'x,\\nwarning: y'" in odd  # one line, the name quoted
    assert not any("classes have no examples" in line for line in format_summary(
        summary_metadata(["cat", "dog"]), "out").splitlines())


def test_a_detection_summary_says_why_a_class_has_no_objects():
    """A COCO category no written object has was said to be 'an empty class folder, a class_names
    entry no image has, or a label whose every listing was rejected'."""
    metadata = dataclasses.replace(summary_metadata(["cat", "dog"]), label_map={"cat": 1, "dog": 3, "owl": 7},
                                   objects=ObjectAccounting({"cat": 2, "dog": 2}, {"BoxOutsideImage": 1}))
    assert ("warning: 1 of 3 classes have no objects but keep their ids (no object of theirs was written: none "
            "annotated, or each dropped): 'owl'") in format_summary(metadata, "out").splitlines()


def test_summary_shows_the_class_spread_when_there_are_many():
    text = format_summary(summary_metadata([f"n{i:08d}" for i in range(1000)]), "out")
    header, _, train, *_ = text.splitlines()
    assert header.split() == ["split", "examples", "classes", "min/class", "max/class", "shards", "bytes", "rejected"]
    assert train.split()[:5] == ["train", "2000", "1000", "2", "2"]
    assert max(len(line) for line in text.splitlines()) < 120


def test_summary_reports_skipped_rejected_duplicates_reuse_and_time():
    metadata = summary_metadata(["cat"], rejected_by_error={"SkippedFile": 2, "CorruptImage": 1, "DuplicateImage": 3},
                                duplicates=DuplicateSummary(groups=2, extra_copies=3, dropped=True),
                                reuse=ReuseSummary("/data/old", reused=1, converted=1))
    lines = format_summary(metadata, "out", elapsed=2.5, engine="DirectRunner (FnApiRunner)").splitlines()
    inputs = "inputs: 8 = 2 written + 2 skipped (not images) + 3 duplicates dropped + 1 rejected"
    assert lines[lines.index(inputs) + 1:][:2] == ["  rejected CorruptImage: 1", "duplicates: 2 images stored more "
                                                   "than once, 3 extra copies (dropped)"]
    assert "reused: 1 images from /data/old, converted 1" in lines
    assert "dead letters: errors-00000-of-00001.jsonl" in lines
    assert "time: 2.5 s, 3 images/s on DirectRunner (FnApiRunner)" in lines


def test_summary_names_label_conflicts_and_copies_split_by_path():
    conflict = {"sha256": "ab", "paths": ["in/cat/x.jpg", "in/cat/y.jpg", "in/dog/x.jpg"],
                "labels": ["cat", "cat", "dog"]}
    metadata = summary_metadata(["cat", "dog"], config={"splits": {"key": "path"}}, duplicates=DuplicateSummary(
        groups=2, extra_copies=2, examples=({"sha256": "aa", "paths": ["a", "b"], "labels": ["cat", "cat"]}, conflict),
        label_conflicts=1))
    lines = format_summary(metadata, "out").splitlines()
    assert ("duplicates: 2 images stored more than once, 2 extra copies (kept); split by path, so copies can be in "
            "different splits") in lines
    assert ("warning: label conflicts: 1 image filed under different labels: 'in/cat/x.jpg' is 'cat', 'in/dog/x.jpg' "
            "is 'dog' (all in metadata.json duplicates.examples)") in lines


def test_header_names_input_output_and_pixels():
    spec = ConversionSpec(InputSpec("data/sample"), OutputSpec("out/x"),
                          ImageSpec(height=32, width=48, resize_mode="pad", normalize="none", encoding="jpeg"))
    assert format_header(spec, "DirectRunner", "configs/seed.yaml").splitlines() == [
        "imgrec: data/sample -> out/x",
        "  32x48 pad (area), jpeg uint8, runner DirectRunner, config configs/seed.yaml"]
    unit = ConversionSpec(InputSpec("i"), OutputSpec("o"), ImageSpec(normalize="unit", encoding="raw"))
    assert format_header(unit, "PrismRunner", None).splitlines()[1] == (
        "  224x224 center_crop (area), raw float32 (unit), runner PrismRunner")


# ----------------------------------------------------------------------------- progress

@pytest.mark.parametrize("done,total,elapsed,rate,line", [
    (0, None, 12.4, None, "reading and planning inputs (12 s)"),
    (50, 200, 3, 10.0, "processed 50/200 images (25%), 10 images/s, ETA 15 s"),
    (1234, 5678, 3, None, "processed 1,234/5,678 images (22%)"),
    (0, 0, 3, None, "processed 0/0 images (100%)"),
])
def test_format_progress(done, total, elapsed, rate, line):
    assert format_progress(done, total, elapsed, rate) == line


def mark(run_dir: pathlib.Path, name: str, text: str = "") -> None:
    folder = run_dir / PROGRESS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def test_read_progress_sums_finished_parts(tmp_path):
    assert read_progress(str(tmp_path)) == (None, 0)  # nothing planned yet
    mark(tmp_path, f"{'a' * 64}-64")
    assert read_progress(str(tmp_path)) == (None, 64)
    mark(tmp_path, TOTAL_FILE, "130")
    mark(tmp_path, f"{'b' * 64}-2")
    mark(tmp_path, ".hidden-5")  # a filesystem's temporary, not a part
    assert read_progress(str(tmp_path)) == (130, 66)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_reporter_rate_and_eta_come_from_counts_and_its_clock(tmp_path):
    clock = FakeClock()
    reporter = ProgressReporter(str(tmp_path), interval=1.0, stream=io.StringIO(), clock=clock)
    clock.now = 104.0
    assert reporter.poll_once() == "reading and planning inputs (4 s)"
    mark(tmp_path, TOTAL_FILE, "200")
    mark(tmp_path, "p1-20")
    clock.now = 110.0
    assert reporter.poll_once() == "processed 20/200 images (10%)"  # no rate from one observation
    mark(tmp_path, "p2-40")
    clock.now = 114.0
    assert reporter.poll_once() == "processed 60/200 images (30%), 10 images/s, ETA 14 s"  # 40 images in 4 s


def test_markers_removed_with_the_staging_after_publishing_are_not_reported(tmp_path):
    """The publish removes the run's staging while the reporter polls: with multi_processing a
    200,000-image run printed `processed 0/200,000 images (0%)`, then `reading and planning
    inputs (54 s)` as it ended, from a listing without the total."""
    reporter = ProgressReporter(str(tmp_path), interval=1.0, stream=io.StringIO(), clock=FakeClock())
    mark(tmp_path, TOTAL_FILE, "200")
    mark(tmp_path, "p1-120")
    mark(tmp_path, "p2-80")
    assert reporter.poll_once() == "processed 200/200 images (100%)"
    (tmp_path / PROGRESS_DIR / "p1-120").unlink()
    assert reporter.poll_once() is None  # not 80 of 200
    (tmp_path / PROGRESS_DIR / TOTAL_FILE).unlink()
    assert reporter.poll_once() is None  # not planning again


def test_nothing_planned_is_nothing_to_report(tmp_path):
    mark(tmp_path, TOTAL_FILE, "0")  # an unchanged dataset: every image filtered out
    assert ProgressReporter(str(tmp_path), interval=1.0, stream=io.StringIO()).poll_once() is None


def test_reporter_prints_changed_lines_only(tmp_path):
    mark(tmp_path, TOTAL_FILE, "10")
    stream = io.StringIO()
    with ProgressReporter(str(tmp_path), interval=0.01, stream=stream).running():
        for _ in range(1000):
            if "processed 0/10" in stream.getvalue():
                break
            time.sleep(0.005)
        time.sleep(0.2)  # about 20 more polls of unchanged progress
        mark(tmp_path, "p1-4")
        for _ in range(1000):
            if "processed 4/10" in stream.getvalue():
                break
            time.sleep(0.005)
    assert stream.getvalue().splitlines() == ["imgrec: processed 0/10 images (0%)",
                                              "imgrec: processed 4/10 images (40%)"]


def test_once_the_plan_is_known_the_markers_are_listed_only_when_a_line_is_due(tmp_path, monkeypatch):
    """A poll lists every finished part's marker (one per shard with tiny shards, 150,000 took
    0.2 s of CPU): polling them every half second for a line due every 30 s kept 40% of a core busy."""
    from pipeline.output import progress

    polls = []
    monkeypatch.setattr(progress, "read_progress", lambda run_dir: polls.append(run_dir) or (10, 4))
    stream = io.StringIO()
    with ProgressReporter(str(tmp_path), interval=30.0, stream=stream).running():
        time.sleep(2.2)  # four wake-ups after the first
    assert stream.getvalue() == "imgrec: processed 4/10 images (40%)\n"
    assert len(polls) == 1


def test_interval_zero_prints_nothing(tmp_path):
    mark(tmp_path, TOTAL_FILE, "10")
    stream = io.StringIO()
    reporter = ProgressReporter(str(tmp_path), interval=0, stream=stream)
    with reporter.running():
        pass
    reporter.finish(10)
    assert stream.getvalue() == ""


def test_the_final_count_is_printed_even_when_no_poll_saw_the_plan(tmp_path):
    """A run shorter than the first poll: its markers are gone with its staging when it ends."""
    clock = FakeClock()
    stream = io.StringIO()
    reporter = ProgressReporter(str(tmp_path / "gone"), interval=30.0, stream=stream, clock=clock)
    clock.now += 0.4
    reporter.finish(36)
    reporter.finish(0)  # nothing was converted (an unchanged dataset): nothing to report
    assert stream.getvalue() == "imgrec: processed 36/36 images (100%)\n"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_default_interval():
    assert default_interval(Terminal()) == 5.0 and default_interval(io.StringIO()) == 30.0
