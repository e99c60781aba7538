"""Multi-label CSV/JSONL manifests (#41, --multi_label): each image's list of labels becomes an
int64 label list (and the list of their texts) in its record, the label map holds the labels,
each split's label_counts counts labels, load_dataset gives the lists (ragged when batched) and
verify passes; what cannot hold lists is refused in one line."""
from __future__ import annotations

import json
import pathlib

import pytest

from tests.helpers import dead_letters, imgrec_here, run_pipeline, verify_here, write_photo

pytestmark = pytest.mark.e2e

LABELS = {"a.jpg": ["dog", "cat"], "b.jpg": ["dog"], "c.jpg": [], "d.jpg": ["fox", "cat", "cat"]}


def photos(folder: pathlib.Path) -> None:
    for seed, name in enumerate(LABELS):
        write_photo(folder / name, seed)


def csv_manifest(folder: pathlib.Path) -> pathlib.Path:
    """CSV cells join labels with |; an image with no label has no CSV line (a cell must name one)."""
    photos(folder)
    lines = ["path,labels"] + [f"{name},{'|'.join(labels)}" for name, labels in LABELS.items() if labels]
    path = folder / "tags.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def jsonl_manifest(folder: pathlib.Path) -> pathlib.Path:
    photos(folder)
    path = folder / "tags.jsonl"
    path.write_text("".join(json.dumps({"path": name, "labels": labels}) + "\n" for name, labels in LABELS.items()))
    return path


def read_back(output: pathlib.Path, metadata) -> dict[str, list[str]]:
    """source path → the label texts load_dataset gives (ids through metadata's label map), checked
    against the label texts the records hold."""
    import imgrec

    names = {i: n for n, i in metadata.label_map.items()}
    found = {}
    for split, info in metadata.splits.items():
        if not info.num_examples:
            continue
        for _, label, extras in imgrec.load_dataset(str(output), split, batch_size=None, with_metadata=True):
            texts = [names[int(i)] for i in label.numpy()]
            assert texts == [t.decode() for t in extras["label_text"].numpy()]
            found[pathlib.Path(extras["source_path"].numpy().decode()).name] = texts
    return found


@pytest.mark.parametrize("make", [csv_manifest, jsonl_manifest], ids=["csv", "jsonl"])
def test_label_lists_are_written_and_read_back(tmp_path, capsys, make):
    manifest = make(tmp_path / "in")
    metadata = run_pipeline(manifest, tmp_path / "out", "--multi_label", "--height=16", "--width=16")
    assert metadata.label_map == {"cat": 0, "dog": 1, "fox": 2}
    expected = {name: sorted(set(labels)) for name, labels in LABELS.items()
                if labels or manifest.suffix == ".jsonl"}
    assert read_back(tmp_path / "out", metadata) == expected
    counts = {}
    for info in metadata.splits.values():
        for name, n in info.label_counts.items():
            counts[name] = counts.get(name, 0) + n
    assert {k: v for k, v in counts.items() if v} == {"cat": 2, "dog": 2, "fox": 1}  # labels, not images
    assert metadata.inputs.written == len(expected) and metadata.inputs.rejected == 0
    done = verify_here(capsys, tmp_path / "out", "--out", str(tmp_path / "pngs"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_label_lists_recorded_without_their_texts_pass_verify(tmp_path, capsys):
    """A config's `features: label_text: ''` leaves the texts out: verify's contact sheet names each
    image's labels from the label map (it took a label list for one label and crashed)."""
    (tmp_path / "keys.yaml").write_text("features:\n  label_text: ''\n")
    run_pipeline(jsonl_manifest(tmp_path / "in"), tmp_path / "out", "--multi_label", "--height=16", "--width=16",
                 f"--config={tmp_path / 'keys.yaml'}")
    done = verify_here(capsys, tmp_path / "out", "--out", str(tmp_path / "pngs"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_batches_of_label_lists_are_ragged(tmp_path):
    import tensorflow as tf

    import imgrec

    metadata = run_pipeline(jsonl_manifest(tmp_path / "in"), tmp_path / "out", "--multi_label", "--height=16",
                            "--width=16", "--split_ratios=1,0,0")
    images, labels = next(iter(imgrec.load_dataset(str(tmp_path / "out"), "train", batch_size=4)))
    assert images.shape == (4, 16, 16, 3) and isinstance(labels, tf.RaggedTensor)
    assert sorted(labels.row_lengths().numpy().tolist()) == [0, 1, 2, 2]
    # the OD API's image-level class keys unless a config names others (tests/test_specs_options.py)
    assert {key: metadata.features[key]["kind"] for key in ("image/class/label", "image/class/text")} == {
        "image/class/label": "var_len", "image/class/text": "var_len"}


def test_an_unknown_label_rejects_its_image(tmp_path):
    metadata = run_pipeline(csv_manifest(tmp_path / "in"), tmp_path / "out", "--multi_label",
                            "--class_names=cat,dog", "--max_error_fraction=1", "--height=16", "--width=16")
    (row,) = dead_letters(tmp_path / "out")
    assert row["error"] == "UnknownLabel" and row["path"].endswith("d.jpg") and "'fox'" in row["message"]
    assert metadata.inputs.written == 2


@pytest.mark.parametrize("flags, says", [
    (("--split_method=stratified",), "split_method=stratified needs one label per image"),
    (("--input_kind=folders",), "multi_label reads a list of labels per line of a CSV or JSONL manifest"),
])
def test_what_cannot_hold_label_lists_is_a_usage_error(tmp_path, capsys, flags, says):
    done = imgrec_here(capsys, csv_manifest(tmp_path / "in"), tmp_path / "out", "--multi_label", *flags, runner=())
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
