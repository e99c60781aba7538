"""Resize an RGB image to the configured size: stretch, center crop or letterbox pad.

`resize_plan` decides where every pixel goes and `resize_image` carries the plan out, so boxes
and masks (transforms/images/geometry.py) move exactly as the pixels do.
"""
from __future__ import annotations

import dataclasses

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

# Fixed, not max_decoded_bytes: that limit only decides which images are accepted, so the bytes
# of an accepted image (and records reused across runs, transforms/specs.py:pixel_settings)
# must not depend on it. The same as its default, so default runs keep their bytes.
_MAX_SCALED_BYTES = 2**30


@dataclasses.dataclass(frozen=True)
class ResizePlan:
    """The source window `crop` (left, top, width, height) is resized to `scaled` (width,
    height), which lands at `offset` (x, y) in the `size` (width, height) output: a negative
    offset crops the scaled image, a positive one pads it."""

    crop: tuple[int, int, int, int]
    scaled: tuple[int, int]
    offset: tuple[int, int]
    size: tuple[int, int]


def resize_plan(in_w: int, in_h: int, spec: ImageSpec, bytes_per_pixel: int = 3) -> ResizePlan:
    """`stretch` ignores the aspect ratio (as the seed script did); `center_crop` scales the short
    side to fit and crops the middle; `pad` scales the long side to fit and letterboxes with
    `spec.pad_value`."""
    out_w, out_h = spec.width, spec.height
    whole = (0, 0, in_w, in_h)
    if spec.resize_mode == "stretch":
        return ResizePlan(whole, (out_w, out_h), (0, 0), (out_w, out_h))
    if spec.resize_mode == "center_crop":
        scale = max(out_w / in_w, out_h / in_h)
        scaled_w, scaled_h = max(out_w, round(in_w * scale)), max(out_h, round(in_h * scale))
        if scaled_w * scaled_h * bytes_per_pixel > _MAX_SCALED_BYTES:
            return _crop_then_resize(in_w, in_h, out_w, out_h, scale)
        offset = (-((scaled_w - out_w) // 2), -((scaled_h - out_h) // 2))
        return ResizePlan(whole, (scaled_w, scaled_h), offset, (out_w, out_h))
    scale = min(out_w / in_w, out_h / in_h)
    scaled_w, scaled_h = min(out_w, max(1, round(in_w * scale))), min(out_h, max(1, round(in_h * scale)))
    return ResizePlan(whole, (scaled_w, scaled_h), ((out_w - scaled_w) // 2, (out_h - scaled_h) // 2), (out_w, out_h))


def _crop_then_resize(in_w: int, in_h: int, out_w: int, out_h: int, scale: float) -> ResizePlan:
    """center_crop for a strip (1 x 10,000 pixels: scaled whole, 224 x 2,240,000): the middle of
    the source that the output shows, then resized. Beyond `_MAX_SCALED_BYTES` only, so every
    other image keeps its bytes; a tiny file must not cost a converter gigabytes."""
    crop_w, crop_h = min(in_w, max(1, round(out_w / scale))), min(in_h, max(1, round(out_h / scale)))
    crop = ((in_w - crop_w) // 2, (in_h - crop_h) // 2, crop_w, crop_h)
    return ResizePlan(crop, (out_w, out_h), (0, 0), (out_w, out_h))


def resize_image(image: np.ndarray, spec: ImageSpec) -> np.ndarray:
    """Returns a `spec.height x spec.width` image with the same channels and dtype."""
    in_h, in_w = image.shape[:2]
    plan = resize_plan(in_w, in_h, spec, image.nbytes // (in_h * in_w))
    left, top, crop_w, crop_h = plan.crop
    scaled = image[top:top + crop_h, left:left + crop_w]
    if (crop_w, crop_h) != plan.scaled:
        scaled = cv2.resize(scaled, plan.scaled, interpolation=_INTERPOLATION[spec.interpolation])
    (x, y), (out_w, out_h), (scaled_w, scaled_h) = plan.offset, plan.size, plan.scaled
    if spec.resize_mode == "pad":
        return cv2.copyMakeBorder(scaled, y, out_h - scaled_h - y, x, out_w - scaled_w - x,
                                  cv2.BORDER_CONSTANT, value=(spec.pad_value,) * 3)
    return np.ascontiguousarray(scaled[-y:-y + out_h, -x:-x + out_w])
