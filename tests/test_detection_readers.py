"""An independent reader accepts imgrec's detection records (make test-detection-readers):
Model Garden's TfExampleDecoder, in a venv of its own (tf-models-official pins its own
TensorFlow), decodes records built from data/detection/coco by imgrec's functions to the boxes,
classes, crowd flags, areas and masks pycocotools reads from the annotation file.

Until the pipeline writes these records, they are built here the way it will: decode, place,
resize, encode as PNG, `detection_record`. MODELGARDEN_PYTHON names the other venv's python.
"""
from __future__ import annotations

import os
import subprocess

import cv2
import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO

from tests.helpers import REPO
from transforms import files
from transforms.images.decode import decode_image
from transforms.images.geometry import placement
from transforms.images.image_header import read_header
from transforms.images.resize import resize_image
from transforms.inputs.coco import annotated_images
from transforms.inputs.label_map_files import CSV_FILE, label_map_csv
from transforms.specs import ImageSpec
from transforms.write import tfrecord
from transforms.write.detection_example import detection_record, place_objects
from transforms.write.example import encode_pixels

pytestmark = pytest.mark.modelgarden

INSTANCES = REPO / "data" / "detection" / "coco" / "instances.json"
SPEC = ImageSpec(height=48, width=64, resize_mode="pad", interpolation="linear", normalize="none", encoding="png")


def modelgarden_python() -> str:
    python = os.environ.get("MODELGARDEN_PYTHON")
    if not python or not os.path.exists(python):
        pytest.fail("MODELGARDEN_PYTHON must name the Model Garden venv's python: run `make test-detection-readers`")
    return python


def write_records(path, resize: ImageSpec | None) -> list:
    """The sample's records, as the pipeline will write them; returns the images, in order."""
    label_map, images, rejections = annotated_images(str(INSTANCES), with_masks=True)
    assert rejections == []
    with open(path, "wb") as handle:
        for image in images:
            data = files.read_bytes(image.path)
            decoded = decode_image(data, read_header(data), SPEC)
            orientation = Image.open(image.path).getexif().get(0x0112, 1)
            where = placement((image.width, image.height), orientation, (decoded.shape[1], decoded.shape[0]), resize)
            objects, dropped = place_objects(image, where, 0.5, with_masks=True)
            assert dropped == ()
            pixels = decoded if resize is None else resize_image(decoded, resize)
            record = detection_record(encode_pixels(pixels, SPEC), "png", where.size, image, objects, with_masks=True)
            tfrecord.write_record(handle, record.data)
    (path.parent / CSV_FILE).write_text(label_map_csv(label_map))
    return images


def decoded_by_modelgarden(tmp_path, resize: ImageSpec | None) -> tuple[list, dict]:
    records = tmp_path / "records.tfrecord"
    images = write_records(records, resize)
    out = tmp_path / "decoded.npz"
    subprocess.run([modelgarden_python(), str(REPO / "tests" / "modelgarden_decode.py"), str(records),
                    str(tmp_path / CSV_FILE), str(out)], check=True, timeout=600)
    return images, dict(np.load(out))


def turned(mask: np.ndarray, bbox: list[float], orientation: int) -> tuple[np.ndarray, list[float]]:
    """pycocotools' mask and box of a stored image, turned upright (orientation 6: a quarter turn
    clockwise), computed here independently of imgrec's geometry."""
    if orientation == 1:
        return mask, bbox
    assert orientation == 6
    x, y, w, h = bbox
    return np.rot90(mask, k=-1), [mask.shape[0] - (y + h), x, h, w]


def assert_same_mask(ours: np.ndarray, reference: np.ndarray, crowd: bool) -> None:
    """RLEs decode exactly; polygons differ at most on the outline (pycocotools samples the
    boundary at 1/5 pixel, imgrec takes pixel centres)."""
    differ = ours.astype(bool) ^ reference.astype(bool)
    if crowd:
        assert not differ.any()
    outline = cv2.dilate(reference, np.ones((3, 3))) != cv2.erode(reference, np.ones((3, 3)))
    assert not (differ & ~outline).any() and differ.sum() <= 0.1 * outline.sum()


def test_modelgarden_decodes_what_pycocotools_reads(tmp_path):
    images, got = decoded_by_modelgarden(tmp_path, None)
    coco = COCO(str(INSTANCES))
    for i, image in enumerate(images):
        info = coco.loadImgs(int(image.source_id))[0]
        annotations = coco.loadAnns(coco.getAnnIds(imgIds=info["id"]))
        orientation = Image.open(image.path).getexif().get(0x0112, 1)
        height, width = got[f"{i}/height"], got[f"{i}/width"]
        assert got[f"{i}/source_id"] == str(info["id"]).encode()
        assert got[f"{i}/image"].shape == (height, width, 3)
        assert list(got[f"{i}/groundtruth_classes"]) == [a["category_id"] for a in annotations]
        assert list(got[f"{i}/classes_by_name"]) == [a["category_id"] for a in annotations]
        assert list(got[f"{i}/groundtruth_is_crowd"]) == [bool(a["iscrowd"]) for a in annotations]
        np.testing.assert_allclose(got[f"{i}/groundtruth_area"], [a["area"] for a in annotations])
        masks = got[f"{i}/groundtruth_instance_masks"]
        assert masks.shape == (len(annotations), height, width) and set(np.unique(masks)) <= {0.0, 1.0}
        for j, annotation in enumerate(annotations):
            mask, (x, y, w, h) = turned(coco.annToMask(annotation), annotation["bbox"], orientation)
            assert mask.shape == (height, width)
            np.testing.assert_allclose(got[f"{i}/groundtruth_boxes"][j],
                                       [y / height, x / width, (y + h) / height, (x + w) / width], rtol=1e-6)
            assert_same_mask(masks[j], mask, bool(annotation["iscrowd"]))


def test_modelgarden_decodes_resized_records_to_the_objects_pixels(tmp_path):
    """Letterboxed to 64 x 48: each decoded box holds its object's coloured pixels in the decoded image."""
    images, got = decoded_by_modelgarden(tmp_path, SPEC)
    assert len(images) == 4
    for i in range(len(images)):
        picture, boxes = got[f"{i}/image"].astype(int), got[f"{i}/groundtruth_boxes"]
        assert picture.shape == (48, 64, 3)
        coloured = np.abs(picture - 128).max(axis=2) > 40
        for box, mask in zip(boxes, got[f"{i}/groundtruth_instance_masks"]):
            rows, cols = np.nonzero(mask)
            ymin, xmin, ymax, xmax = box * [48, 64, 48, 64]
            assert rows.min() >= ymin - 1 and rows.max() < ymax + 1 and cols.min() >= xmin - 1 and cols.max() < xmax + 1
            assert coloured[mask > 0].mean() > 0.8
