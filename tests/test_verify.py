"""pipeline.read.verify: passes on datasets the real pipeline wrote;
fails naming the file when a shard, a record index or a dead-letter file is damaged, missing or
miscounted, or when the accounting or the parse spec in metadata.json was edited; refuses folders
that are not readable datasets and an --out that is a file."""
from __future__ import annotations

import io
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys

import cv2
import numpy as np
import pytest

from pipeline.read import verify
from tests.helpers import REPO, subprocess_env, written_datasets

pytestmark = pytest.mark.e2e

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


def run_verify(*argv: str) -> tuple[int, str]:
    stream = io.StringIO()
    code = verify.main(list(argv), stream=stream)
    return code, stream.getvalue()


def verify_edited(output: pathlib.Path, metadata: dict) -> tuple[int, str]:
    """Writes the edited `metadata` back into the copy and verifies it."""
    (output / "metadata.json").write_text(json.dumps(metadata))
    return run_verify(str(output), "--samples", "0")


def failed_lines(report: str) -> list[str]:
    return [line.strip() for line in report.splitlines() if line.strip().startswith("FAILED")]


def largest_train_shard(output: pathlib.Path, metadata: dict) -> str:
    return max(metadata["splits"]["train"]["files"], key=lambda name: (output / name).stat().st_size)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_good_dataset_passes_and_draws(written, name, tmp_path):
    code, report = run_verify(str(written(name)), "--samples", "5", "--out", str(tmp_path))
    assert code == 0, report
    assert not failed_lines(report) and "OK: all" in report
    for split in ("train", "val", "test"):
        assert f"split {split}:" in report
    assert "inputs: 38 = written + rejected" in report and "format 2" in report
    assert report.count("record index matches the shards") == 3  # gzip shards too
    sheet = cv2.imread(str(tmp_path / verify.CONTACT_SHEET))
    chart = cv2.imread(str(tmp_path / verify.CLASS_COUNTS))
    assert sheet is not None and chart is not None
    assert sheet.shape[1] >= 5 * 160 and sheet.shape[0] >= 3 * (160 + 22)  # 5 columns, 3 splits
    assert sheet.std() > 20  # pictures, not a blank page
    assert chart.shape[0] >= 100 and chart.shape[1] >= 3 * 220


