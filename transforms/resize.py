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
        scaled = _resize(image, scaled_w, scaled_h, interpolation)
        top, left = (scaled_h - out_h) // 2, (scaled_w - out_w) // 2
        return np.ascontiguousarray(scaled[top:top + out_h, left:left + out_w])
    scale = min(out_w / in_w, out_h / in_h)
    scaled_w, scaled_h = min(out_w, max(1, round(in_w * scale))), min(out_h, max(1, round(in_h * scale)))
    scaled = _resize(image, scaled_w, scaled_h, interpolation)
    top, left = (out_h - scaled_h) // 2, (out_w - scaled_w) // 2
    return cv2.copyMakeBorder(scaled, top, out_h - scaled_h - top, left, out_w - scaled_w - left,
                              cv2.BORDER_CONSTANT, value=(spec.pad_value,) * 3)


def _resize(image: np.ndarray, width: int, height: int, interpolation: int) -> np.ndarray:
    if image.shape[0] == height and image.shape[1] == width:
        return image
    return cv2.resize(image, (width, height), interpolation=interpolation)
