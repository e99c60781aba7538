"""A deterministic corpus of large (12-megapixel, 4000x3000) photo JPEGs, for benchmarks.

Made offline from the colour photos scikit-image ships, like `make_corpus` (one class folder per
source photo): each image is a random 4:3 crop covering 60-100% of the source's short side,
randomly flipped, upscaled (bicubic) to 4000x3000 and saved as a baseline JPEG at quality 90-95.
The sources are 300-1400 px, so the photos are smoother than a camera's; `--grain SIGMA` adds
Gaussian noise (per pixel, 0 by default) for more camera-like high frequencies and file sizes.
Image `i` depends only on (i, seed, grain), so the first N images are the same in every size.
A corpus that already holds the requested count is reused.

    python -m benchmarks.make_photos --images 300   # → benchmarks/corpus/photos-300/<class>/*.jpg
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
from typing import Optional

import cv2
import numpy as np

from benchmarks.make_corpus import CORPUS_ROOT, SOURCES, source_photo

WIDTH, HEIGHT = 4000, 3000
_MANIFEST = "corpus.json"
_VERSION = 1


def make_photo(index: int, seed: int = 0, grain: float = 0.0) -> tuple[str, bytes]:
    """(class name, JPEG bytes) of photo `index`; a pure function of (index, seed, grain)."""
    rng = np.random.default_rng([seed, index, 4000])
    name = SOURCES[index % len(SOURCES)]
    photo = source_photo(name)
    src_h, src_w = photo.shape[:2]
    crop_h = int(min(src_h, src_w * 3 / 4) * rng.uniform(0.6, 1.0))
    crop_w = min(src_w, round(crop_h * 4 / 3))
    top = int(rng.integers(0, src_h - crop_h + 1))
    left = int(rng.integers(0, src_w - crop_w + 1))
    crop = photo[top:top + crop_h, left:left + crop_w]
    if rng.random() < 0.5:
        crop = cv2.flip(crop, 1)
    image = cv2.resize(crop, (WIDTH, HEIGHT), interpolation=cv2.INTER_CUBIC)
    if grain > 0:
        noise = rng.normal(0.0, grain, image.shape).astype(np.float32)
        image = cv2.add(image, noise, dtype=cv2.CV_8U)
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(90, 96))])
    assert ok
    return name, buf.tobytes()


def _write(args: tuple[str, int, int, float]) -> int:
    root, index, seed, grain = args
    name, data = make_photo(index, seed, grain)
    with open(os.path.join(root, name, f"{name}_{index:05d}.jpg"), "wb") as handle:
        handle.write(data)
    return len(data)


def photos_dir(images: int, grain: float = 0.0, root: Optional[pathlib.Path] = None) -> pathlib.Path:
    return (root or CORPUS_ROOT) / (f"photos-{images}" + (f"-grain{grain:g}" if grain else ""))


def make_photos(images: int, root: Optional[pathlib.Path] = None, seed: int = 0, grain: float = 0.0,
                processes: Optional[int] = None) -> pathlib.Path:
    """The photo corpus folder for `images` photos, generated unless it is already complete."""
    folder = photos_dir(images, grain, root)
    manifest = folder / _MANIFEST
    wanted = {"version": _VERSION, "images": images, "seed": seed, "grain": grain, "size": [WIDTH, HEIGHT],
              "sources": list(SOURCES)}
    if (manifest.exists() and json.loads(manifest.read_text()) == wanted
            and sum(1 for _ in folder.glob("*/*.jpg")) == images):
        return folder
    for path in folder.glob("*/*.jpg"):
        path.unlink()
    for name in SOURCES:
        (folder / name).mkdir(parents=True, exist_ok=True)
    with multiprocessing.get_context("fork").Pool(processes or os.cpu_count()) as pool:
        total = sum(pool.imap_unordered(_write, ((str(folder), i, seed, grain) for i in range(images)), chunksize=4))
    manifest.write_text(json.dumps(wanted))
    print(f"photos: {images} JPEGs of {WIDTH}x{HEIGHT}, {total / 2**20:.0f} MiB in {folder}")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--grain", type=float, default=0.0, help="Gaussian noise sigma (grey levels)")
    parser.add_argument("--root", type=pathlib.Path, default=None)
    args = parser.parse_args()
    make_photos(args.images, args.root, grain=args.grain)


if __name__ == "__main__":
    main()