def test_mean_std_samples_are_shown_denormalized(written, tmp_path):
    """The contact sheet of a mean_std dataset looks like the jpeg one, not like noise."""
    run_verify(str(written("gzip_mean_std")), "--samples", "3", "--out", str(tmp_path / "raw"))
    run_verify(str(written("jpeg")), "--samples", "3", "--out", str(tmp_path / "jpeg"))
    raw = cv2.imread(str(tmp_path / "raw" / verify.CONTACT_SHEET)).astype(int)
    jpeg = cv2.imread(str(tmp_path / "jpeg" / verify.CONTACT_SHEET)).astype(int)
    assert raw.shape == jpeg.shape and np.abs(raw - jpeg).mean() < 8


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_flipped_byte_fails_naming_the_file(written, name, tmp_path):
    output, metadata = copy_of(written, name, tmp_path)
    shard = largest_train_shard(output, metadata)
    data = bytearray((output / shard).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (output / shard).write_bytes(bytes(data))
    code, report = run_verify(str(output), "--out", str(tmp_path / "pictures"))
    assert code == 1, report
    failed = [line for line in failed_lines(report) if shard in line]
    assert failed, report
    assert "DataLossError" in failed[0] or "InvalidArgumentError" in failed[0]
    assert (tmp_path / "pictures" / verify.CLASS_COUNTS).exists()  # still drawn


def test_a_deleted_shard_fails_naming_the_file(written, tmp_path):
    output, metadata = copy_of(written, "jpeg", tmp_path)
    shard = metadata["splits"]["val"]["files"][-1]
    (output / shard).unlink()
    code, report = run_verify(str(output))
    assert code == 1
    assert any(shard in line and "missing" in line for line in failed_lines(report)), report
    assert (output / verify.CONTACT_SHEET).exists()  # --out defaults to the dataset folder


class ReplacedWhileReporting(io.StringIO):
    """The report's stream: once verify prints its first split, another run replaces the dataset
    (its metadata.json then names that run)."""

    def __init__(self, output: pathlib.Path):
        super().__init__()
        self._output = output

    def write(self, text: str) -> int:
        if text.startswith("\nsplit "):
            metadata = json.loads((self._output / "metadata.json").read_text())
            metadata["run"]["run_id"] = "another-run"
            (self._output / "metadata.json").write_text(json.dumps(metadata))
        return super().write(text)


def test_a_dataset_replaced_while_verified_is_reported_so(written, tmp_path):
    output, metadata = copy_of(written, "jpeg", tmp_path)
    stream = ReplacedWhileReporting(output)
    assert verify.main([str(output), "--samples", "0"], stream=stream) == 1
    (first, *_) = failed_lines(stream.getvalue().split("checks failed:")[1])
    assert "not replaced while verified" in first and f"no longer names run {metadata['run']['run_id']}" in first


def test_counts_that_disagree_with_metadata_fail(written, tmp_path):
    output, metadata = copy_of(written, "jpeg", tmp_path)
    train = metadata["splits"]["train"]
    shard = train["files"][0]
    train["shard_lengths"][0] += 1
    train["num_examples"] += 1
    first_class = sorted(train["label_counts"])[0]
    train["label_counts"][first_class] += 1
    code, report = verify_edited(output, metadata)
    assert code == 1
    failed = failed_lines(report)
    assert any(shard in line and "metadata says" in line for line in failed), report
    assert any("train: label counts" in line and first_class in line for line in failed), report
    assert not (output / verify.CONTACT_SHEET).exists()  # --samples 0: no contact sheet


@pytest.mark.parametrize("edit,check", [
    (lambda m: m["inputs"].update(total=m["inputs"]["total"] + 1), "= written + rejected"),
    (lambda m: m["inputs"].update(written=m["inputs"]["written"] - 1, rejected=m["inputs"]["rejected"] + 1),
     "written = examples in the splits"),
    (lambda m: m["inputs"]["rejected_by_error"].update(SkippedFile=3), "rejected_by_error"),
    (lambda m: m["splits"]["val"].update(rejected=1), "val: 1 rejected = dead letters"),
], ids=["total", "written", "by-error", "split-rejected"])
def test_edited_accounting_fails(written, tmp_path, edit, check):
    output, metadata = copy_of(written, "jpeg", tmp_path)
    edit(metadata)
    code, report = verify_edited(output, metadata)
    assert code == 1, report
    assert any(check in line for line in failed_lines(report)), report


def test_a_deleted_dead_letter_file_fails(written, tmp_path):
    output, metadata = copy_of(written, "jpeg", tmp_path)
    (output / metadata["error_files"][0]).unlink()
    code, report = run_verify(str(output), "--samples", "0")
    assert code == 1
    assert any("listed in metadata.json but missing" in line for line in failed_lines(report)), report


def test_a_dead_letter_file_that_is_not_utf8_fails_with_a_summary(written, tmp_path):
    output, metadata = copy_of(written, "jpeg", tmp_path)
    (output / metadata["error_files"][0]).write_bytes(b"\xff\xfe\n")
    code, report = run_verify(str(output), "--samples", "0")
    assert code == 1, report
    assert any(line.startswith("FAILED  dead letters are readable and sorted: ") and "line 1" in line
               for line in failed_lines(report)), report
    assert "FAILED: 3 of " in report  # the verdict, with the two accounting checks the rows no longer satisfy


def test_dead_letter_rows_out_of_order_fail(written, tmp_path):
    """Rows a hand or a tool reordered or appended: imgrec writes them sorted."""
    output, metadata = copy_of(written, "jpeg", tmp_path)
    path = output / metadata["error_files"][0]
    rows = path.read_bytes().splitlines(keepends=True)
    assert len(rows) >= 2 and rows == sorted(rows)
    path.write_bytes(b"".join(reversed(rows)))
    code, report = run_verify(str(output), "--samples", "0")
    assert code == 1, report
    assert any(line.startswith("FAILED  dead letters are readable and sorted: ") and "out of order" in line
               for line in failed_lines(report)), report


def _set_shape(m: dict, height: int, width: int) -> None:
    m["features"]["image"]["shape"] = [height, width, 3]


def _set_all_shapes(m: dict, height: int, width: int) -> None:
    """A consistent edit of every description of the shape: only the records can tell."""
    _set_shape(m, height, width)
    m["config"]["image"].update(height=height, width=width)
    m["image"].update(height=height, width=width)


CONFIG = "features and image agree with the recorded config"
RECORD_SIZES = "agree with the parse spec's shape"


@pytest.mark.parametrize("edit,expected", [
    (lambda m: _set_shape(m, 20, 112), [f"{CONFIG}: features.image.shape [20, 112, 3] (config gives [40, 56, 3])",
                                        f"train: image/height, image/width, image/channels {RECORD_SIZES} 20x112x3"]),
    (lambda m: _set_all_shapes(m, 56, 40), [f"train: image/height, image/width, image/channels {RECORD_SIZES} 56x40x3: "
                                            "{train} records disagree"]),  # every one
    (lambda m: m["features"]["image"].update(normalize="unit"), [f"{CONFIG}: features.image.normalize 'unit'"]),
    (lambda m: m["features"]["image"]["mean"].__setitem__(0, 0.5), [f"{CONFIG}: features.image.mean [0.5, "]),
    (lambda m: m["config"]["image"].update(height=41), ["features.image.shape [40, 56, 3] (config gives [41, 56, 3])",
                                                        "image.height 40 (config gives 41)"]),
    (lambda m: m["image"].update(dtype="uint8"), [f"{CONFIG}: image.dtype 'uint8' (config gives 'float32')"]),
    (lambda m: m["config"]["image"].update(std=[0, 1, 1]),
     [f"{CONFIG}: config.image or config.features is not a valid config: ValueError: mean and std"]),
], ids=["same-size-shape", "every-shape", "normalize", "mean", "config-height", "image-dtype", "config-invalid"])
def test_an_edited_parse_spec_fails(written, tmp_path, edit, expected):
    """Raw pixels reshape to any shape of the same size: the edit must be caught before a reader trusts it."""
    output, metadata = copy_of(written, "gzip_mean_std", tmp_path)
    edit(metadata)
    code, report = verify_edited(output, metadata)
    assert code == 1, report
    failed = failed_lines(report)
    for text in expected:
        text = text.replace("{train}", str(metadata["splits"]["train"]["num_examples"]))
        assert any(text in line for line in failed), report


def _swap_two_hashes(index: pathlib.Path) -> None:
    lines = [line.split() for line in index.read_text().splitlines()]
    lines[0][2], lines[1][2] = lines[1][2], lines[0][2]
    index.write_text("".join(" ".join(line) + "\n" for line in lines))


def _edit_lines(index: pathlib.Path, edit) -> None:
    lines = index.read_text().splitlines(keepends=True)
    index.write_text("".join(edit(lines)))


@pytest.mark.parametrize("damage,problem", [
    (pathlib.Path.unlink, "No such file"),
    (_swap_two_hashes, "line 1: the record there does not hold content"),
    (lambda p: _edit_lines(p, lambda lines: [lines[0]] * len(lines)), "line 2: offset 0, but the record after"),
    (lambda p: _edit_lines(p, lambda lines: [lines[1], lines[0], *lines[2:]]), "line 1: offset "),
    (lambda p: _edit_lines(p, lambda lines: [*lines[:-2], lines[-1], lines[-1]]), "offset "),
    (lambda p: _edit_lines(p, lambda lines: lines[:-1]), "holds records after the one its last line frames"),
], ids=["deleted", "hashes-swapped", "first-line-repeated", "lines-swapped", "a-line-twice", "last-line-missing"])
def test_a_damaged_record_index_of_gzip_shards_fails(written, tmp_path, damage, problem):
    output, metadata = copy_of(written, "gzip_mean_std", tmp_path)
    shard = largest_train_shard(output, metadata)
    damage(output / "index" / f"{shard}.idx")
    code, report = run_verify(str(output), "--samples", "0")
    assert code == 1, report
    failed = [line for line in failed_lines(report) if line.startswith("FAILED  train: record index")]
    assert failed and f"{shard}.idx" in failed[0] and problem in failed[0], report
    if "offset" in problem:  # the lines after a misplaced one were not read: nothing is said of the shard's end
        assert "holds records after" not in failed[0], report


def test_a_negative_sample_count_is_a_usage_error(tmp_path, capsys):
    code, report = run_verify(str(tmp_path), "--samples", "-1")
    assert code == 2 and report == ""
    assert capsys.readouterr().err.strip().splitlines() == ["imgrec: error: --samples=-1: must be 0 or more"]


@pytest.mark.parametrize("below", ["", "sub/folder"], ids=["file", "below-a-file"])
def test_an_out_that_is_a_file_is_a_usage_error_before_reading(tmp_path, capsys, below):
    """Refused at once (exit 2, one line), not after reading the dataset: the folder need not even be one."""
    taken = tmp_path / "report.png"
    taken.write_bytes(b"not a folder")
    code, report = run_verify(str(tmp_path / "no-dataset"), "--out", str(taken / below))
    assert code == 2 and report == ""
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"imgrec: error: --out={taken / below}: {taken} is a file, not a folder for the PNGs"]


