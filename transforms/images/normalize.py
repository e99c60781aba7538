"""Pixel normalization applied before raw encoding."""
from __future__ import annotations

import numpy as np

from transforms.specs import ImageSpec


def normalize_image(image: np.ndarray, spec: ImageSpec) -> np.ndarray:
    """uint8 RGB → the dtype the record stores.

    `unit` is `x.astype(float32) / 255`, bit-identical to the seed script; `mean_std` is
    `(x/255 - mean) / std` per channel, as torchvision/Keras ImageNet preprocessing does.
    """
    if spec.normalize == "none":
        return image
    unit = image.astype(np.float32) / 255.0
    if spec.normalize == "unit":
        return unit
    mean = np.asarray(spec.mean, dtype=np.float32)
    std = np.asarray(spec.std, dtype=np.float32)
    return (unit - mean) / std
