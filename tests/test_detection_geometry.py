"""Boxes and masks move with the pixels: images with a drawn object go through the real decode
(EXIF orientation, JPEG reduction) and resize; the object's pixels found in the output are
compared with where transforms/images/geometry.py, boxes.py and masks.py put its box and mask."""
from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as coco_mask

from transforms.images.boxes import crop_problem, place_boxes
from transforms.images.decode import decode_image, decoded_size
from transforms.images.geometry import GeometryError, placement, reduction
from transforms.images.image_header import check_header
from transforms.images.masks import segmentation_mask
from transforms.images.resize import resize_image
from transforms.inputs.annotations import AnnotatedImage, ObjectAnnotation, Polygons, RunLengths, emptied_image
from transforms.specs import ImageSpec
from transforms.write.detection_example import place_objects

pytestmark = pytest.mark.unit

GREY, RED = (128, 128, 128), (230, 40, 40)
MODES = ("stretch", "center_crop", "pad", "none")


def drawn(width: int, height: int, box: tuple[int, int, int, int]) -> np.ndarray:
    """A grey RGB image with a red box over pixels x0..x1-1, y0..y1-1."""
    image = np.empty((height, width, 3), np.uint8)
    image[:] = GREY
    x0, y0, x1, y1 = box
    image[y0:y1, x0:x1] = RED
    return image


