"""Pictures of a dataset for a quick look by a human: a contact sheet and class-count bars.

Pure functions, RGB uint8 arrays in and out (OpenCV draws), kept apart from the I/O and from
the verification in pipeline/read/verify.py.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import cv2
import numpy as np

from transforms.specs import ImageSpec

_FONT = cv2.FONT_HERSHEY_SIMPLEX
_BACKGROUND = (255, 255, 255)
_TILE_BACKGROUND = (230, 230, 230)
_TEXT = (20, 20, 20)
_MUTED = (110, 110, 110)
# One color per split (RGB), cycled when there are more splits.
_SPLIT_COLORS = ((66, 133, 244), (234, 134, 0), (52, 168, 83), (171, 71, 188), (219, 68, 55), (0, 172, 193))


def _ascii(text: str) -> str:
    """Hershey fonts only draw ASCII; anything else would come out as garbage glyphs."""
    return text.encode("ascii", "replace").decode("ascii")


def _text_width(text: str, scale: float, thickness: int = 1) -> int:
    return cv2.getTextSize(text, _FONT, scale, thickness)[0][0]


def _fit_text(text: str, max_width: int, scale: float, thickness: int = 1) -> str:
    """The text, shortened with a trailing '~' until it fits `max_width` pixels."""
    text = _ascii(text)
    if _text_width(text, scale, thickness) <= max_width:
        return text
    while text and _text_width(text + "~", scale, thickness) > max_width:
        text = text[:-1]
    return text + "~"


def _put_text(canvas: np.ndarray, text: str, x: int, baseline: int, scale: float,
              color: tuple[int, int, int] = _TEXT, thickness: int = 1) -> None:
    cv2.putText(canvas, text, (int(x), int(baseline)), _FONT, scale, color, thickness, cv2.LINE_AA)


def _as_rgb_uint8(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise ValueError(f"images to draw must be uint8 (see to_display_uint8); got {image.dtype}")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise ValueError(f"images to draw must be HxW, HxWx1, HxWx3 or HxWx4; got {image.shape}")
    if image.shape[2] == 1:
        return np.repeat(image, 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3])


def _fit_tile(image: np.ndarray, tile: int) -> np.ndarray:
    """The image scaled to fit a tile x tile square (aspect kept), centered on a grey tile."""
    image = _as_rgb_uint8(image)
    height, width = image.shape[:2]
    scale = tile / max(height, width, 1)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    resized = cv2.resize(image, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    out = np.full((tile, tile, 3), _TILE_BACKGROUND, np.uint8)
    top, left = (tile - size[1]) // 2, (tile - size[0]) // 2
    out[top:top + size[1], left:left + size[0]] = resized
    return out


def draw_contact_sheet(sections: Sequence[tuple[str, Sequence[np.ndarray], Sequence[str]]],
                       tile: int = 160, columns: int = 8) -> np.ndarray:
    """One block per (title, images, captions): a title line, then the images in a grid with
    each caption under its image. Images are uint8 RGB/grey of any size; returns RGB uint8."""
    margin, gap, header, caption = 10, 8, 30, 22
    widest = max([len(images) for _, images, _ in sections] + [1])
    columns = max(1, min(columns, widest))
    width = 2 * margin + columns * tile + (columns - 1) * gap
    rows = [max(1, -(-len(images) // columns)) for _, images, _ in sections]
    heights = [header + n * (tile + caption) + (n - 1) * gap + gap for n in rows]
    canvas = np.full((margin + sum(heights) + margin, width, 3), _BACKGROUND, np.uint8)
    top = margin
    for (title, images, captions), block_height in zip(sections, heights):
        _put_text(canvas, _fit_text(title, width - 2 * margin, 0.7, 2), margin, top + 22, 0.7, thickness=2)
        if not images:
            _put_text(canvas, "(no images)", margin, top + header + 20, 0.5, _MUTED)
        for i, (image, text) in enumerate(zip(images, captions)):
            row, col = divmod(i, columns)
            x, y = margin + col * (tile + gap), top + header + row * (tile + caption + gap)
            canvas[y:y + tile, x:x + tile] = _fit_tile(image, tile)
            _put_text(canvas, _fit_text(text, tile, 0.5), x, y + tile + 16, 0.5)
        top += block_height
    return canvas


def draw_boxes(image: np.ndarray, boxes: np.ndarray, color: tuple[int, int, int] = (255, 0, 255)) -> np.ndarray:
    """A copy of the image with each box (ymin, xmin, ymax, xmax in [0, 1]) outlined."""
    canvas = _as_rgb_uint8(image).copy()
    height, width = canvas.shape[:2]
    for ymin, xmin, ymax, xmax in np.asarray(boxes, np.float64).reshape(-1, 4):
        x0, y0, x1, y1 = np.clip([xmin * width, ymin * height, xmax * width - 1, ymax * height - 1], 0,
                                 [width - 1, height - 1] * 2).round().astype(int)
        cv2.rectangle(canvas, (x0, y0), (x1, y1), color, 1)
    return canvas


def draw_bar_chart(counts: Mapping[str, Mapping[str, int]], classes: Sequence[str], bar_height: int = 18,
                   bar_width: int = 220, title: str = "examples per class") -> np.ndarray:
    """Horizontal bars, one panel per split ({split: {class: count}}), one row per class.

    Each panel is scaled to its own largest class: splits differ in size by design, and the
    point is to see imbalance between classes within a split. Returns RGB uint8.
    """
    margin, gap, header, row, scale = 10, 16, 26, bar_height + 6, 0.45
    label_width = min(220, max([_text_width(_ascii(c), scale) for c in classes] + [40])) + 8
    panel_width = bar_width + _text_width("0000000", scale)  # room for the count after a full bar
    width = 2 * margin + label_width + max(1, len(counts)) * (panel_width + gap)
    top = margin + 34 + header
    height = top + max(1, len(classes)) * row + margin
    canvas = np.full((height, width, 3), _BACKGROUND, np.uint8)
    _put_text(canvas, _fit_text(title, width - 2 * margin, 0.7, 2), margin, margin + 22, 0.7, thickness=2)
    for i, name in enumerate(classes):
        baseline = top + i * row + bar_height // 2 + 5
        _put_text(canvas, _fit_text(name, label_width - 8, scale), margin, baseline, scale)
    for s, (split, per_class) in enumerate(counts.items()):
        values = [per_class.get(c, 0) for c in classes]
        color = _SPLIT_COLORS[s % len(_SPLIT_COLORS)]
        left = margin + label_width + s * (panel_width + gap)
        _put_text(canvas, _fit_text(f"{split} ({sum(values)})", panel_width, 0.55, 1), left, top - 10, 0.55, color, 1)
        cv2.line(canvas, (left, top - 4), (left, height - margin), _MUTED, 1)
        largest = max(values + [1])
        for i, n in enumerate(values):
            y = top + i * row
            length = round(bar_width * n / largest)
            if length:
                cv2.rectangle(canvas, (left + 1, y), (left + max(length, 2), y + bar_height), color, cv2.FILLED)
            _put_text(canvas, str(n), left + max(length, 1) + 5, y + bar_height // 2 + 5, scale,
                      _TEXT if n else _MUTED)
    if not classes:
        _put_text(canvas, "(no classes)", margin, top + 14, scale, _MUTED)
    return canvas


def to_display_uint8(image: np.ndarray, normalize: str = "none", mean: Sequence[float] = ImageSpec.mean,
                     std: Sequence[float] = ImageSpec.std) -> np.ndarray:
    """Stored pixels → uint8 RGB for drawing, undoing the write-time normalization."""
    image = np.asarray(image)
    if image.dtype == np.uint8:
        return image
    pixels = image.astype(np.float32)
    if normalize == "mean_std":
        pixels = pixels * np.asarray(std, np.float32) + np.asarray(mean, np.float32)
    elif normalize != "unit":  # unknown: stretch whatever range there is
        low, high = float(np.min(pixels)), float(np.max(pixels))
        pixels = (pixels - low) / (high - low) if high > low else np.zeros_like(pixels)
    return np.clip(np.rint(pixels * 255.0), 0, 255).astype(np.uint8)
