"""Where a point of the stored image lands in the record's image: the map boxes and masks follow.

Annotations refer to the stored pixel grid, as COCO's and VOC's tools read it (they ignore
EXIF). Points are continuous coordinates with pixel edges at integers: a box [x0, x1) covers
pixels x0 .. x1 - 1 and the image spans [0, width]. On the way to the record the pixels are
turned upright by the EXIF orientation (transforms/images/decode.py apply_orientation), maybe decoded
at 1/2, 1/4 or 1/8 size (JPEG DCT scaling), then resized as `resize_plan` says
(transforms/images/resize.py). Each step is a flip or quarter turn, or a per-axis scale and shift, so
the whole map is one axis-aligned affine map after the turn, and a box stays a box.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from transforms.images.resize import resize_plan
from transforms.specs import ImageSpec


class GeometryError(ValueError):
    """The decoded image is not the stored one turned and reduced: the annotations cannot be placed."""


def turn_points(xy: np.ndarray, orientation: int, width: int, height: int) -> np.ndarray:
    """(N, 2) points of a `width x height` stored grid → where `apply_orientation` puts them."""
    x, y = xy[:, 0], xy[:, 1]
    turned = {2: (width - x, y), 3: (width - x, height - y), 4: (x, height - y), 5: (y, x),
              6: (height - y, x), 7: (height - y, width - x), 8: (y, width - x)}.get(orientation, (x, y))
    return np.stack(turned, axis=1).astype(np.float64)


def upright_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    """Orientations 5-8 turn the image a quarter: width and height trade places."""
    return (height, width) if orientation in (5, 6, 7, 8) else (width, height)


def reduction(upright: tuple[int, int], decoded: tuple[int, int]) -> int:
    """The DCT scaling factor that made `decoded` from `upright` (libjpeg rounds sizes up)."""
    for factor in (1, 2, 4, 8):  # JPEG DCT scaling's (transforms/images/decode.py jpeg_scale)
        if all(-(-side // factor) == got for side, got in zip(upright, decoded)):
            return factor
    raise GeometryError(f"decoded size {decoded[0]}x{decoded[1]} is not the upright size {upright[0]}x{upright[1]} "
                        "at 1, 1/2, 1/4 or 1/8")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Stored-grid points → output points: turned by `orientation`, then x * scale + offset per axis."""

    orientation: int
    stored: tuple[int, int]  # width, height of the stored grid
    scale: tuple[float, float]
    offset: tuple[float, float]
    size: tuple[int, int]  # width, height of the output image

    def points(self, xy: np.ndarray) -> np.ndarray:
        turned = turn_points(np.asarray(xy, np.float64).reshape(-1, 2), self.orientation, *self.stored)
        return turned * np.asarray(self.scale) + np.asarray(self.offset)

    def matrix(self) -> np.ndarray:
        """The whole map as a 2x3 affine matrix, in the same continuous coordinates."""
        origin, ex, ey = self.points(np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
        return np.stack([ex - origin, ey - origin, origin], axis=1)

    @property
    def area_scale(self) -> float:
        """How much an area grows: the turn keeps areas, the scales multiply them."""
        return abs(self.scale[0] * self.scale[1])


def placement(stored: tuple[int, int], orientation: int, decoded: tuple[int, int],
              spec: Optional[ImageSpec]) -> Placement:
    """The map for an image stored as `stored` (width, height), turned by `orientation`, decoded
    as `decoded` (width, height, upright), then resized by `spec`; `spec=None` or resize mode
    `none` keeps the decoded size."""
    factor = reduction(upright_size(*stored, orientation), decoded)
    if spec is None or not spec.resizes:
        return Placement(orientation, stored, (1 / factor, 1 / factor), (0.0, 0.0), decoded)
    plan = resize_plan(*decoded, spec)
    left, top, crop_w, crop_h = plan.crop
    sx, sy = plan.scaled[0] / crop_w, plan.scaled[1] / crop_h
    return Placement(orientation, stored, (sx / factor, sy / factor),
                     (plan.offset[0] - left * sx, plan.offset[1] - top * sy), plan.size)
