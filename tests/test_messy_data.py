"""Broken files, error budgets, atomic publishing, re-runs and bounded memory, on real runs."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import struct
import subprocess
import sys
import time
import zlib

import cv2
import numpy as np
import pytest

from pipeline.metadata import TooManyErrors
from pipeline.publish import DatasetExists
from tests.conftest import MULTI_PROCESSING, REPO, records_by_split, run_pipeline


def write_image(path: pathlib.Path, seed: int, size: tuple[int, int] = (40, 56)) -> bytes:
    """A small distinct photo-like JPEG/PNG (by suffix); returns its bytes."""
    rng = np.random.default_rng(seed)
    base = cv2.resize(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), size[::-1], interpolation=cv2.INTER_CUBIC)
    ok, buf = cv2.imencode(path.suffix, base)
    assert ok
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.tobytes())
    return buf.tobytes()


def png_declaring(width: int, height: int) -> bytes:
    """A PNG header (valid CRC) that declares a huge image but carries no pixels."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk


def make_good_images(root: pathlib.Path, per_class: int, classes=("ant", "bee"), size=(40, 56)) -> list[pathlib.Path]:
    paths = []
    for c, name in enumerate(classes):
        for i in range(per_class):
            path = root / name / f"{name}_{i:04d}{'.png' if i % 5 == 0 else '.jpg'}"
            write_image(path, seed=c * 100_000 + i, size=size)
            paths.append(path)
    return paths


