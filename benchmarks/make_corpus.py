"""A deterministic corpus of natural-photo JPEGs with ImageNet-like sizes, for benchmarks.

Made offline from the colour photos scikit-image ships (one class folder per source photo):
each image is a random crop (aspect 3:4 to 16:9, either orientation) covering 40-100% of the
source's short side, randomly flipped, scaled so its short side is 300-500 px, and saved as a
baseline JPEG at quality 88-92. Image `i` depends only on `i`, so the first N images are the same
in every corpus size. A corpus that already holds the requested count is reused.

    python -m benchmarks.make_corpus --images 10000   # → benchmarks/corpus/10000/<class>/*.jpg
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

CORPUS_ROOT = pathlib.Path(__file__).resolve().parent / "corpus"
SOURCES = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "retina",
           "immunohistochemistry", "motorcycle")
_MANIFEST = "corpus.json"
_VERSION = 1

_photos: dict[str, np.ndarray] = {}


def source_photo(name: str) -> np.ndarray:
    """A bundled photo as HxWx3 uint8 BGR (OpenCV's order)."""
    if name not in _photos:
        import skimage.data

        rgb = skimage.data.stereo_motorcycle()[0] if name == "motorcycle" else getattr(skimage.data, name)()
        _photos[name] = cv2.cvtColor(np.ascontiguousarray(rgb[..., :3]), cv2.COLOR_RGB2BGR)
    return _photos[name]


def make_image(index: int, seed: int = 0) -> tuple[str, bytes]:
    """(class name, JPEG bytes) of corpus image `index`; a pure function of (index, seed)."""
    rng = np.random.default_rng([seed, index])
    name = SOURCES[index % len(SOURCES)]
    photo = source_photo(name)
    src_h, src_w = photo.shape[:2]
    aspect = rng.uniform(4 / 3, 16 / 9) if rng.random() < 0.8 else rng.uniform(1.0, 4 / 3)
    crop_short = int(min(src_h, src_w) * rng.uniform(0.4, 1.0))
    crop_long = int(crop_short * aspect)
    landscape = rng.random() < 0.75
    crop_h, crop_w = (crop_short, crop_long) if landscape else (crop_long, crop_short)
    crop_h, crop_w = min(crop_h, src_h), min(crop_w, src_w)
    top = int(rng.integers(0, src_h - crop_h + 1))
    left = int(rng.integers(0, src_w - crop_w + 1))
    crop = photo[top:top + crop_h, left:left + crop_w]
    if rng.random() < 0.5:
        crop = cv2.flip(crop, 1)
    short = int(rng.integers(300, 501))
    scale = short / min(crop_h, crop_w)
    size = (max(short, round(crop_w * scale)), max(short, round(crop_h * scale)))
    interpolation = cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC
    image = cv2.resize(crop, size, interpolation=interpolation)
    gain = rng.uniform(0.85, 1.15)
    image = cv2.convertScaleAbs(image, alpha=gain, beta=rng.uniform(-10, 10))
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(88, 93))])
    assert ok
    return name, buf.tobytes()


def _write(args: tuple[str, int, int]) -> int:
    root, index, seed = args
    name, data = make_image(index, seed)
    path = os.path.join(root, name, f"{name}_{index:06d}.jpg")
    with open(path, "wb") as handle:
        handle.write(data)
    return len(data)


def corpus_dir(images: int, root: Optional[pathlib.Path] = None) -> pathlib.Path:
    return (root or CORPUS_ROOT) / str(images)


def count_images(folder: pathlib.Path) -> int:
    return sum(1 for _ in folder.glob("*/*.jpg"))


def make_corpus(images: int, root: Optional[pathlib.Path] = None, seed: int = 0,
                processes: Optional[int] = None) -> pathlib.Path:
    """The corpus folder for `images` images, generated unless it is already complete."""
    folder = corpus_dir(images, root)
    manifest = folder / _MANIFEST
    wanted = {"version": _VERSION, "images": images, "seed": seed, "sources": list(SOURCES)}
    if manifest.exists() and json.loads(manifest.read_text()) == wanted and count_images(folder) == images:
        return folder
    if folder.exists():
        for path in folder.glob("*/*.jpg"):
            path.unlink()
    for name in SOURCES:
        (folder / name).mkdir(parents=True, exist_ok=True)
    with multiprocessing.get_context("fork").Pool(processes or os.cpu_count()) as pool:
        total = sum(pool.imap_unordered(_write, ((str(folder), i, seed) for i in range(images)), chunksize=64))
    manifest.write_text(json.dumps(wanted))
    print(f"corpus: {images} JPEGs, {total / 2**20:.0f} MiB in {folder}")
    return folder


def describe(folder: pathlib.Path, sample: int = 500) -> dict:
    """Mean size and dimensions of (up to `sample` of) the corpus, for the report."""
    from transforms.images.image_header import read_header

    paths = sorted(folder.glob("*/*.jpg"))
    step = max(1, len(paths) // sample)
    dims = [read_header(p.read_bytes()) for p in paths[::step]]
    shorts = [min(h.width, h.height) for h in dims]
    return {"path": str(folder), "images": len(paths), "classes": len(SOURCES),
            "bytes": sum(p.stat().st_size for p in paths),
            "short_side_min": min(shorts), "short_side_max": max(shorts),
            "mean_width": round(float(np.mean([h.width for h in dims]))),
            "mean_height": round(float(np.mean([h.height for h in dims])))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--root", type=pathlib.Path, default=None)
    args = parser.parse_args()
    print(json.dumps(describe(make_corpus(args.images, args.root)), indent=1))


if __name__ == "__main__":
    main()
