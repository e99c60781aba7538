"""Resize an RGB image to the configured size: stretch, center crop or letterbox pad."""
from __future__ import annotations

import cv2
import numpy as np

from transforms.specs import ImageSpec

_INTERPOLATION = {
    "nearest": cv2.INTER_NEAREST,
    "linear": cv2.INTER_LINEAR,
    "area": cv2.INTER_AREA,
    "cubic": cv2.INTER_CUBIC,
    "lanczos": cv2.INTER_LANCZOS4,
}


def resize_image(image: np.ndarray, spec: ImageSpec) -> np.ndarray:
    """Returns a `spec.height x spec.width` image with the same channels and dtype.

    `stretch` ignores the aspect ratio (as the seed script did); `center_crop` scales the short
    side to fit and crops the middle; `pad` scales the long side to fit and letterboxes with
    `spec.pad_value`.
    """
    out_h, out_w = spec.height, spec.width
    in_h, in_w = image.shape[:2]
    interpolation = _INTERPOLATION[spec.interpolation]
    if spec.resize_mode == "stretch":
        return _resize(image, out_w, out_h, interpolation)
    if spec.resize_mode == "center_crop":
        scale = max(out_w / in_w, out_h / in_h)
        scaled_w, scaled_h = max(out_w, round(in_w * scale)), max(out_h, round(in_h * scale))
        if scaled_w * scaled_h * (image.nbytes // (in_h * in_w)) > _MAX_SCALED_BYTES:
            return _crop_then_resize(image, out_w, out_h, scale, interpolation)
        scaled = _resize(image, scaled_w, scaled_h, interpolation)
        top, left = (scaled_h - out_h) // 2, (scaled_w - out_w) // 2
        return np.ascontiguousarray(scaled[top:top + out_h, left:left + out_w])
    scale = min(out_w / in_w, out_h / in_h)
    scaled_w, scaled_h = min(out_w, max(1, round(in_w * scale))), min(out_h, max(1, round(in_h * scale)))
    scaled = _resize(image, scaled_w, scaled_h, interpolation)
    top, left = (out_h - scaled_h) // 2, (out_w - scaled_w) // 2
    return cv2.copyMakeBorder(scaled, top, out_h - scaled_h - top, left, out_w - scaled_w - left,
                              cv2.BORDER_CONSTANT, value=(spec.pad_value,) * 3)


# Fixed, not max_decoded_bytes: that limit only decides which images are accepted, so the bytes
# of an accepted image (and records reused across runs, transforms/specs.py:pixel_settings)
# must not depend on it. The same as its default, so default runs keep their bytes.
_MAX_SCALED_BYTES = 2**30


def _crop_then_resize(image: np.ndarray, out_w: int, out_h: int, scale: float, interpolation: int) -> np.ndarray:
    """center_crop for a strip (1 x 10,000 pixels: scaled whole, 224 x 2,240,000): the middle of
    the source that the output shows, then resized. Beyond `_MAX_SCALED_BYTES` only, so every
    other image keeps its bytes; a tiny file must not cost a converter gigabytes."""
    in_h, in_w = image.shape[:2]
    crop_w, crop_h = min(in_w, max(1, round(out_w / scale))), min(in_h, max(1, round(out_h / scale)))
    top, left = (in_h - crop_h) // 2, (in_w - crop_w) // 2
    return _resize(image[top:top + crop_h, left:left + crop_w], out_w, out_h, interpolation)


def _resize(image: np.ndarray, width: int, height: int, interpolation: int) -> np.ndarray:
    if image.shape[0] == height and image.shape[1] == width:
        return image
    return cv2.resize(image, (width, height), interpolation=interpolation)
