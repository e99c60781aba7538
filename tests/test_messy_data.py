"""Broken files, error budgets, refusals, re-runs, killed runs and bounded memory, on real runs."""
from __future__ import annotations

import datetime
import json
import pathlib
import re
import subprocess
import sys

import pytest

from pipeline.errors import UsageError
from tests.helpers import (
    IN_MEMORY,
    REPO,
    dead_letters,
    make_tree,
    png_declaring,
    read_metadata,
    records_by_split,
    run_pipeline,
    visible_files,
    write_photo,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def messy_folder(tmp_path_factory) -> pathlib.Path:
    """Read only: every test that converts it writes elsewhere."""
    root = tmp_path_factory.mktemp("messy")
    make_tree(root, {"ant": 10, "bee": 10}, size=(40, 56))  # big enough that a JPEG cut in half keeps its header
    good = (root / "ant" / "ant_0001.jpg").read_bytes()
    (root / "ant" / "empty.jpg").write_bytes(b"")
    (root / "ant" / "notes.jpg").write_bytes(b"these are not pixels, just text in a .jpg\n" * 4)
    (root / "ant" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "ant" / "cut_scan.jpg").write_bytes(good[: len(good) // 2] + b"\xff\xd9")  # decodes with grey rows
    png = (root / "bee" / "bee_0000.png").read_bytes()
    (root / "bee" / "truncated.png").write_bytes(png[: len(png) // 2])
    (root / "bee" / "bomb.png").write_bytes(png_declaring(100_000, 100_000))
    write_photo(root / "bee" / "tiny.png", seed=7, size=(3, 3))
    (root / "bee" / "copy_of_ant_0001.jpg").write_bytes(good)
    (root / "bee" / "README.txt").write_text("not an image")
    return root


MESSY_FLAGS = ("--max_error_fraction=1", "--min_side=8", "--max_pixels=1000000", "--drop_duplicates")


@pytest.fixture(scope="module")
def messy_run(messy_folder, tmp_path_factory):
    """(Beam's result, output) of one conversion of the messy folder, which the tests only read."""
    from pipeline.run import run

    out = tmp_path_factory.mktemp("messy_run") / "out"
    return run([*IN_MEMORY, f"--input={messy_folder}", f"--output={out}", *MESSY_FLAGS]), out


def test_each_kind_of_bad_input_becomes_a_dead_letter(messy_run):
    _, out = messy_run
    metadata = read_metadata(out)
    rows = dead_letters(out)
    by_path = {pathlib.Path(r["path"]).name: r for r in rows}
    expected = {
        "empty.jpg": ("read", "EmptyFile"),
        "notes.jpg": ("header", "NotAnImage"),
        "truncated.jpg": ("decode", "CorruptImage"),
        "cut_scan.jpg": ("decode", "CorruptImage"),
        "truncated.png": ("decode", "CorruptImage"),
        "bomb.png": ("header", "ImageTooLarge"),
        "tiny.png": ("header", "ImageTooSmall"),
        "README.txt": ("discover", "SkippedFile"),
        # the copy sorts after ant/ant_0001.jpg, so the copy is the one dropped
        "copy_of_ant_0001.jpg": ("dedup", "DuplicateImage"),
    }
    assert len(rows) == len(by_path) == 9
    assert {name: (r["stage"], r["error"]) for name, r in by_path.items()} == expected
    for name, row in by_path.items():
        assert row["message"], name
    assert "100000x100000" in by_path["bomb.png"]["message"]
    assert "ant_0001.jpg" in by_path["copy_of_ant_0001.jpg"]["message"]
    assert "premature end of data segment" in by_path["cut_scan.jpg"]["message"]
    lines = (out / metadata.error_files[0]).read_text().splitlines()
    assert lines == sorted(lines)  # one sorted file: the same bytes on every runner
    inputs = metadata.inputs
    assert inputs.total == 29 == inputs.written + inputs.rejected
    assert inputs.written == 20 and inputs.rejected == 9
    assert inputs.errors == 7  # skipped files and dropped copies are not errors
    assert metadata.duplicates.groups == 1 and metadata.duplicates.dropped is True
    # Rejections found while converting carry their split; the split's count matches.
    for split, info in metadata.splits.items():
        assert info.rejected == sum(1 for r in rows if r["split"] == split)
    assert sum(info.rejected for info in metadata.splits.values()) == 3  # the three cut files


def test_unknown_labels_and_manifest_problems_are_dead_letters(tmp_path):
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 3, "bee": 3, "wasp": 3})
    manifest = tmp_path / "list.jsonl"
    lines = [json.dumps({"path": str(p.relative_to(tmp_path)), "label": p.parent.name})
             for p in sorted(root.glob("*/*"))]
    lines += [json.dumps({"path": "imgs/ant/missing.jpg", "label": "ant"}), "{not json"]
    manifest.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    metadata = run_pipeline(manifest, out, "--class_names=ant,bee", "--max_error_fraction=1")
    errors = sorted((r["error"], pathlib.Path(r["path"]).name) for r in dead_letters(out))
    assert errors == [("BadManifestLine", "list.jsonl"), ("UnknownLabel", "wasp_0000.png"),
                      ("UnknownLabel", "wasp_0001.jpg"), ("UnknownLabel", "wasp_0002.jpg"),
                      ("UnreadableFile", "missing.jpg")]
    assert metadata.label_map == {"ant": 0, "bee": 1}
    assert metadata.inputs.total == 11 and metadata.inputs.written == 6


def test_error_budget_fails_the_run_with_one_line_exit_1_and_publishes_nothing(messy_folder, tmp_path, capsys):
    from pipeline.run import main

    out = tmp_path / "out"
    assert main([*IN_MEMORY, f"--input={messy_folder}", f"--output={out}"]) == 1  # default max_error_fraction 0.01
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("imgrec: error")]
    assert len(err) == 1 and re.search(r"6 of 28 images were rejected .*max_error_fraction 1\.00%", err[0]), err
    assert not (out / "metadata.json").exists()
    assert not [name for name in visible_files(out) if not name.startswith(".imgrec-staging/")]
    # The dead letters stay where the message says, for the user to read.
    (dead_letter_file,) = re.findall(r"Dead letters: (\S+)", err[0])
    rows = [json.loads(line) for line in pathlib.Path(dead_letter_file).read_text().splitlines()]
    # 6 errors + the skipped README; the tiny image passes min_side=1, no copy is dropped
    assert sorted(r["error"] for r in rows) == ["CorruptImage", "CorruptImage", "CorruptImage", "EmptyFile",
                                                "ImageTooLarge", "NotAnImage", "SkippedFile"]


def test_refuses_to_overwrite_a_finished_dataset(tmp_path):
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 4, "bee": 4})
    out = tmp_path / "out"
    first = run_pipeline(root, out)
    before = {name: (out / name).read_bytes() for name in visible_files(out)}
    with pytest.raises(UsageError, match="--overwrite"):
        run_pipeline(root, out)
    assert {name: (out / name).read_bytes() for name in visible_files(out)} == before  # untouched
    (root / "ant" / "ant_0000.png").unlink()
    second = run_pipeline(root, out, "--overwrite")
    assert first.inputs.written == 8 and second.inputs.written == 7
    assert visible_files(out) == set(second.owned_files())


