"""pipeline.read.drawing: the contact sheet, the class-count bars and display pixels, on synthetic arrays."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.read import drawing
from transforms.images.normalize import normalize_image
from transforms.specs import ImageSpec

pytestmark = pytest.mark.unit


def test_contact_sheet_layout():
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (30, 90, 3), dtype=np.uint8)  # wide
    grey = rng.integers(0, 256, (120, 40), dtype=np.uint8)  # tall, no channel axis
    rgba = rng.integers(0, 256, (50, 50, 4), dtype=np.uint8)
    sheet = drawing.draw_contact_sheet(
        [("train", [rgb, grey, rgba], ["cat", "a very long label that cannot fit under one tile", "caf\u00e9"]),
         ("val", [], [])], tile=100, columns=2)
    assert sheet.dtype == np.uint8 and sheet.ndim == 3 and sheet.shape[2] == 3
    assert sheet.shape[1] == 2 * 10 + 2 * 100 + 8  # two columns
    # train: header + 2 rows of (tile + caption) + gap between rows + gap; val: header + 1 empty row + gap
    assert sheet.shape[0] == 10 + (30 + 2 * 122 + 8 + 8) + (30 + 122 + 8) + 10
    caption = sheet[10 + 30 + 100:10 + 30 + 122, 10:110]
    assert (caption < 128).any()  # the caption was drawn
    with pytest.raises(ValueError, match="uint8"):
        drawing.draw_contact_sheet([("x", [np.zeros((4, 4, 3), np.float32)], ["a"])])


def test_bar_chart_scales_bars_per_split():
    counts = {"train": {"cat": 8, "dog": 4, "fox": 0}, "val": {"cat": 1}, "test": {}}
    chart = drawing.draw_bar_chart(counts, ["cat", "dog", "fox"], bar_height=18, bar_width=200)
    assert chart.dtype == np.uint8 and chart.shape[2] == 3
    train_color = np.array(drawing._SPLIT_COLORS[0])
    is_train = np.all(chart == train_color, axis=2)
    rows = is_train.sum(axis=1)
    widths = sorted({int(n) for n in rows if n > 30})  # bars, not the colored header text
    assert len(widths) == 2 and abs(widths[1] - 2 * widths[0]) <= 2  # cat bar twice the dog bar
    assert abs(widths[1] - 200) <= 2  # the largest class fills the panel
    empty = drawing.draw_bar_chart({}, [])
    assert empty.ndim == 3


def test_display_pixels_undo_write_time_normalization():
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    for method in ("unit", "mean_std"):
        stored = normalize_image(image, ImageSpec(normalize=method, encoding="raw"))
        shown = drawing.to_display_uint8(stored, method)
        assert np.abs(shown.astype(int) - image.astype(int)).max() <= 1
    assert drawing.to_display_uint8(image) is image
