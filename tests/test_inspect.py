"""pipeline.inspect: passes on datasets the real pipeline wrote, fails naming the file when a
shard is damaged, missing or miscounted; the drawing functions on synthetic arrays."""
from __future__ import annotations

import io
import json
import os
import pathlib
import shutil
import subprocess
import sys

import cv2
import numpy as np
import pytest

from pipeline import inspect as imgrec_inspect
from tests.conftest import REPO, written_datasets
from transforms.normalize import normalize_image
from transforms.specs import ImageSpec

COMMON = ("--height=40", "--width=56", "--num_shards=2", "--split_method=stratified")
LAYOUTS = {
    "jpeg": ("--encoding=jpeg", "--normalize=none"),
    "gzip_mean_std": ("--encoding=raw", "--normalize=mean_std", "--compression=gzip"),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """name → output dir; tests that damage a dataset copy it first."""
    get = written_datasets(tmp_path_factory, COMMON, LAYOUTS)
    return lambda name: pathlib.Path(get(name)[0])


def copy_of(written, name: str, tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict]:
    copy = tmp_path / "dataset"
    shutil.copytree(written(name), copy)
    return copy, json.loads((copy / "metadata.json").read_text())


def inspect(*argv: str) -> tuple[int, str]:
    stream = io.StringIO()
    code = imgrec_inspect.main(list(argv), stream=stream)
    return code, stream.getvalue()


def largest_train_shard(output: pathlib.Path, metadata: dict) -> str:
    return max(metadata["splits"]["train"]["files"], key=lambda name: (output / name).stat().st_size)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_good_dataset_passes_and_draws(written, name, tmp_path):
    code, report = inspect(str(written(name)), "--samples", "5", "--out", str(tmp_path))
    assert code == 0, report
    assert "FAILED" not in report and "OK: all" in report
    for split in ("train", "val", "test"):
        assert f"split {split}:" in report
    sheet = cv2.imread(str(tmp_path / imgrec_inspect.CONTACT_SHEET))
    chart = cv2.imread(str(tmp_path / imgrec_inspect.CLASS_COUNTS))
    assert sheet is not None and chart is not None
    assert sheet.shape[1] >= 5 * 160 and sheet.shape[0] >= 3 * (160 + 22)  # 5 columns, 3 splits
    assert sheet.std() > 20  # pictures, not a blank page
    assert chart.shape[0] >= 100 and chart.shape[1] >= 3 * 220


def test_mean_std_samples_are_shown_denormalized(written, tmp_path):
    """The contact sheet of a mean_std dataset looks like the jpeg one, not like noise."""
    inspect(str(written("gzip_mean_std")), "--samples", "3", "--out", str(tmp_path / "raw"))
    inspect(str(written("jpeg")), "--samples", "3", "--out", str(tmp_path / "jpeg"))
    raw = cv2.imread(str(tmp_path / "raw" / imgrec_inspect.CONTACT_SHEET)).astype(int)
    jpeg = cv2.imread(str(tmp_path / "jpeg" / imgrec_inspect.CONTACT_SHEET)).astype(int)
    assert raw.shape == jpeg.shape and np.abs(raw - jpeg).mean() < 8


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_flipped_byte_fails_naming_the_file(written, name, tmp_path):
    output, metadata = copy_of(written, name, tmp_path)
    shard = largest_train_shard(output, metadata)
    data = bytearray((output / shard).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (output / shard).write_bytes(bytes(data))
    code, report = inspect(str(output), "--out", str(tmp_path / "pictures"))
    assert code == 1, report
    failed = [line for line in report.splitlines() if line.strip().startswith("FAILED") and shard in line]
    assert failed, report
    assert "DataLossError" in failed[0] or "InvalidArgumentError" in failed[0]
    assert (tmp_path / "pictures" / imgrec_inspect.CLASS_COUNTS).exists()  # still drawn


def test_a_deleted_shard_fails_naming_the_file(written, tmp_path):
    output, metadata = copy_of(written, "jpeg", tmp_path)
    shard = metadata["splits"]["val"]["files"][-1]
    (output / shard).unlink()
    code, report = inspect(str(output))
    assert code == 1
    assert any(shard in line and "missing" in line for line in report.splitlines() if "FAILED" in line), report
    assert (output / imgrec_inspect.CONTACT_SHEET).exists()  # --out defaults to the dataset folder


def test_counts_that_disagree_with_metadata_fail(written, tmp_path):
    output, metadata = copy_of(written, "jpeg", tmp_path)
    train = metadata["splits"]["train"]
    shard = train["files"][0]
    train["shard_lengths"][0] += 1
    train["num_examples"] += 1
    first_class = sorted(train["label_counts"])[0]
    train["label_counts"][first_class] += 1
    (output / "metadata.json").write_text(json.dumps(metadata))
    code, report = inspect(str(output), "--samples", "0")
    assert code == 1
    failed = [line for line in report.splitlines() if line.strip().startswith("FAILED")]
    assert any(shard in line and "metadata says" in line for line in failed), report
    assert any("train: label counts" in line and first_class in line for line in failed), report
    assert not (output / imgrec_inspect.CONTACT_SHEET).exists()  # --samples 0: no contact sheet


def test_a_folder_without_metadata_is_refused(tmp_path):
    code, report = inspect(str(tmp_path))
    assert code == 2 and "not a finished imgrec dataset" in report


def test_command_line_entry_point(written, tmp_path):
    output, _ = copy_of(written, "jpeg", tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pipeline.inspect", str(output), "--samples", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: all" in done.stdout
    assert (output / imgrec_inspect.CONTACT_SHEET).exists() and (output / imgrec_inspect.CLASS_COUNTS).exists()


# --- pure drawing functions ------------------------------------------------------------------

def test_contact_sheet_layout():
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (30, 90, 3), dtype=np.uint8)  # wide
    grey = rng.integers(0, 256, (120, 40), dtype=np.uint8)  # tall, no channel axis
    rgba = rng.integers(0, 256, (50, 50, 4), dtype=np.uint8)
    sheet = imgrec_inspect.draw_contact_sheet(
        [("train", [rgb, grey, rgba], ["cat", "a very long label that cannot fit under one tile", "caf\u00e9"]),
         ("val", [], [])], tile=100, columns=2)
    assert sheet.dtype == np.uint8 and sheet.ndim == 3 and sheet.shape[2] == 3
    assert sheet.shape[1] == 2 * 10 + 2 * 100 + 8  # two columns
    # train: header + 2 rows of (tile + caption) + gap between rows + gap; val: header + 1 empty row + gap
    assert sheet.shape[0] == 10 + (30 + 2 * 122 + 8 + 8) + (30 + 122 + 8) + 10
    caption = sheet[10 + 30 + 100:10 + 30 + 122, 10:110]
    assert (caption < 128).any()  # the caption was drawn
    with pytest.raises(ValueError, match="uint8"):
        imgrec_inspect.draw_contact_sheet([("x", [np.zeros((4, 4, 3), np.float32)], ["a"])])


def test_bar_chart_scales_bars_per_split():
    counts = {"train": {"cat": 8, "dog": 4, "fox": 0}, "val": {"cat": 1}, "test": {}}
    chart = imgrec_inspect.draw_bar_chart(counts, ["cat", "dog", "fox"], bar_height=18, bar_width=200)
    assert chart.dtype == np.uint8 and chart.shape[2] == 3
    train_color = np.array(imgrec_inspect._SPLIT_COLORS[0])
    is_train = np.all(chart == train_color, axis=2)
    rows = is_train.sum(axis=1)
    widths = sorted({int(n) for n in rows if n > 30})  # bars, not the colored header text
    assert len(widths) == 2 and abs(widths[1] - 2 * widths[0]) <= 2  # cat bar twice the dog bar
    assert abs(widths[1] - 200) <= 2  # the largest class fills the panel
    empty = imgrec_inspect.draw_bar_chart({}, [])
    assert empty.ndim == 3


def test_display_pixels_undo_write_time_normalization():
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    for method in ("unit", "mean_std"):
        stored = normalize_image(image, ImageSpec(normalize=method))
        shown = imgrec_inspect.to_display_uint8(stored, method)
        assert np.abs(shown.astype(int) - image.astype(int)).max() <= 1
    assert imgrec_inspect.to_display_uint8(image) is image


def test_label_map_ids_must_be_distinct_but_not_contiguous():
    from pipeline.inspect import label_map_check

    assert label_map_check({"3": 3, "7": 7}).ok  # integer labels from a manifest
    assert not label_map_check({"cat": 0, "dog": 0}).ok