def test_rerun_gives_identical_files(tmp_path):
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 15, "bee": 15})
    first = run_pipeline(root, tmp_path / "a", "--num_shards=3")
    second = run_pipeline(root, tmp_path / "b", "--num_shards=3")
    assert records_by_split(tmp_path / "a", first) == records_by_split(tmp_path / "b", second)
    assert first.owned_files() == second.owned_files()
    for name in first.owned_files():
        if name != "metadata.json":
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def _peak_rss_mib(root: pathlib.Path, out: pathlib.Path) -> tuple[float, float]:
    """Peak RSS of a whole in-memory DirectRunner run in a fresh process, and the largest peak of
    the processes it started (the converter pool)."""
    code = ("import resource, sys; from pipeline.run import run; run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
            "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    result = subprocess.run([sys.executable, "-c", code, "--runner=DirectRunner", "--direct_running_mode=in_memory",
                             f"--input={root}", f"--output={out}", "--encoding=raw", "--normalize=unit",
                             "--num_shards=2"], cwd=REPO, capture_output=True, text=True, check=True)
    driver, children = result.stdout.split()[-2:]
    return int(driver) / 1024, int(children) / 1024


@pytest.mark.slow
def test_memory_is_bounded_by_data_in_flight(tmp_path):
    """Raw float32 records are 588 KiB each: holding 4x more of them would show in RSS."""
    small, large = tmp_path / "small", tmp_path / "large"
    make_tree(small, {"ant": 50, "bee": 50})
    make_tree(large, {"ant": 200, "bee": 200})
    small_driver, small_workers = _peak_rss_mib(small, tmp_path / "out_small")
    large_driver, large_workers = _peak_rss_mib(large, tmp_path / "out_large")
    extra_data_mib = 300 * 224 * 224 * 3 * 4 / 2**20  # 4x the images: 300 more records
    assert large_driver - small_driver < 0.1 * extra_data_mib, (small_driver, large_driver)
    assert large_workers - small_workers < 0.1 * extra_data_mib, (small_workers, large_workers)
    assert large_driver < 1.5 * small_driver


