"""Instance masks from COCO segmentations, placed as the pixels are, encoded as PNG.

A pixel belongs to a polygon when its centre lies inside it (even-odd rule per part, parts
joined), which is pycocotools' rule up to its 1/5-pixel boundary sampling. Polygons are placed
vertex by vertex and drawn at the output size, so no mask the size of a large source image is
ever made for them. RLE masks are decoded on the stored grid (COCO's column-major runs,
compressed strings included) and resampled through the same map: an output pixel is in the
mask when its centre, mapped back, is (bilinear weight at least a half). Masks are stored as
single-channel PNGs of 0 and 1, as Model Garden's create_coco_tf_record.py writes them.
"""
from __future__ import annotations

from typing import Optional

import cv2
import numpy as np

from transforms.images.geometry import Placement
from transforms.inputs.annotations import BadSegmentation, Polygons, RunLengths, Segmentation, finite_number


def polygons_mask(polygons: Polygons, where: Placement) -> np.ndarray:
    """The placed polygons drawn at the output size: HxW uint8, 1 inside."""
    width, height = where.size
    mask = np.zeros((height, width), np.uint8)
    for part in polygons.parts:
        if len(part) < 6 or len(part) % 2 or not all(finite_number(v) for v in part):
            raise BadSegmentation(f"a polygon needs at least 3 (x, y) points of finite numbers; got {len(part)} values")
        with np.errstate(over="ignore"):  # an overflow is refused just below
            points = where.points(np.asarray(part, np.float64).reshape(-1, 2))
        if not np.abs(points).max() <= 2.0**53:  # no image is that large; past ~1e307 the crossings overflow
            raise BadSegmentation("a polygon point lies more than 2^53 pixels from the image, past any image")
        mask |= _inside(points, width, height)
    return mask


def _inside(xy: np.ndarray, width: int, height: int) -> np.ndarray:
    """Pixels whose centre is inside the polygon `xy` (even-odd): every edge toggles, on each
    row whose centre line it crosses, the pixels right of the crossing; a running parity fills."""
    x0, y0 = xy[:, 0], xy[:, 1]
    x1, y1 = np.roll(x0, -1), np.roll(y0, -1)
    first = np.clip(np.ceil(np.minimum(y0, y1) - 0.5), 0, height).astype(np.int64)
    last = np.clip(np.ceil(np.maximum(y0, y1) - 0.5), 0, height).astype(np.int64)
    rows_per_edge = np.maximum(last - first, 0)  # horizontal edges cross no centre line
    edge = np.repeat(np.arange(len(xy)), rows_per_edge)
    starts = np.repeat(np.cumsum(rows_per_edge) - rows_per_edge, rows_per_edge)
    rows = first[edge] + np.arange(len(edge)) - starts
    t = (rows + 0.5 - y0[edge]) / (y1[edge] - y0[edge])
    crossing = x0[edge] + t * (x1[edge] - x0[edge])
    columns = np.clip(np.ceil(crossing - 0.5), 0, width).astype(np.int64)
    toggles = np.zeros((height, width + 1), np.uint8)
    np.add.at(toggles, (rows, columns), 1)  # wraps at 256, which keeps the parity
    return np.cumsum(toggles, axis=1, dtype=np.uint8)[:, :width] & 1


def rle_counts(counts: str) -> list[int]:
    """COCO's compressed RLE string → run lengths (pycocotools' rleFrString): 5 bits per
    character from '0', a continuation bit, sign-extended, each run after the second stored as
    the difference from the run two before."""
    runs: list[int] = []
    value, shift = 0, 0
    for char in counts:
        code = ord(char) - 48
        if not 0 <= code < 64:
            raise BadSegmentation(f"compressed RLE counts hold {char!r}, not a count character")
        value |= (code & 0x1F) << shift
        shift += 5
        if code & 0x20:  # the number goes on
            continue
        if code & 0x10:
            value |= -1 << shift
        runs.append(value + runs[-2] if len(runs) > 2 else value)
        value, shift = 0, 0
    if shift:
        raise BadSegmentation("compressed RLE counts end in the middle of a number")
    return runs


def rle_mask(rle: RunLengths) -> np.ndarray:
    """A COCO RLE → its `height x width` uint8 mask on the stored grid."""
    runs = rle_counts(rle.counts) if isinstance(rle.counts, str) else list(rle.counts)
    if any(run < 0 for run in runs) or sum(runs) != rle.height * rle.width:
        raise BadSegmentation(f"RLE runs must be non-negative and cover the {rle.width}x{rle.height} grid exactly; "
                              f"they cover {sum(runs)} pixels")
    values = np.arange(len(runs), dtype=np.uint8) & 1
    return np.repeat(values, runs).reshape(rle.width, rle.height).T


def placed_raster(mask: np.ndarray, where: Placement) -> np.ndarray:
    """A stored-grid mask resampled through the map: 1 where an output pixel's centre falls in it."""
    matrix = where.matrix()
    # Pixel indices are centres, half a pixel from the continuous coordinates' edges.
    matrix[:, 2] += matrix[:, 0] * 0.5 + matrix[:, 1] * 0.5 - 0.5
    warped = cv2.warpAffine(mask.astype(np.float32), matrix, where.size, flags=cv2.INTER_LINEAR,
                            borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    return (warped >= 0.5).astype(np.uint8)


def segmentation_mask(segmentation: Optional[Segmentation], where: Placement) -> np.ndarray:
    """An object's mask on the output grid. An RLE must be on the image's stored grid."""
    if segmentation is None:
        raise BadSegmentation("the object has no segmentation to make its mask from")
    if isinstance(segmentation, Polygons):
        return polygons_mask(segmentation, where)
    if (segmentation.width, segmentation.height) != where.stored:
        raise BadSegmentation(f"the RLE is {segmentation.width}x{segmentation.height}, the image "
                              f"{where.stored[0]}x{where.stored[1]}")
    return placed_raster(rle_mask(segmentation), where)


def mask_png(mask: np.ndarray) -> bytes:
    """A 0/1 mask as a grey PNG (Model Garden's decoder reads values above 0 as the object)."""
    ok, buf = cv2.imencode(".png", mask.astype(np.uint8))
    if not ok:
        raise RuntimeError(f"OpenCV could not encode a {mask.shape} mask as PNG")
    return buf.tobytes()
