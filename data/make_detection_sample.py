"""Regenerate data/detection: a tiny COCO and Pascal VOC detection sample with drawn objects.

Every object's pixels are exactly its annotation: a square fills its box, a triangle and a disc
fill what pycocotools rasterizes of their polygons, a crowd fills its RLE, each in one solid
colour on a grey background, so tests can find an object's pixels after any resize and compare
them with where imgrec puts its box and mask. One COCO image is a JPEG stored on its side with
EXIF orientation 6 (annotations refer to the stored pixels, as COCO's tools read them); one
image has no objects. Category ids are not contiguous (1, 3, 7), as in COCO.

Usage (from the repo root): python data/make_detection_sample.py [--out data/detection]
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
from PIL import Image
from pycocotools import mask as coco_mask

EXIF_ORIENTATION = 0x0112
BACKGROUND = (128, 128, 128)
COLOURS = {"square": (230, 40, 40), "triangle": (40, 200, 40), "disc": (40, 60, 230)}
CATEGORIES = {1: "disc", 3: "square", 7: "triangle"}
CROWD_COLOUR = (240, 220, 30)

# (file, width, height, orientation, objects); an object is (class, geometry): a square's box
# (x, y, w, h) in whole pixels, a triangle's or disc's polygon, "crowd" an RLE of small blobs.
COCO_IMAGES = (
    ("street.jpg", 96, 64, 1, (("square", (8, 10, 30, 24)), ("triangle", (50, 50, 90, 56, 70, 8)))),
    ("tall_exif6.jpg", 64, 96, 6, (("square", (10, 60, 20, 28)), ("disc", None))),
    ("pond.png", 80, 80, 1, (("disc", None), ("crowd", None))),
    ("empty.jpg", 72, 48, 1, ()),
)
VOC_IMAGES = (
    ("000001", 96, 64, (("square", (8, 10, 30, 24)), ("triangle", (50, 8, 40, 48)))),
    ("000002", 64, 80, (("square", (4, 40, 24, 30)),)),
    ("000003", 80, 64, (("triangle", (20, 12, 40, 40)), ("square", (62, 2, 16, 16)))),
)


def disc_polygon(cx: float, cy: float, r: float, points: int = 16) -> list[float]:
    angles = np.linspace(0, 2 * np.pi, points, endpoint=False)
    return [round(float(v), 2) for a in angles for v in (cx + r * np.cos(a), cy + r * np.sin(a))]


def polygon_mask(polygon: list[float], width: int, height: int) -> np.ndarray:
    return coco_mask.decode(coco_mask.merge(coco_mask.frPyObjects([polygon], height, width)))


def crowd_mask(width: int, height: int) -> np.ndarray:
    yy, xx = np.mgrid[0:height, 0:width]
    blobs = [(60, 60, 5), (68, 66, 4), (56, 70, 4)]
    return np.any([(xx - x) ** 2 + (yy - y) ** 2 <= r * r for x, y, r in blobs], axis=0).astype(np.uint8)


def coco_object(kind: str, geometry, width: int, height: int) -> tuple[np.ndarray, dict]:
    """The object's pixels on the stored grid and its COCO annotation fields."""
    if kind == "square":
        x, y, w, h = geometry
        pixels = np.zeros((height, width), np.uint8)
        pixels[y:y + h, x:x + w] = 1
        polygon = [x, y, x + w, y, x + w, y + h, x, y + h]
        fields = {"segmentation": [polygon], "iscrowd": 0}
    elif kind == "crowd":
        pixels = crowd_mask(width, height)
        rle = coco_mask.encode(np.asfortranarray(pixels))
        fields = {"segmentation": {"size": [height, width], "counts": rle["counts"].decode("ascii")}, "iscrowd": 1}
    else:
        polygon = list(geometry) if geometry else disc_polygon(width * 0.3, height * 0.35, min(width, height) * 0.18)
        pixels = polygon_mask(polygon, width, height)
        fields = {"segmentation": [polygon], "iscrowd": 0}
    rle = coco_mask.encode(np.asfortranarray(pixels))
    fields["area"] = float(coco_mask.area(rle))
    fields["bbox"] = [float(v) for v in coco_mask.toBbox(rle)]
    return pixels, fields