@pytest.fixture
def messy_folder(tmp_path) -> pathlib.Path:
    root = tmp_path / "messy"
    make_good_images(root, per_class=10)
    good = (root / "ant" / "ant_0001.jpg").read_bytes()
    (root / "ant" / "empty.jpg").write_bytes(b"")
    (root / "ant" / "notes.jpg").write_bytes(b"these are not pixels, just text in a .jpg\n" * 4)
    (root / "ant" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    png = (root / "bee" / "bee_0000.png").read_bytes()
    (root / "bee" / "truncated.png").write_bytes(png[: len(png) // 2])
    (root / "bee" / "bomb.png").write_bytes(png_declaring(100_000, 100_000))
    write_image(root / "bee" / "tiny.png", seed=7, size=(3, 3))
    (root / "bee" / "copy_of_ant_0001.jpg").write_bytes(good)
    (root / "bee" / "README.txt").write_text("not an image")
    return root


def rejections(output: pathlib.Path, metadata: dict) -> list[dict]:
    return [json.loads(line) for name in metadata["error_files"]
            for line in (output / name).read_text().splitlines() if line]


def test_each_kind_of_bad_input_becomes_a_dead_letter(messy_folder, tmp_path):
    out = tmp_path / "out"
    metadata = run_pipeline(messy_folder, out, "--max_error_fraction=1", "--min_side=8", "--max_pixels=1000000",
                            "--drop_duplicates")
    by_path = {pathlib.Path(r["path"]).name: r for r in rejections(out, metadata)}
    expected = {
        "empty.jpg": ("read", "EmptyFile"),
        "notes.jpg": ("header", "NotAnImage"),
        "truncated.jpg": ("decode", "CorruptImage"),
        "truncated.png": ("decode", "CorruptImage"),
        "bomb.png": ("header", "ImageTooLarge"),
        "tiny.png": ("header", "ImageTooSmall"),
        "README.txt": ("discover", "SkippedFile"),
        # the copy sorts after ant/ant_0001.jpg, so the copy is the one dropped
        "copy_of_ant_0001.jpg": ("dedup", "DuplicateImage"),
    }
    assert {name: (r["stage"], r["error"]) for name, r in by_path.items()} == expected
    for name, row in by_path.items():
        assert row["message"], name
    assert "100000x100000" in by_path["bomb.png"]["message"]
    assert "ant_0001.jpg" in by_path["copy_of_ant_0001.jpg"]["message"]
    inputs = metadata["inputs"]
    assert inputs["total"] == 28 == inputs["written"] + inputs["rejected"]
    assert inputs["written"] == 20 and inputs["rejected"] == 8
    assert inputs["errors"] == 6  # skipped files and dropped copies are not errors
    assert metadata["duplicates"]["groups"] == 1 and metadata["duplicates"]["dropped"] is True
    for split, info in metadata["splits"].items():
        in_split = sum(1 for r in by_path.values() if r["split"] == split)
        assert info["rejected"] == in_split


def test_unknown_labels_and_manifest_problems_are_dead_letters(tmp_path):
    root = tmp_path / "imgs"
    make_good_images(root, per_class=3, classes=("ant", "bee", "wasp"))
    manifest = tmp_path / "list.jsonl"
    lines = [json.dumps({"path": str(p.relative_to(tmp_path)), "label": p.parent.name}) for p in sorted(root.glob("*/*"))]
    lines += [json.dumps({"path": "imgs/ant/missing.jpg", "label": "ant"}), "{not json"]
    manifest.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    metadata = run_pipeline(manifest, out, "--class_names=ant,bee", "--max_error_fraction=1")
    errors = sorted((r["error"], pathlib.Path(r["path"]).name) for r in rejections(out, metadata))
    assert errors == [("BadManifestLine", "list.jsonl"), ("UnknownLabel", "wasp_0000.png"),
                      ("UnknownLabel", "wasp_0001.jpg"), ("UnknownLabel", "wasp_0002.jpg"),
                      ("UnreadableFile", "missing.jpg")]
    assert metadata["label_map"] == {"ant": 0, "bee": 1}
    assert metadata["inputs"]["total"] == 11 and metadata["inputs"]["written"] == 6


def test_error_budget_fails_the_run_and_publishes_nothing(messy_folder, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(Exception) as failure:
        run_pipeline(messy_folder, out)  # default max_error_fraction 0.01
    assert "max_error_fraction" in str(failure.value)
    assert TooManyErrors.__name__ in str(failure.value) or isinstance(failure.value, TooManyErrors)
    assert not out.exists() or not any(out.iterdir())


def test_refuses_to_overwrite_a_finished_dataset(tmp_path):
    root = tmp_path / "imgs"
    make_good_images(root, per_class=4)
    out = tmp_path / "out"
    first = run_pipeline(root, out)
    with pytest.raises(DatasetExists, match="--overwrite"):
        run_pipeline(root, out)
    (root / "ant" / "ant_0000.png").unlink()
    second = run_pipeline(root, out, "--overwrite")
    assert first["inputs"]["written"] == 8 and second["inputs"]["written"] == 7
    listed = {name for s in second["splits"].values() for name in s["files"]} | set(second["error_files"])
    assert {p.name for p in out.iterdir()} == listed | {"metadata.json"}


def test_rerun_gives_identical_shards(tmp_path):
    root = tmp_path / "imgs"
    make_good_images(root, per_class=15)
    first = run_pipeline(root, tmp_path / "a", "--num_shards=3")
    second = run_pipeline(root, tmp_path / "b", "--num_shards=3")
    assert records_by_split(tmp_path / "a", first) == records_by_split(tmp_path / "b", second)
    for info in first["splits"].values():
        for name in info["files"]:
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def _pipeline_command(root: pathlib.Path, out: pathlib.Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.run", f"--input={root}", f"--output={out}", *flags]


def test_killed_run_leaves_nothing_and_the_rerun_completes(tmp_path):
    root = tmp_path / "imgs"
    make_good_images(root, per_class=150, size=(400, 500))
    out = tmp_path / "out"
    flags = (*MULTI_PROCESSING, "--encoding=raw", "--normalize=unit", "--num_shards=4")
    staging = pathlib.Path(f"{out}.imgrec-staging")
    process = subprocess.Popen(_pipeline_command(root, out, *flags), cwd=REPO, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any(p.name.startswith("train-") for p in staging.glob("*/*")) and time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    assert process.poll() is None, "no shard was being written within 120 s"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (out / "metadata.json").exists()
    assert not out.exists() or not any(out.iterdir())
    metadata = run_pipeline(root, out, *flags[3:], runner=MULTI_PROCESSING)
    assert not staging.exists()
    assert metadata["inputs"]["written"] == 300
    reference = run_pipeline(root, tmp_path / "clean", *flags[3:], runner=MULTI_PROCESSING)
    assert records_by_split(out, metadata) == records_by_split(tmp_path / "clean", reference)


def _peak_rss_mib(root: pathlib.Path, out: pathlib.Path) -> float:
    """Peak RSS of a whole in-memory DirectRunner run in a fresh process."""
    code = ("import resource, sys; from pipeline.run import run; run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    result = subprocess.run([sys.executable, "-c", code, "--runner=DirectRunner", "--direct_running_mode=in_memory",
                             f"--input={root}", f"--output={out}", "--encoding=raw", "--normalize=unit",
                             "--num_shards=2"], cwd=REPO, capture_output=True, text=True, check=True)
    return int(result.stdout.split()[-1]) / 1024


def test_memory_is_bounded_by_data_in_flight(tmp_path):
    """Raw float32 records are 588 KiB each: holding 4x more of them would show in RSS."""
    small, large = tmp_path / "small", tmp_path / "large"
    make_good_images(small, per_class=50)
    make_good_images(large, per_class=200)
    rss_small = _peak_rss_mib(small, tmp_path / "out_small")
    rss_large = _peak_rss_mib(large, tmp_path / "out_large")
    extra_data_mib = 300 * 224 * 224 * 3 * 4 / 2**20  # 4x the images: 300 more records
    assert rss_large - rss_small < 0.1 * extra_data_mib, (rss_small, rss_large)
    assert rss_large < 1.5 * rss_small


def test_skip_unchanged_keeps_the_dataset_until_inputs_change(tmp_path):
    root = tmp_path / "imgs"
    make_good_images(root, per_class=4)
    out = tmp_path / "out"
    first = run_pipeline(root, out, "--skip_unchanged")
    again = run_pipeline(root, out, "--skip_unchanged")
    assert again == first  # not rewritten: same run id, same files
    write_image(root / "bee" / "bee_new.jpg", seed=999)
    changed = run_pipeline(root, out, "--skip_unchanged")
    assert changed["run"]["run_id"] != first["run"]["run_id"]
    assert changed["inputs"]["written"] == 9 and changed["fingerprint"] != first["fingerprint"]
    rewritten = run_pipeline(root, out, "--skip_unchanged", "--quality=80", "--encoding=jpeg", "--normalize=none")
    assert rewritten["fingerprint"] != changed["fingerprint"]  # the config is part of the fingerprint


def test_output_path_templates_expand_by_date(tmp_path):
    import datetime

    from pipeline.run import expand_output_template

    now = datetime.datetime(2026, 12, 2, 13, 15, 0, tzinfo=datetime.timezone.utc)
    assert expand_output_template("gs://b/ds/{date}", now) == "gs://b/ds/2026-12-02"
    assert expand_output_template(str(tmp_path / "{timestamp}"), now) == str(tmp_path / "20261202T131500")
    root = tmp_path / "imgs"
    make_good_images(root, per_class=2)
    from pipeline.run import main
    assert main([f"--input={root}", f"--output={tmp_path}/daily/{{date}}", "--runner=DirectRunner"]) == 0
    (dated,) = (tmp_path / "daily").iterdir()
    assert datetime.date.fromisoformat(dated.name) and (dated / "metadata.json").exists()


def test_beam_counters_count_each_rejection_class(messy_folder, tmp_path):
    from apache_beam.metrics.metric import MetricsFilter

    from pipeline.run import run

    out = tmp_path / "out"
    result = run(["--runner=DirectRunner", f"--input={messy_folder}", f"--output={out}", "--max_error_fraction=1",
                  "--min_side=8", "--max_pixels=1000000"])
    counters = {c.key.metric.name: c.committed
                for c in result.metrics().query(MetricsFilter().with_namespace("imgrec"))["counters"]}
    metadata = json.loads((out / "metadata.json").read_text())
    rejected = {name.removeprefix("rejected_"): n for name, n in counters.items() if name.startswith("rejected_")}
    assert rejected == metadata["inputs"]["rejected_by_error"]
    assert counters["records_written"] == metadata["inputs"]["written"]
