"""transforms.images.resize and transforms.images.normalize: the pixel steps between decode and encode."""
from __future__ import annotations

import cv2
import numpy as np
import pytest

from transforms.images.normalize import normalize_image
from transforms.images.resize import resize_image
from transforms.specs import ImageSpec

pytestmark = pytest.mark.unit

OUT_H, OUT_W = 64, 48
RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def thirds(height: int, width: int, dtype=np.uint8) -> np.ndarray:
    """An image whose first, middle and last thirds along its long side are red, green, blue."""
    img = np.zeros((height, width, 3), dtype)
    long_side = max(height, width)
    for i, color in enumerate((RED, GREEN, BLUE)):
        part = slice(i * long_side // 3, (i + 1) * long_side // 3)
        if width >= height:
            img[:, part] = color
        else:
            img[part, :] = color
    return img


# ----------------------------------------------------------------------------- resize

@pytest.mark.parametrize("in_shape", [(100, 300), (300, 100)], ids=["wide", "tall"])
@pytest.mark.parametrize("mode", ["stretch", "center_crop", "pad"])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_resize_shape_and_dtype(in_shape, mode, dtype):
    out = resize_image(thirds(*in_shape, dtype), ImageSpec(height=OUT_H, width=OUT_W, resize_mode=mode))
    assert out.shape == (OUT_H, OUT_W, 3)
    assert out.dtype == dtype


@pytest.mark.parametrize("in_shape", [(100, 300), (400, 100)], ids=["wide", "tall"])
def test_center_crop_keeps_the_middle(in_shape):
    # The crop keeps the middle 48/192 columns (wide) or 64/192 rows (tall): inside the green third.
    spec = ImageSpec(height=OUT_H, width=OUT_W, resize_mode="center_crop", interpolation="nearest")
    out = resize_image(thirds(*in_shape), spec)
    assert (out == GREEN).all()


@pytest.mark.parametrize("in_shape", [(1, 300000), (300000, 1), (2, 200001)], ids=["wide", "tall", "odd"])
def test_center_crop_of_a_strip_is_cropped_before_it_is_scaled(in_shape):
    """Scaled whole, a 1 x 300,000 strip would be 64 x 19,200,000 pixels (3.7 GB) before the crop.
    Past a fixed bound the middle is cropped first, whatever max_decoded_bytes says (a limit
    must not change an accepted image's bytes); the output still shows the middle."""
    import tracemalloc

    spec = ImageSpec(height=OUT_H, width=OUT_W, resize_mode="center_crop", interpolation="nearest")
    strip = thirds(*in_shape)
    tracemalloc.start()
    out = resize_image(strip, spec)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert out.shape == (OUT_H, OUT_W, 3) and (out == GREEN).all()
    assert peak < 2**20, peak


def test_center_crop_bytes_do_not_depend_on_max_decoded_bytes():
    """max_decoded_bytes only decides which images are accepted (it is not in pixel_settings, so
    records are reused across runs that differ in it): an accepted strip converts the same."""
    strip = (np.random.default_rng(3).random((2, 30000, 3)) * 255).astype(np.uint8)
    spec = ImageSpec(height=OUT_H, width=OUT_W, resize_mode="center_crop")
    tight = ImageSpec(height=OUT_H, width=OUT_W, resize_mode="center_crop", max_decoded_bytes=2**20)
    np.testing.assert_array_equal(resize_image(strip, tight), resize_image(strip, spec))


def test_center_crop_under_the_budget_keeps_its_bytes():
    """Cropping first only past the budget: every image below it converts as before."""
    img = (np.random.default_rng(2).random((90, 250, 3)) * 255).astype(np.uint8)
    spec = ImageSpec(height=OUT_H, width=OUT_W, resize_mode="center_crop", interpolation="cubic")
    scaled = cv2.resize(img, (178, OUT_H), interpolation=cv2.INTER_CUBIC)  # 250 * 64 / 90 = 177.8
    np.testing.assert_array_equal(resize_image(img, spec), scaled[:, 65:113])


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_pad_letterboxes_with_pad_value(dtype):
    # 100x300 (h x w) scales by 48/300 to 16x48, centered vertically in 64x48: rows 24..39.
    spec = ImageSpec(height=OUT_H, width=OUT_W, resize_mode="pad", pad_value=7, interpolation="nearest")
    out = resize_image(np.full((100, 300, 3), 200, dtype), spec)
    assert (out[:24] == 7).all() and (out[40:] == 7).all()
    assert (out[24:40] == 200).all()


def test_pad_tall_image_is_centered_horizontally():
    # 300x100 scales by 64/300 to 64x21 (rounded), centered in 48 columns: 13 left, 14 right.
    spec = ImageSpec(height=OUT_H, width=OUT_W, resize_mode="pad", pad_value=0, interpolation="nearest")
    out = resize_image(np.full((300, 100, 3), 255, np.uint8), spec)
    content = np.flatnonzero(out[OUT_H // 2, :, 0])
    assert (content[0], content[-1]) == (13, 33)
    assert (out[:, :13] == 0).all() and (out[:, 34:] == 0).all()


INTERPOLATIONS = {"nearest": cv2.INTER_NEAREST, "linear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA,
                  "cubic": cv2.INTER_CUBIC, "lanczos": cv2.INTER_LANCZOS4}


@pytest.mark.parametrize("interpolation", sorted(INTERPOLATIONS))
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_stretch_equals_opencv(dtype, interpolation):
    img = (np.random.default_rng(0).random((100, 300, 3)) * 255).astype(dtype)
    out = resize_image(img, ImageSpec(height=OUT_H, width=OUT_W, resize_mode="stretch", interpolation=interpolation))
    np.testing.assert_array_equal(out, cv2.resize(img, (OUT_W, OUT_H), interpolation=INTERPOLATIONS[interpolation]))


@pytest.mark.parametrize("mode", ["stretch", "center_crop", "pad"])
def test_an_image_of_the_output_size_is_left_as_is(mode):
    img = np.random.default_rng(1).integers(0, 256, (OUT_H, OUT_W, 3), dtype=np.uint8)
    np.testing.assert_array_equal(resize_image(img, ImageSpec(height=OUT_H, width=OUT_W, resize_mode=mode)), img)


# ----------------------------------------------------------------------------- normalize

def random_image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (5, 7, 3), dtype=np.uint8)


def test_normalize_none_returns_uint8_unchanged():
    img = random_image()
    out = normalize_image(img, ImageSpec(normalize="none"))
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, img)


def test_normalize_unit_is_bit_exact():
    img = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=2)
    out = normalize_image(img, ImageSpec(normalize="unit", encoding="raw"))
    assert out.dtype == np.float32
    assert out.tobytes() == (img.astype(np.float32) / 255.0).tobytes()
    assert out.min() == 0.0 and out.max() == 1.0


def test_normalize_mean_std_by_hand():
    spec = ImageSpec(normalize="mean_std", encoding="raw", mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 2.0))
    img = np.array([[[255, 0, 51]]], np.uint8)
    # ((255/255 - .5) / .5, (0 - .25) / .25, (51/255 - 0) / 2)
    np.testing.assert_allclose(normalize_image(img, spec), [[[1.0, -1.0, 0.1]]], rtol=1e-6)
    assert normalize_image(img, spec).dtype == np.float32
