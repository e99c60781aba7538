"""Boxes moved with the pixels: placed by the image's `Placement`, clipped to the output, and
dropped when a center crop leaves too little of them.

A placed box is the box of its placed corners (the map keeps boxes axis-aligned). Stretch and
pad keep every box whole; center_crop cuts the edges off, so a box is clipped to the output and
dropped (`BoxCroppedAway`) when less than `min_visible` of its placed area is left (by default
half, what crop augmentations commonly keep: albumentations' min_visibility is often 0.5).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from transforms.images.geometry import Placement
from transforms.inputs.annotations import BoxCroppedAway


@dataclasses.dataclass(frozen=True)
class PlacedBox:
    """(x0, y0, x1, y1) in output pixels, clipped to the output; `visible`: the share of the
    placed box's area inside the output."""

    box: tuple[float, float, float, float]
    visible: float


def place_boxes(boxes: np.ndarray, where: Placement) -> list[PlacedBox]:
    """(N, 4) stored-grid boxes (x0, y0, x1, y1) → their placed, clipped boxes."""
    if not len(boxes):
        return []
    corners = where.points(np.asarray(boxes, np.float64).reshape(-1, 2)).reshape(-1, 2, 2)
    low, high = corners.min(axis=1), corners.max(axis=1)
    size = np.asarray(where.size, np.float64)
    clipped_low, clipped_high = np.clip(low, 0, size), np.clip(high, 0, size)
    area = np.prod(high - low, axis=1)
    inside = np.prod(clipped_high - clipped_low, axis=1)
    visible = np.divide(inside, area, out=np.zeros_like(area), where=area > 0)
    return [PlacedBox((float(a[0]), float(a[1]), float(b[0]), float(b[1])), float(v))
            for a, b, v in zip(clipped_low, clipped_high, visible)]


def crop_problem(placed: PlacedBox, min_visible: float) -> BoxCroppedAway | None:
    """Why a placed box is dropped, or None: nothing of it left, or less than `min_visible`."""
    if placed.visible > 0 and placed.visible >= min_visible:
        return None
    shown = math.floor(placed.visible * 1000) / 10  # rounded down: 49.96% is never shown as 50%
    return BoxCroppedAway(f"the crop leaves {shown:g}% of its box in the image, less than "
                          f"min_visible={min_visible:g}")


def normalized(box: tuple[float, float, float, float], size: tuple[int, int]) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) pixels → (xmin, ymin, xmax, ymax) as fractions of the output's width and height."""
    width, height = size
    x0, y0, x1, y1 = box
    return x0 / width, y0 / height, x1 / width, y1 / height
