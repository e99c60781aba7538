"""Issue 8, "Verifying a dataset": `imgrec verify OUTPUT` must reconcile the accounting
in metadata.json with the dead letters and the splits: exit 1 when it was edited, exit 2 with a
clear message when metadata.json is not JSON.

The dataset is written by imgrec's `convert` and checked once by verify's `main(argv)`, and its
edited copies too (`verify_here`), in this process: the function the command exits with, so each
costs no interpreter start nor TensorFlow import (verify as a process: the closed-streams check
below and tests/test_verify.py's entry points).
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import shutil
import subprocess
import sys

import cv2
import pytest

from tests.helpers import REPO, check_complete, make_tree, run_pipeline, subprocess_env, verify_here, write_photo

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> pathlib.Path:
    """A finished dataset with dead letters both inside a split (decode failures) and outside
    (header failures, skipped files)."""
    base = tmp_path_factory.mktemp("inspect")
    data = base / "data"
    make_tree(data, {"cat": 8, "dog": 8})
    for i in range(3):  # truncated JPEGs pass the header check and fail decoding: in a split
        good = write_photo(data / "cat" / f"trunc_{i}.jpg", seed=900 + i, size=(64, 64))
        (data / "cat" / f"trunc_{i}.jpg").write_bytes(good[: len(good) // 2])
    (data / "dog" / "notes.jpg").write_text("not pixels")  # NotAnImage: no split
    (data / "dog" / "README.txt").write_text("skipped")
    out = base / "out"
    run_pipeline(data, out, "--max_error_fraction=1", "--height=32", "--width=32", "--num_shards=2",
                 "--encoding=png", "--normalize=none")
    metadata, _, rows = check_complete(out)
    assert any(r.get("split") for r in rows) and any(not r.get("split") for r in rows), rows
    from pipeline.read.verify import main as verify

    assert verify([str(out), "--samples=0", f"--out={base / 'pngs'}"]) == 0, "the unedited dataset fails verify"
    return out


def edited_copy(dataset: pathlib.Path, tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict, list[dict]]:
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    metadata = json.loads((copy / "metadata.json").read_text())
    rows = [json.loads(line) for name in metadata["error_files"]
            for line in (copy / name).read_text().splitlines() if line.strip()]
    return copy, metadata, rows


def edit_total(m, rows, copy):
    m["inputs"]["total"] += 1                      # total != written + rejected


def edit_written(m, rows, copy):
    m["inputs"]["written"] += 1                    # total = written + rejected still holds,
    m["inputs"]["total"] += 1                      # but written != the splits' examples


def edit_rejected(m, rows, copy):
    m["inputs"]["rejected"] += 1                   # total = written + rejected still holds,
    m["inputs"]["total"] += 1                      # but rejected != dead-letter lines


def edit_split_rejected(m, rows, copy):
    split = collections.Counter(r["split"] for r in rows if r.get("split")).most_common(1)[0][0]
    other = next(s for s in m["splits"] if s != split)
    m["splits"][split]["rejected"] -= 1            # totals unchanged; one split's count moved
    m["splits"][other]["rejected"] += 1


def edit_rejected_by_error(m, rows, copy):
    by_error = m["inputs"]["rejected_by_error"]
    by_error["CorruptImage"] -= 1                  # sum unchanged; one count moved to another class
    by_error["NotAnImage"] += 1


def delete_errors_file(m, rows, copy):
    for name in m["error_files"]:
        (copy / name).unlink()


def edit_a_row_error_into_a_list(m, rows, copy):
    errors = copy / m["error_files"][0]            # still JSON, but no dead-letter row (verify crashed)
    first, *others = errors.read_text().splitlines()
    errors.write_text("\n".join([json.dumps({**json.loads(first), "error": ["CorruptImage"]}), *others]) + "\n")


EDITS = [edit_total, edit_written, edit_rejected, edit_split_rejected, edit_rejected_by_error, delete_errors_file,
         edit_a_row_error_into_a_list]


@pytest.mark.parametrize("edit", EDITS, ids=[e.__name__ for e in EDITS])
def test_verify_fails_when_the_accounting_was_edited(dataset, tmp_path, capsys, edit):
    copy, metadata, rows = edited_copy(dataset, tmp_path)
    edit(metadata, rows, copy)
    (copy / "metadata.json").write_text(json.dumps(metadata, indent=2))
    run = verify_here(capsys, copy, "--samples=0", f"--out={tmp_path / 'pngs'}")
    assert run.returncode == 1, run.brief()
    assert "Traceback" not in run.stderr, run.brief()


def test_verify_exits_2_with_a_clear_message_on_invalid_json(dataset, tmp_path, capsys):
    copy, _, _ = edited_copy(dataset, tmp_path)
    text = (copy / "metadata.json").read_text()
    (copy / "metadata.json").write_text(text[: len(text) // 2])  # a truncated copy
    run = verify_here(capsys, copy, "--samples=0", f"--out={tmp_path / 'pngs'}")
    assert run.returncode == 2, run.brief()
    assert "Traceback" not in run.stderr, run.brief()
    assert "metadata.json" in run.stdout + run.stderr, run.brief()


def test_a_check_started_with_its_standard_streams_closed_passes_and_draws_its_pngs(dataset, tmp_path):
    """`... 2>&- >&- <&-`: files the command opens (TensorFlow's, the PNGs) would get descriptors
    0-2, where native libraries write their messages; the command reopens them first."""
    pngs = tmp_path / "pngs"
    run = subprocess.run([sys.executable, "-m", "pipeline.read.verify", str(dataset), f"--out={pngs}"], cwd=REPO,
                         env=subprocess_env(), timeout=120, preexec_fn=lambda: [os.close(fd) for fd in (0, 1, 2)])
    assert run.returncode == 0
    drawn = sorted(pngs.glob("*.png"))
    assert drawn and all(cv2.imread(str(path)) is not None for path in drawn), drawn
