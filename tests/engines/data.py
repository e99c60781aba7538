"""The generated input set the engine tests convert besides data/sample.

A few hundred small, distinct photo-like JPEG and PNG images in class folders, plus the bad files
a real folder has: a truncated JPEG, text saved as .jpg, a zero-byte .jpg, a .txt file and an
exact copy of an image in another class. Everything is a pure function of the arguments, so the
DirectRunner reference and every engine convert the same bytes.

    python -m tests.engines.data DIR [PER_CLASS]   # writes the set into DIR (for the docs' guide)
"""
from __future__ import annotations

import pathlib
import sys

from tests.helpers import make_tree

CLASSES = ("ant", "bee", "cat")
PER_CLASS = 100
# What the bad files become (file → (stage, error)); the .txt is skipped, the rest are errors.
BAD_FILES = {
    "ant/truncated.jpg": ("header", "CorruptImage"),
    "ant/notes.jpg": ("header", "NotAnImage"),
    "bee/empty.jpg": ("read", "EmptyFile"),
    "cat/README.txt": ("discover", "SkippedFile"),
}
# The error budget has to allow the bad files (3 errors in ~300 inputs is above the 1% default).
FLAGS = ("--max_error_fraction=0.05",)


def write_generated_images(root: pathlib.Path, per_class: int = PER_CLASS) -> pathlib.Path:
    """Writes the set into `root` (created) and returns it."""
    make_tree(root, dict.fromkeys(CLASSES, per_class), size=(48, 64))
    good_jpeg = (root / "ant" / "ant_0001.jpg").read_bytes()
    (root / "ant" / "truncated.jpg").write_bytes(good_jpeg[: len(good_jpeg) // 2])
    (root / "ant" / "notes.jpg").write_bytes(b"these are not pixels, just text in a .jpg\n" * 4)
    (root / "bee" / "empty.jpg").write_bytes(b"")
    (root / "cat" / "README.txt").write_text("not an image\n")
    (root / "cat" / "copy_of_ant_0001.jpg").write_bytes(good_jpeg)
    return root


if __name__ == "__main__":
    target = pathlib.Path(sys.argv[1])
    write_generated_images(target, int(sys.argv[2]) if len(sys.argv) > 2 else PER_CLASS)
    print(f"{sum(1 for p in target.rglob('*') if p.is_file())} files in {target}")
