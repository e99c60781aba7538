"""COCO instance masks end to end (#41): `--masks` writes a PNG per object, `load_dataset` returns
them as uint8 [N, height, width], each where pycocotools puts the object after the resize mode,
and `imgrec verify` fails a record whose masks do not pair up with its boxes."""
from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest

from tests.helpers import run_pipeline, verify_here
from tests.test_detection_pipeline import DETECTION

pytestmark = pytest.mark.e2e

COCO_FILE = DETECTION / "coco" / "instances.json"
MASK_KEY = "image/object/mask"


def upright_polygon(points: np.ndarray, orientation: int, stored: tuple[int, int]) -> np.ndarray:
    """(N, 2) stored-grid points where an image turned upright by its EXIF orientation puts them
    (the sample uses 1 and 6: a quarter turn clockwise)."""
    if orientation == 1:
        return points
    assert orientation == 6, orientation
    _, height = stored
    return np.stack([height - points[:, 1], points[:, 0]], axis=1)


def expected_masks(image: dict, annotations: list[dict], output: tuple[int, int]) -> list[np.ndarray]:
    """pycocotools' masks of an image's annotations on a `width x height` output that stretches the
    upright image: polygons are turned and scaled, then rasterised by pycocotools at the output
    size; an RLE is decoded by pycocotools and resized to it (nearest, by pixel centres)."""
    import cv2
    from pycocotools import mask as coco_mask

    orientation = 6 if "exif6" in image["file_name"] else 1
    stored = image["width"], image["height"]
    upright = stored if orientation == 1 else stored[::-1]
    width, height = output
    scale = np.array([width / upright[0], height / upright[1]])
    masks = []
    for annotation in annotations:
        segmentation = annotation["segmentation"]
        if isinstance(segmentation, list):
            parts = [(upright_polygon(np.reshape(part, (-1, 2)), orientation, stored) * scale).ravel().tolist()
                     for part in segmentation]
            mask = coco_mask.decode(coco_mask.merge(coco_mask.frPyObjects(parts, height, width)))
        else:
            assert orientation == 1
            stored_mask = coco_mask.decode({**segmentation, "counts": segmentation["counts"].encode("ascii")})
            mask = cv2.resize(stored_mask, (width, height), interpolation=cv2.INTER_NEAREST_EXACT)
        masks.append(mask.astype(np.uint8))
    return masks


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.logical_and(a, b).sum() / np.logical_or(a, b).sum())


def check_masks_against_pycocotools(output: pathlib.Path, size_of) -> int:
    """Every object's mask load_dataset gives vs pycocotools'; returns how many were compared."""
    import imgrec

    coco = json.loads(COCO_FILE.read_text())
    images = {str(image["id"]): image for image in coco["images"]}
    compared = 0
    for split in json.loads((output / "metadata.json").read_text())["splits"]:
        for pixels, target, extras in imgrec.load_dataset(str(output), split, batch_size=None, with_metadata=True):
            image = images[extras["source_id"].numpy().decode()]
            annotations = [a for a in coco["annotations"] if a["image_id"] == image["id"]]
            masks, classes = target["masks"].numpy(), target["classes"].numpy()
            height, width = pixels.shape[:2]
            assert masks.dtype == np.uint8 and masks.shape == (len(annotations), height, width)
            assert set(np.unique(masks)) <= {0, 1}
            assert (width, height) == size_of(image)
            expected = expected_masks(image, annotations, (width, height))
            # The records keep the file's annotation order within an image.
            assert classes.tolist() == [a["category_id"] for a in annotations]
            for found, wanted, annotation in zip(masks, expected, annotations):
                assert iou(found, wanted) > 0.9, (image["file_name"], annotation["id"], iou(found, wanted))
                compared += 1
    return compared


def test_masks_read_back_where_pycocotools_puts_them_at_the_original_size(tmp_path):
    run_pipeline(COCO_FILE, tmp_path / "out", "--masks", "--encoding=png")
    upright = {True: lambda im: (im["height"], im["width"]), False: lambda im: (im["width"], im["height"])}
    compared = check_masks_against_pycocotools(tmp_path / "out", lambda im: upright["exif6" in im["file_name"]](im))
    assert compared == 6  # every annotation of the sample, the EXIF-turned image's and the crowd RLE's


def test_masks_are_stretched_with_the_pixels_and_batch_ragged(tmp_path):
    import tensorflow as tf

    import imgrec

    run_pipeline(COCO_FILE, tmp_path / "out", "--masks", "--encoding=png", "--resize_mode=stretch",
                 "--height=128", "--width=192", "--split_ratios=1,0,0")
    assert check_masks_against_pycocotools(tmp_path / "out", lambda im: (192, 128)) == 6
    _, target = next(iter(imgrec.load_dataset(str(tmp_path / "out"), "train", batch_size=4)))
    assert isinstance(target["masks"], tf.RaggedTensor)
    assert sorted(target["masks"].row_lengths().numpy().tolist()) == [0, 2, 2, 2]
    assert target["masks"].shape.as_list()[:1] == [4]


def edit_first_masks(output: pathlib.Path, edit) -> None:
    """Rewrites the first record holding an object with `edit` applied to its list of mask PNGs."""
    import tensorflow as tf

    shard = next(p for p in sorted(output.glob("*.tfrecord")) if p.stat().st_size)
    examples = [tf.train.Example.FromString(raw.numpy()) for raw in tf.data.TFRecordDataset(str(shard))]
    example = next(e for e in examples if e.features.feature[MASK_KEY].bytes_list.value)
    edit(example.features.feature[MASK_KEY].bytes_list.value)
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for e in examples:
            writer.write(e.SerializeToString(deterministic=True))


def failed_checks(capsys, output: pathlib.Path, tmp_path: pathlib.Path) -> str:
    done = verify_here(capsys, output, "--samples", "0", "--out", str(tmp_path / f"pngs-{output.name}"))
    assert done.returncode == 1, done.stdout + done.stderr
    return done.stdout.split("checks failed:", 1)[1]


def test_verify_checks_one_mask_per_box_and_decodes_each(tmp_path, capsys):
    run_pipeline(COCO_FILE, tmp_path / "out", "--masks", "--split_ratios=1,0,0")
    assert MASK_KEY in json.loads((tmp_path / "out" / "metadata.json").read_text())["features"]
    done = verify_here(capsys, tmp_path / "out", "--samples", "0", "--out", str(tmp_path / "pngs"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "train: 6 instance masks decode to one channel at their image's size" in done.stdout
    dropped = pathlib.Path(shutil.copytree(tmp_path / "out", tmp_path / "dropped"))
    edit_first_masks(dropped, lambda masks: masks.__delitem__(0))
    assert "train: per-object lists have one value per object" in failed_checks(capsys, dropped, tmp_path)

    def damage(masks) -> None:
        masks[0] = masks[0][:-12]  # cut short: no IEND chunk

    damaged = pathlib.Path(shutil.copytree(tmp_path / "out", tmp_path / "damaged"))
    edit_first_masks(damaged, damage)
    failed = failed_checks(capsys, damaged, tmp_path)
    assert "train: 6 instance masks decode to one channel at their image's size: 1 do not: train-00000-of-00001" \
           ".tfrecord record " in failed and " mask 1 does not decode (Invalid PNG data, size " in failed
