"""The input the engine tests convert: data/sample, a generated set with the bad files a real
folder has, and enough small photos for the parts of a shard to spread over two slots, in one
folder, so that one run per engine and environment checks all of it.

- data/sample as it is (its real-world images: grayscale, CMYK, EXIF-turned, PNG with alpha, ...;
  the manifests at its root are skipped: not images);
- PER_CLASS distinct small JPEG and PNG photos in each of CLASSES;
- the bad files: a truncated JPEG, text saved as .jpg, a zero-byte .jpg, a .txt file and an exact
  copy of an image in another class.

With the built-in defaults (train/val/test 0.7/0.2/0.1, one shard per split at this size) a
cluster cuts the shards into parts of 256 images (transforms/write/parts.py): 14 parts, which the
slots convert side by side; the reshuffle that spreads them leaves all on one slot once in 8,192
runs. Everything is a pure function of the arguments, so the DirectRunner reference and every
engine convert the same bytes.

    python -m tests.engines.data DIR [PER_CLASS]   # writes the set into DIR
"""
from __future__ import annotations

import pathlib
import shutil
import sys

from tests.helpers import SAMPLE, make_tree

CLASSES = ("ant", "bee", "dog")  # not the sample's (cat, coffee, rocket)
PER_CLASS = 1000
PHOTO_SIZE = (48, 64)
# The bad files that are images by name (the .txt is skipped): each must end as a dead letter.
REJECTED = ("ant/truncated.jpg", "ant/notes.jpg", "bee/empty.jpg")


def write_images(root: pathlib.Path, per_class: int = PER_CLASS) -> pathlib.Path:
    """Writes the set into `root` (created) and returns it."""
    shutil.copytree(SAMPLE, root)
    make_tree(root, dict.fromkeys(CLASSES, per_class), size=PHOTO_SIZE)
    good_jpeg = (root / "ant" / "ant_0001.jpg").read_bytes()
    (root / "ant" / "truncated.jpg").write_bytes(good_jpeg[: len(good_jpeg) // 2])
    (root / "ant" / "notes.jpg").write_bytes(b"these are not pixels, just text in a .jpg\n" * 4)
    (root / "bee" / "empty.jpg").write_bytes(b"")
    (root / "dog" / "README.txt").write_text("not an image\n")
    (root / "dog" / "copy_of_ant_0001.jpg").write_bytes(good_jpeg)
    return root


if __name__ == "__main__":
    target = pathlib.Path(sys.argv[1])
    write_images(target, int(sys.argv[2]) if len(sys.argv) > 2 else PER_CLASS)
    print(f"{sum(1 for p in target.rglob('*') if p.is_file())} files in {target}")