def test_skip_unchanged_keeps_the_dataset_until_inputs_change(tmp_path, capsys):
    from pipeline.run import main

    root = tmp_path / "imgs"
    make_tree(root, {"ant": 4, "bee": 4})
    out = tmp_path / "out"
    first = run_pipeline(root, out, "--skip_unchanged")
    files_before = {name: (out / name).stat().st_mtime_ns for name in visible_files(out)}
    capsys.readouterr()
    assert main([*IN_MEMORY, f"--input={root}", f"--output={out}", "--skip_unchanged"]) == 0  # exits 0, says so
    assert capsys.readouterr().out.startswith("unchanged: inputs and config match the dataset in")
    assert read_metadata(out) == first  # not rewritten: same run id, same files
    assert {name: (out / name).stat().st_mtime_ns for name in visible_files(out)} == files_before
    write_photo(root / "bee" / "bee_new.jpg", seed=999)
    changed = run_pipeline(root, out, "--skip_unchanged")
    assert changed.run["run_id"] != first.run["run_id"]
    assert changed.inputs.written == 9 and changed.fingerprint != first.fingerprint
    rewritten = run_pipeline(root, out, "--skip_unchanged", "--quality=80", "--encoding=jpeg", "--normalize=none")
    assert rewritten.fingerprint != changed.fingerprint  # the config is part of the fingerprint


def test_output_path_templates_expand_by_date(tmp_path):
    from pipeline.prepare import expand_output_template
    from pipeline.run import main

    now = datetime.datetime(2026, 12, 2, 13, 15, 0, tzinfo=datetime.timezone.utc)
    assert expand_output_template("gs://b/ds/{date}", now) == "gs://b/ds/2026-12-02"
    assert expand_output_template(str(tmp_path / "{timestamp}"), now) == str(tmp_path / "20261202T131500")
    assert expand_output_template("/d/{{x}}-{date}", now) == "/d/{x}-2026-12-02"
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 2, "bee": 2})
    assert main([f"--input={root}", f"--output={tmp_path}/daily/{{date}}", "--runner=DirectRunner"]) == 0
    (dated,) = (tmp_path / "daily").iterdir()
    assert datetime.date.fromisoformat(dated.name) and (dated / "metadata.json").exists()
    assert read_metadata(dated).config["output"]["path"] == str(dated)


@pytest.mark.parametrize("output", ["out/{foo}", "out/{date", "out/{}", "out/{date:%Y}", "out/{date!r}"])
def test_unknown_output_template_fields_are_usage_errors(tmp_path, capsys, output):
    from pipeline.run import main

    root = tmp_path / "imgs"
    make_tree(root, {"ant": 1, "bee": 1})
    assert main([f"--input={root}", f"--output={tmp_path}/{output}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "only {date}, {timestamp} expand" in err.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == [root]


@pytest.mark.parametrize("field", ["{date:%Y}", "{date!r}", "{timestamp!s:>20}"])
def test_an_output_field_with_a_format_is_named_as_written(field):
    """`{date:%Y}` was refused as "unknown field {date}; only {date}, {timestamp} expand"."""
    from pipeline.errors import UsageError
    from pipeline.prepare import expand_output_template

    with pytest.raises(UsageError, match=re.escape(f"unknown field {field};")):
        expand_output_template(f"out/{field}", datetime.datetime.now(datetime.timezone.utc))


def test_beam_counters_count_each_rejection_class(messy_run):
    from apache_beam.metrics.metric import MetricsFilter

    result, out = messy_run
    counters = {c.key.metric.name: c.committed
                for c in result.metrics().query(MetricsFilter().with_namespace("imgrec"))["counters"]}
    metadata = read_metadata(out)
    rejected = {name.removeprefix("rejected_"): n for name, n in counters.items() if name.startswith("rejected_")}
    assert rejected == dict(metadata.inputs.rejected_by_error)
    assert counters["images_converted"] == metadata.inputs.written == 20
    assert counters.get("images_reused", 0) == 0
    # Read and hashed: everything but the skipped README, the empty file and the failed headers.
    assert counters["files_read"] == metadata.inputs.total - 1 - 1 - 3


def test_a_locked_output_exits_3_with_one_line(messy_folder, tmp_path, capsys):
    from pipeline.output.lock import OutputLock
    from pipeline.run import main

    locked = tmp_path / "locked"
    locked.mkdir()
    with OutputLock(str(locked), "another-run"):
        assert main([*IN_MEMORY, f"--input={messy_folder}", f"--output={locked}", "--max_error_fraction=1"]) == 3
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("imgrec: error")]
    assert len(err) == 1 and "held by run another-run" in err[0]
    assert sorted(p.name for p in locked.iterdir()) == []  # nothing written, the lock released
