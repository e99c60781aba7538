"""--reuse_from for COCO inputs (#41): an image whose bytes are unchanged takes its pixels from the
previous dataset, and its objects are placed from the annotation file as it is now, so changed
annotations are honoured even when no pixel changed; either way the records are byte for byte
those of a run that converts every image afresh."""
from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from tests.helpers import records_by_split, run_pipeline
from tests.test_detection_pipeline import BOX_KEYS, DETECTION, records

pytestmark = pytest.mark.e2e

SETTINGS = {"original size": (),
            "center crop with masks": ("--resize_mode=center_crop", "--height=40", "--width=56", "--masks",
                                       "--encoding=png", "--min_visible=0.3")}


def coco_copy(folder: pathlib.Path) -> pathlib.Path:
    shutil.copytree(DETECTION / "coco", folder)
    return folder / "instances.json"


def move_first_square(annotation_file: pathlib.Path) -> None:
    """Annotation 1 (street.jpg's square, x 8..38, y 10..34) shifted 4 px right, made a triangle."""
    coco = json.loads(annotation_file.read_text())
    first = coco["annotations"][0]
    first["bbox"][0] += 4
    first["segmentation"] = [[x + 4 if i % 2 == 0 else x for i, x in enumerate(first["segmentation"][0])]]
    first["category_id"] = 7
    annotation_file.write_text(json.dumps(coco))


def street_record(output: pathlib.Path) -> dict:
    return next(r for r in records(output) if r["image/source_id"] == b"1")


@pytest.mark.parametrize("settings", SETTINGS)
def test_reuse_from_takes_pixels_and_places_the_current_annotations(tmp_path, settings):
    flags = SETTINGS[settings]
    annotations = coco_copy(tmp_path / "coco")
    first = tmp_path / "first"
    run_pipeline(annotations, first, *flags)

    unchanged = run_pipeline(annotations, tmp_path / "unchanged", f"--reuse_from={first}", *flags)
    assert (unchanged.reuse.reused, unchanged.reuse.converted) == (4, 0)
    assert records_by_split(tmp_path / "unchanged", unchanged) == records_by_split(first, unchanged)

    move_first_square(annotations)
    changed = run_pipeline(annotations, tmp_path / "changed", f"--reuse_from={first}", *flags)
    fresh = run_pipeline(annotations, tmp_path / "fresh", *flags)
    assert (changed.reuse.reused, changed.reuse.converted) == (4, 0)  # no pixel changed: none decoded again
    assert records_by_split(tmp_path / "changed", changed) == records_by_split(tmp_path / "fresh", fresh)
    assert changed.objects == fresh.objects and changed.objects != unchanged.objects
    before, after = street_record(first), street_record(tmp_path / "changed")
    assert sorted(before["image/object/class/label"]) == [3, 7] and sorted(after["image/object/class/label"]) == [7, 7]
    width = after["image/width"]
    shifts = sorted(round((a - b) * width, 1) for a, b in zip(after[BOX_KEYS[0]], before[BOX_KEYS[0]]))
    assert any(shift > 0 for shift in shifts)  # the moved box moved with the file


def test_changed_annotations_change_the_fingerprint_not_the_pixels(tmp_path):
    """--skip_unchanged sees changed annotations as a changed input: the dataset is written again."""
    annotations = coco_copy(tmp_path / "coco")
    output = tmp_path / "out"
    first = run_pipeline(annotations, output)
    again = run_pipeline(annotations, output, "--skip_unchanged", "--overwrite")
    assert again.run["run_id"] == first.run["run_id"]  # unchanged: kept as it was
    move_first_square(annotations)
    changed = run_pipeline(annotations, output, "--skip_unchanged", "--overwrite")
    assert changed.run["run_id"] != first.run["run_id"] and changed.pixel_fingerprint == first.pixel_fingerprint


def test_categories_renamed_since_an_earlier_run_in_the_same_process_are_read_anew(tmp_path):
    """`imgrec.convert` twice in one process (a notebook, a long-lived worker) with the COCO file's
    categories edited in between: the second run kept the first run's label map."""
    annotations = coco_copy(tmp_path / "coco")
    before = run_pipeline(annotations, tmp_path / "first").label_map
    coco = json.loads(annotations.read_text())
    for category in coco["categories"]:
        category["name"] = f"new {category['name']}"
    annotations.write_text(json.dumps(coco))
    after = run_pipeline(annotations, tmp_path / "second").label_map
    assert after == {f"new {name}": category_id for name, category_id in before.items()}