def encoded(rgb: np.ndarray, orientation: int, fmt: str = "PNG") -> bytes:
    """The pixels stored as given, with an EXIF orientation tag (PNG eXIf or JPEG APP1)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, fmt, exif=exif, **({"quality": 95} if fmt == "JPEG" else {}))
    return out.getvalue()


def found_mask(image: np.ndarray) -> np.ndarray:
    """Pixels at least half red (green below halfway between the red's and the grey's)."""
    return image[..., 1] < (RED[1] + GREY[1]) / 2


def found_box(mask: np.ndarray) -> np.ndarray:
    rows, cols = np.nonzero(mask)
    return np.array([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1], np.float64)


def converted(data: bytes, spec: ImageSpec, mode: str) -> tuple[np.ndarray, np.ndarray, object]:
    """(decoded upright image, output image, placement) as the pipeline would make them; the
    decoded size is the one the header alone predicts (what reusing a record relies on)."""
    header = check_header(data, spec)
    decoded = decode_image(data, header, spec)
    assert decoded_size(header, spec) == (decoded.shape[1], decoded.shape[0])
    resize = None if mode == "none" else spec
    out = decoded if resize is None else resize_image(decoded, spec)
    return decoded, out, resize


def spec_for(mode: str, **kw) -> ImageSpec:
    return ImageSpec(height=40, width=48, resize_mode="stretch" if mode == "none" else mode,
                     interpolation="linear", normalize="none", encoding="png", pad_value=GREY[0], **kw)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return (a & b).sum() / (a | b).sum()


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("mode", MODES)
def test_box_and_masks_follow_the_pixels(mode, orientation):
    stored_box = (13, 5, 37, 22)  # on a 60 x 36 stored grid, off centre so every turn differs
    data = encoded(drawn(60, 36, stored_box), orientation)
    spec = spec_for(mode)
    decoded, out, resize = converted(data, spec, mode)
    where = placement((60, 36), orientation, (decoded.shape[1], decoded.shape[0]), resize)
    assert where.size == (out.shape[1], out.shape[0])
    (placed,) = place_boxes(np.array([stored_box]), where)
    pixels = found_mask(out)
    np.testing.assert_allclose(placed.box, found_box(pixels), atol=1.0)
    x0, y0, x1, y1 = stored_box
    polygon = Polygons(((x0, y0, x1, y0, x1, y1, x0, y1),))
    rle = coco_mask.encode(np.asfortranarray(found_mask(drawn(60, 36, stored_box)).astype(np.uint8)))
    for segmentation in (polygon, RunLengths(rle["counts"].decode("ascii"), 36, 60)):
        assert iou(segmentation_mask(segmentation, where).astype(bool), pixels) > 0.9


def test_center_crop_clips_boxes_and_drops_those_mostly_cut_off():
    # 120 x 40 → 40 x 40: the middle third is kept.
    boxes = np.array([(45, 5, 75, 30), (30, 5, 50, 30), (2, 5, 30, 30), (36, 5, 46, 30)], np.float64)
    image = drawn(120, 40, (0, 0, 0, 0))
    for box in boxes.astype(int):
        image[box[1]:box[3], box[0]:box[2]] = RED
    spec = ImageSpec(height=40, width=40, resize_mode="center_crop", interpolation="linear", normalize="none",
                     encoding="png")
    decoded, out, resize = converted(encoded(image, 1), spec, "center_crop")
    where = placement((120, 40), 1, (120, 40), resize)
    placed = place_boxes(boxes, where)
    assert [round(p.visible, 2) for p in placed] == [1.0, 0.5, 0.0, 0.6]
    assert [crop_problem(p, 0.5) is None for p in placed] == [True, True, False, True]
    assert crop_problem(placed[3], 0.7) is not None
    almost_half = dataclasses.replace(placed[1], visible=0.4996)
    assert "leaves 49.9% of its box in the image, less than min_visible=0.5" in str(crop_problem(almost_half, 0.5))
    pixels = found_mask(out)
    np.testing.assert_allclose(placed[1].box, found_box(pixels[:, :11]), atol=1.0)  # clipped at the left edge


def test_an_image_the_crop_leaves_no_objects_is_skipped_unless_empty_images_are_kept():
    """Both objects of a 120 x 40 image lie in the thirds a 40 x 40 center crop cuts off: with
    --no_keep_empty_images the image is skipped as one without annotations, each object keeping
    its own BoxCroppedAway row (which counts it)."""
    spec = ImageSpec(height=40, width=40, resize_mode="center_crop", interpolation="linear", encoding="png")
    decoded, _, resize = converted(encoded(drawn(120, 40, (2, 5, 30, 30)), 1), spec, "center_crop")
    where = placement((120, 40), 1, (decoded.shape[1], decoded.shape[0]), resize)
    objects = tuple(ObjectAnnotation(f"annotation {i}", box, 1, "cat") for i, box in
                    enumerate([(2.0, 5.0, 30.0, 30.0), (85.0, 5.0, 118.0, 30.0)], 1))
    image = AnnotatedImage("in/wide.png", "7", "wide.png", 120, 40, objects)
    placed, dropped = place_objects(image, where, 0.5, False)
    assert not placed and [(row.error, row.stage) for row in dropped] == [("BoxCroppedAway", "object")] * 2
    row = emptied_image(image, len(placed), dropped, keep_empty=False)
    assert (row.path, row.error, row.stage) == ("in/wide.png", "NoAnnotations", "annotation")
    assert row.message == ("image skipped: all 2 of its objects were cut off by the center crop "
                           "(--keep_empty_images=false; pass --keep_empty_images to write it as an image without "
                           "objects)")
    assert emptied_image(image, len(placed), dropped, keep_empty=True) is None  # written without objects
    assert emptied_image(image, 1, dropped[1:], keep_empty=False) is None  # an object left: written
    no_objects = AnnotatedImage("in/none.png", "8", "none.png", 120, 40, ())
    assert emptied_image(no_objects, 0, (), keep_empty=False) is None  # discovery skipped it already


def test_reduced_jpeg_decode_is_followed():
    """A JPEG large enough to be decoded at 1/8 (area interpolation), turned, sides not multiples of 8."""
    box = (601, 203, 1001, 603)
    data = encoded(drawn(1603, 1201, box), 6, "JPEG")
    spec = ImageSpec(height=64, width=64, resize_mode="pad", interpolation="area", normalize="none", encoding="png",
                     pad_value=GREY[0])
    decoded, out, resize = converted(data, spec, "pad")
    assert decoded.shape[:2] == (201, 151)  # upright 1201 x 1603 at 1/8, rounded up
    where = placement((1603, 1201), 6, (151, 201), resize)
    (placed,) = place_boxes(np.array([box]), where)
    np.testing.assert_allclose(placed.box, found_box(found_mask(out)), atol=1.0)


def test_center_crop_of_a_strip_crops_before_resizing():
    """8 x 200,000 to 224 x 224 scaled whole would be 1.25 G pixels: the source's middle is cut first."""
    box = (99997, 2, 100002, 6)
    data = encoded(drawn(200_000, 8, box), 1)
    spec = ImageSpec(height=224, width=224, resize_mode="center_crop", interpolation="linear", normalize="none",
                     encoding="png")
    decoded, out, resize = converted(data, spec, "center_crop")
    where = placement((200_000, 8), 1, (200_000, 8), resize)
    (placed,) = place_boxes(np.array([box]), where)
    assert placed.box == (28.0, 56.0, 168.0, 168.0)
    np.testing.assert_allclose(placed.box, found_box(found_mask(out)), atol=1.0)


def test_a_decoded_size_that_does_not_fit_is_refused():
    assert reduction((1603, 1201), (201, 151)) == 8
    with pytest.raises(GeometryError, match="decoded size 100x100"):
        placement((60, 36), 1, (100, 100), None)
