"""A converted COCO sample read back (#41): `imgrec verify` passes on it and names the check a
damage breaks, `load_dataset` gives each image's boxes and classes (ragged when batched). The
damaged copies are checked by verify's `main(argv)` in this process (`verify_here`): each costs no
interpreter start nor TensorFlow import."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from pipeline.run import run
from tests.helpers import verify_here
from tests.test_detection_pipeline import BOX_KEYS, DETECTION, records

pytestmark = pytest.mark.e2e

REPO = pathlib.Path(__file__).resolve().parent.parent


def imgrec(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> pathlib.Path:
    """The COCO sample converted with the command's defaults, by run() in this process (the same
    command as a process, `imgrec run --input=data/detection/coco/instances.json`, runs in the
    README's commands: tests/test_readme.py)."""
    output = tmp_path_factory.mktemp("coco") / "records"
    run([f"--input={DETECTION / 'coco' / 'instances.json'}", f"--output={output}"])
    return output


@pytest.fixture
def copy(converted, tmp_path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(converted, tmp_path / "copy"))


def test_verify_passes_on_a_converted_detection_dataset(copy, tmp_path):
    done = imgrec("-m", "pipeline.cli", "verify", str(copy), "--out", str(tmp_path / "pngs"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: all" in done.stdout and "boxes in [0, 1]" in done.stdout
    assert (tmp_path / "pngs" / "contact_sheet.png").stat().st_size > 0


def swap_first_box_sides(output: pathlib.Path) -> None:
    """Rewrites the first record holding an object with its first box's xmin and xmax swapped."""
    import tensorflow as tf

    shard = next(p for p in sorted(output.glob("*.tfrecord")) if p.stat().st_size)
    examples = [tf.train.Example.FromString(raw.numpy()) for raw in tf.data.TFRecordDataset(str(shard))]
    example = next(e for e in examples if e.features.feature[BOX_KEYS[0]].float_list.value)
    xmin, xmax = (example.features.feature[key].float_list.value for key in (BOX_KEYS[0], BOX_KEYS[2]))
    xmin[0], xmax[0] = xmax[0], xmin[0]
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for e in examples:
            writer.write(e.SerializeToString(deterministic=True))


def edit_metadata(output: pathlib.Path, edit) -> None:
    path = output / "metadata.json"
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))


DAMAGES = {
    "box xmin > xmax": (swap_first_box_sides, "boxes in [0, 1] with xmin <= xmax"),
    "split object count": (lambda out: edit_metadata(out, lambda m: m["splits"]["train"]["label_counts"].update(
        disc=m["splits"]["train"]["label_counts"]["disc"] + 1)), "train: object counts"),
    "objects written": (lambda out: edit_metadata(out, lambda m: m["objects"]["written"].update(triangle=5)),
                        "written = objects in the splits"),
    "objects dropped": (lambda out: edit_metadata(out, lambda m: m["objects"]["dropped"].update(EmptyBox=1)),
                        "dropped = object dead-letter rows"),
    "label_map.pbtxt edited": (lambda out: (out / "label_map.pbtxt").write_text('item {\n  id: 1\n  name: "x"\n}\n'),
                               "label_map.pbtxt and label_map.csv agree with label_map"),
    "label_map.csv deleted": (lambda out: (out / "label_map.csv").unlink(),
                              "label_map.pbtxt and label_map.csv agree with label_map"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_verify_fails_on_a_damaged_detection_dataset_naming_the_check(copy, tmp_path, capsys, damage):
    make, check = DAMAGES[damage]
    make(copy)
    done = verify_here(capsys, copy, "--samples", "0", "--out", str(tmp_path / "pngs"))
    assert done.returncode == 1, done.stdout + done.stderr
    summary = done.stdout.split("checks failed:", 1)[1]
    assert check in summary, done.stdout


def test_load_dataset_gives_boxes_and_classes_per_image_ragged_when_batched(converted):
    import tensorflow as tf

    import imgrec

    expected = {}  # source id → (boxes as ymin, xmin, ymax, xmax; classes), parsed apart by TensorFlow
    for record in records(converted):
        xmin, ymin, xmax, ymax = (record[key] for key in BOX_KEYS)
        expected[record["image/source_id"]] = (np.stack([ymin, xmin, ymax, xmax], axis=-1).reshape(-1, 4),
                                               record["image/object/class/label"], record["image/height"])
    train = imgrec.load_dataset(str(converted), "train", batch_size=None, with_metadata=True)
    seen = []
    for image, target, extras in train:
        boxes, classes, height = expected[extras["source_id"].numpy()]
        assert target["boxes"].dtype == tf.float32 and target["classes"].dtype == tf.int64
        np.testing.assert_array_equal(target["boxes"].numpy(), boxes)
        np.testing.assert_array_equal(target["classes"].numpy(), classes)
        assert image.shape[0] == height
        seen.append(len(classes))
    assert sorted(seen) == [0, 2, 2]  # the image without objects is there, with [0, 4] boxes

    images, target = next(iter(imgrec.load_dataset(str(converted), "train", batch_size=3)))
    assert isinstance(target["boxes"], tf.RaggedTensor) and target["boxes"].shape.as_list() == [3, None, 4]
    assert sorted(target["classes"].row_lengths().numpy().tolist()) == [0, 2, 2]
    assert isinstance(images, tf.RaggedTensor)  # the images keep their own sizes (resize_mode none)
    padded = target["boxes"].to_tensor(default_value=-1)
    assert padded.shape == (3, 2, 4) and (padded.numpy() == -1).sum() == 8