def test_pictures_that_cannot_be_written_are_a_failed_check(written, tmp_path):
    """A folder in a picture's place (or a full disk) fails verify with the reason, after every
    other check was reported, not with a traceback."""
    (tmp_path / "pictures" / verify.CONTACT_SHEET).mkdir(parents=True)
    code, report = run_verify(str(written("jpeg")), "--samples", "1", "--out", str(tmp_path / "pictures"))
    assert code == 1
    [failed] = [line for line in failed_lines(report) if not line.startswith("FAILED:")]
    assert failed.startswith(f"FAILED  pictures written to {tmp_path / 'pictures'}: ") and "directory" in failed


def test_a_picture_cut_short_by_a_full_disk_is_not_left_behind(written, tmp_path):
    """The file-size limit (EFBIG, as a full disk's ENOSPC) cut class_counts.png: verify failed
    that check and left the cut PNG in the folder (an empty one in the dataset's, on a full disk)."""
    dataset, out = str(written("jpeg")), tmp_path / "pictures"
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2000, limit[1]))  # Python ignores SIGXFSZ: the write fails
    try:
        code, report = run_verify(dataset, "--samples", "0", "--out", str(out))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    assert code == 1 and f"FAILED  pictures written to {out}: " in report, report
    assert not (out / verify.CLASS_COUNTS).exists()