def save(pixels: np.ndarray, path: Path, orientation: int = 1) -> None:
    image = Image.fromarray(pixels)
    if path.suffix == ".png":
        image.save(path, "PNG")
        return
    exif = Image.Exif()
    if orientation != 1:
        exif[EXIF_ORIENTATION] = orientation
    image.save(path, "JPEG", quality=92, exif=exif)


def paint(width: int, height: int, masks: list[tuple[np.ndarray, tuple[int, int, int]]]) -> np.ndarray:
    canvas = np.empty((height, width, 3), np.uint8)
    canvas[:] = BACKGROUND
    for pixels, colour in masks:
        canvas[pixels.astype(bool)] = colour
    return canvas


def build_coco(out: Path) -> None:
    images, annotations = [], []
    (out / "images").mkdir(parents=True)
    category_of = {name: category_id for category_id, name in CATEGORIES.items()}
    for image_id, (file_name, width, height, orientation, objects) in enumerate(COCO_IMAGES, start=1):
        painted = []
        for kind, geometry in objects:
            pixels, fields = coco_object(kind, geometry, width, height)
            painted.append((pixels, CROWD_COLOUR if kind == "crowd" else COLOURS[kind]))
            annotations.append({"id": len(annotations) + 1, "image_id": image_id,
                                "category_id": category_of["disc" if kind == "crowd" else kind], **fields})
        save(paint(width, height, painted), out / "images" / file_name, orientation)
        images.append({"id": image_id, "file_name": f"images/{file_name}", "width": width, "height": height})
    categories = [{"id": category_id, "name": name, "supercategory": "shape"}
                  for category_id, name in CATEGORIES.items()]
    document = {"info": {"description": "imgrec detection sample"}, "images": images, "annotations": annotations,
                "categories": categories}
    (out / "instances.json").write_text(json.dumps(document, indent=1) + "\n")


def voc_xml(stem: str, width: int, height: int, objects) -> str:
    """VOC boxes are 1-based, both ends included."""
    parts = [f"<annotation>\n  <folder>JPEGImages</folder>\n  <filename>{stem}.jpg</filename>\n"
             f"  <size><width>{width}</width><height>{height}</height><depth>3</depth></size>\n"]
    for kind, (x, y, w, h) in objects:
        parts.append(f"  <object>\n    <name>{kind}</name>\n    <pose>Unspecified</pose>\n"
                     f"    <truncated>0</truncated>\n    <difficult>0</difficult>\n"
                     f"    <bndbox><xmin>{x + 1}</xmin><ymin>{y + 1}</ymin>"
                     f"<xmax>{x + w}</xmax><ymax>{y + h}</ymax></bndbox>\n  </object>\n")
    return "".join(parts) + "</annotation>\n"


def build_voc(out: Path) -> None:
    (out / "Annotations").mkdir(parents=True)
    (out / "JPEGImages").mkdir(parents=True)
    for stem, width, height, objects in VOC_IMAGES:
        painted = []
        for kind, (x, y, w, h) in objects:
            pixels = np.zeros((height, width), np.uint8)
            pixels[y:y + h, x:x + w] = 1
            painted.append((pixels, COLOURS[kind]))
        save(paint(width, height, painted), out / "JPEGImages" / f"{stem}.jpg")
        (out / "Annotations" / f"{stem}.xml").write_text(voc_xml(stem, width, height, objects))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "detection",
                        help="output folder (default: data/detection next to this script)")
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    build_coco(args.out / "coco")
    build_voc(args.out / "voc")
    print(f"wrote the COCO and VOC samples to {args.out}")


if __name__ == "__main__":
    main()
