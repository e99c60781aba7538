"""Regenerate data/sample: a tiny labelled image folder that `make demo` and the tests run on.

Every image is cut from a public-domain photo bundled inside scikit-image, so the sample needs no
download and carries no licence burden. Each class comes from a different photo; each file is a
distinct crop/scale/flip of it (so content hashes differ), and the formats cover the decode edge
cases the pipeline must handle. A fixed seed makes the output byte-identical run to run (for the
same Pillow/OpenCV/numpy versions).

Usage (from the repo root): python data/make_sample.py [--out data/sample]
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
from PIL import Image
from skimage import data as skdata

SEED = 20240601
EXIF_ORIENTATION = 0x0112

# Class name -> bundled skimage photo (functions that would need a download are not used).
SOURCES: dict[str, Callable[[], np.ndarray]] = {
    "cat": skdata.chelsea,
    "coffee": skdata.coffee,
    "rocket": skdata.rocket,
}

# Twelve variants per class, mostly plain JPEG; the special decode cases (gray, exif6, cmyk, rgba,
# png16) appear once each in the whole sample.
PLAN: dict[str, tuple[str, ...]] = {
    "cat": ("jpg", "jpg", "gray", "jpg", "png", "jpg",
            "exif6", "webp", "jpg", "bmp", "tiff", "gif"),
    "coffee": ("jpg", "cmyk", "jpg", "jpg", "rgba", "jpg",
               "progressive", "webp", "jpg", "bmp", "tiff", "gif"),
    "rocket": ("jpg", "jpg", "png16", "jpg", "jpg", "jpg",
               "progressive", "webp", "jpg", "bmp", "tiff", "gif"),
}

# Lossless formats get a smaller short side to keep the folder small.
LOSSLESS = {"png", "rgba", "png16", "bmp", "tiff", "gif"}

# Progressive JPEGs use the .jpeg spelling so both JPEG extensions are discovered.
EXTENSIONS = {"jpg": "jpg", "progressive": "jpeg", "gray": "jpg", "exif6": "jpg", "cmyk": "jpg",
              "png": "png", "rgba": "png", "png16": "png", "webp": "webp", "bmp": "bmp",
              "tiff": "tiff", "gif": "gif"}


def _crop(rng: np.random.Generator, photo: np.ndarray, short_side: int) -> Image.Image:
    """A random crop (45-95% of the photo, jittered aspect), maybe mirrored, at short_side."""
    h, w = photo.shape[:2]
    scale = rng.uniform(0.45, 0.95)
    ch = int(h * scale)
    cw = min(w, int(w * scale * rng.uniform(0.8, 1.2)))
    top = int(rng.integers(0, h - ch + 1))
    left = int(rng.integers(0, w - cw + 1))
    img = Image.fromarray(photo[top:top + ch, left:left + cw])
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    ratio = short_side / min(img.size)
    return img.resize((round(img.width * ratio), round(img.height * ratio)),
                      Image.Resampling.LANCZOS)


def _radial_alpha(size: tuple[int, int]) -> Image.Image:
    """Opaque centre fading to fully transparent corners: partial alpha, not just 0/255."""
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    dist = np.hypot((xx - w / 2) / (w / 2), (yy - h / 2) / (h / 2))
    return Image.fromarray((np.clip(1.4 - dist, 0.0, 1.0) * 255).astype(np.uint8))


def _write(variant: str, img: Image.Image, path: Path, rng: np.random.Generator) -> None:
    """Encode one variant; the non-plain ones exercise a specific decode path."""
    if variant == "jpg":
        img.save(path, "JPEG", quality=85)
    elif variant == "progressive":
        img.save(path, "JPEG", quality=85, progressive=True)
    elif variant == "gray":
        img.convert("L").save(path, "JPEG", quality=85)
    elif variant == "exif6":
        # Orientation 6: "rotate 90 deg clockwise to display", so store the pixels rotated CCW.
        exif = Image.Exif()
        exif[EXIF_ORIENTATION] = 6
        img.transpose(Image.Transpose.ROTATE_90).save(path, "JPEG", quality=85, exif=exif)
    elif variant == "cmyk":
        img.convert("CMYK").save(path, "JPEG", quality=85)
    elif variant == "png":
        img.save(path, "PNG")
    elif variant == "rgba":
        rgba = img.convert("RGBA")
        rgba.putalpha(_radial_alpha(img.size))
        rgba.save(path, "PNG")
    elif variant == "png16":
        # Pillow cannot write 16-bit RGB PNG; OpenCV can. Random low bytes make it truly 16-bit.
        rgb16 = np.asarray(img, dtype=np.uint16) * 257
        rgb16 ^= rng.integers(0, 256, size=rgb16.shape, dtype=np.uint16)
        if not cv2.imwrite(str(path), cv2.cvtColor(rgb16, cv2.COLOR_RGB2BGR)):
            raise OSError(f"OpenCV could not write {path}")
    elif variant == "webp":
        img.save(path, "WEBP", quality=80, method=4)
    elif variant == "bmp":
        img.save(path, "BMP")
    elif variant == "tiff":
        img.save(path, "TIFF", compression="tiff_deflate")
    elif variant == "gif":
        palette = img.quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        palette.save(path, "GIF")
    else:
        raise ValueError(f"unknown variant {variant!r}")


def build(out: Path) -> list[tuple[str, str]]:
    """Write every class folder from scratch and return (relative path, label) rows, sorted."""
    rows: list[tuple[str, str]] = []
    for class_index, (label, load) in enumerate(SOURCES.items()):
        rng = np.random.default_rng([SEED, class_index])
        photo = load()
        class_dir = out / label
        shutil.rmtree(class_dir, ignore_errors=True)  # stale files would leak into the sample
        class_dir.mkdir(parents=True)
        for i, variant in enumerate(PLAN[label], start=1):
            low, high = (64, 96) if variant in LOSSLESS else (96, 160)
            img = _crop(rng, photo, int(rng.integers(low, high + 1)))
            ext = EXTENSIONS[variant]
            tag = "" if variant == ext else f"_{variant}"  # name the edge case, not the format
            name = f"{label}_{i:02d}{tag}.{ext}"
            _write(variant, img, class_dir / name, rng)
            rows.append((f"{label}/{name}", label))
    return sorted(rows)


def write_manifests(out: Path, rows: list[tuple[str, str]]) -> None:
    """CSV and JSONL manifests list the same files, so both discovery modes can be tested."""
    with open(out / "manifest.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["path", "label"])
        writer.writerows(rows)
    with open(out / "manifest.jsonl", "w", encoding="utf-8") as f:
        for path, label in rows:
            f.write(json.dumps({"path": path, "label": label}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "sample",
                        help="output folder (default: data/sample next to this script)")
    args = parser.parse_args()
    rows = build(args.out)
    write_manifests(args.out, rows)
    print(f"wrote {len(rows)} images to {args.out}")


if __name__ == "__main__":
    main()