def test_unlisted_shards_are_warned_about(written, tmp_path):
    output, _ = copy_of(written, "jpeg", tmp_path)
    (output / "train-00007-of-00009.tfrecord").write_bytes(b"")
    code, report = run_verify(str(output), "--samples", "0")
    assert code == 0 and "WARNING shard files not listed in metadata.json" in report
    assert "train-00007-of-00009.tfrecord" in report


@pytest.mark.parametrize("content,message", [
    (None, "not a finished imgrec dataset"),
    ("{broken", "not valid JSON"),
    (json.dumps({"format_version": 1}), "format_version 1 is not supported"),
])
def test_a_folder_that_is_not_a_readable_dataset_is_refused(tmp_path, capsys, content, message):
    if content is not None:
        (tmp_path / "metadata.json").write_text(content)
    code, report = run_verify(str(tmp_path))
    assert code == 2 and message in report
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("imgrec: error: ") and message in err[0]


def test_a_folder_that_does_not_exist_is_named_so(tmp_path, capsys):
    """Not "metadata.json is missing (did the run finish?)": there is no folder at all."""
    code, report = run_verify(str(tmp_path / "typo"))
    assert code == 2 and report.strip() == f"FAILED: {tmp_path / 'typo'}: no such folder"
    assert capsys.readouterr().err.strip().splitlines() == [f"imgrec: error: {tmp_path / 'typo'}: no such folder"]


def test_a_dataset_tensorflow_cannot_read_is_refused_in_one_line(capsys):
    """TensorFlow has no s3:// filesystem (docs/object-stores.md): a dataset written to S3 is
    refused with one line and exit 2, not an UnimplementedError's traceback; so is such an --out."""
    code, report = run_verify("s3://bucket/ds")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"imgrec: error: {report.strip()[len('FAILED: '):]}"], err
    assert err[0].startswith("imgrec: error: s3://bucket/ds: TensorFlow cannot read it (")
    assert "not implemented" in err[0]
    code, _ = run_verify("s3://bucket/ds", "--out=s3://bucket/pngs")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("imgrec: error: --out=s3://bucket/pngs: "), err


def test_a_gs_dataset_tensorflow_cannot_reach_is_refused_in_one_line(tmp_path):
    """gs:// through TensorFlow's GCS filesystem, which cannot connect (here: its proxy refuses,
    with one try, and a token so that no credentials are looked for): one line and exit 2, not a
    FailedPreconditionError's traceback; so for such an --out."""
    env = {key: value for key, value in subprocess_env().items() if key.lower() != "no_proxy"}
    env.update({"https_proxy": "http://127.0.0.1:1", "HTTPS_PROXY": "http://127.0.0.1:1",
                "GCS_RETRY_CONFIG_MAX_RETRIES": "0", "GOOGLE_AUTH_TOKEN_FOR_TESTING": "token"})
    for flags, start in (([], "imgrec: error: gs://imgrec-nowhere/ds: TensorFlow cannot read it ("),
                         (["--out=gs://imgrec-nowhere/pngs"], "imgrec: error: --out=gs://imgrec-nowhere/pngs: ")):
        done = subprocess.run([sys.executable, "-m", "pipeline.cli", "verify", "gs://imgrec-nowhere/ds", *flags],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        err = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(err) == 1 and err[0].startswith(start), done.stderr


def test_label_map_ids_must_be_distinct_but_not_contiguous():
    assert verify.label_map_check({"3": 3, "7": 7}).ok  # integer labels from a manifest
    assert not verify.label_map_check({"cat": 0, "dog": 0}).ok


def test_command_line_entry_point(written, tmp_path):
    """`python -m pipeline.read.verify`. `python -m pipeline.cli verify` (what `imgrec verify` runs)
    passes and draws in tests/test_detection_readback.py, keeps exit 0 with stdout unwritable in
    tests/test_trust_cli.py, and `imgrec verify` passes in tests/test_ecosystem.py and the README's
    commands (tests/test_readme.py): each one a TensorFlow-importing process."""
    output, _ = copy_of(written, "jpeg", tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pipeline.read.verify", str(output), "--samples", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: all" in done.stdout
    assert (output / verify.CONTACT_SHEET).exists() and (output / verify.CLASS_COUNTS).exists()
