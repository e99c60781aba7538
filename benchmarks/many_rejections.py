"""Peak memory of a run that rejects many inputs: class folders holding 4 images and N empty
`.xml` files each (a Pascal VOC tree has an annotation beside every image), so N dead letters.

    python -m benchmarks.many_rejections [--rejections 50000 200000] [--python .venv-bench/bin/python]
                                         [--code_dir /path/to/another/checkout]

Prints, per N, the wall time and the peak summed RSS of the run's process tree, running
imgrec from `--code_dir` (default: this checkout).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

import cv2
import numpy as np

from benchmarks.run import run_tree
from pipeline.tables import format_table

REPO = pathlib.Path(__file__).resolve().parents[1]
CLASSES = 4


def make_tree(root: pathlib.Path, rejections: int) -> None:
    for c in range(CLASSES):
        folder = root / f"class{c}"
        folder.mkdir(parents=True)
        cv2.imwrite(str(folder / "a.png"), np.zeros((20, 20, 3), np.uint8))
        for i in range(rejections // CLASSES):
            (folder / f"note{i:07d}.xml").touch()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rejections", type=int, nargs="+", default=[50_000, 200_000])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--code_dir", type=pathlib.Path, default=REPO)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="imgrec-rejections-") as work:
        for n in args.rejections:
            root = pathlib.Path(work) / f"in{n}"
            make_tree(root, n)
            argv = [args.python, "-m", "pipeline.run", f"--input={root}", f"--output={work}/out{n}",
                    "--height=16", "--width=16", "--progress_interval=0"]
            with tempfile.TemporaryFile() as log:
                run = run_tree(argv, log, cwd=args.code_dir)
                if run["exit"] != 0:
                    log.seek(0)
                    raise SystemExit(f"exit {run['exit']}: {log.read().decode(errors='replace')[-2000:]}")
            rows.append([f"{n:,}", f"{run['seconds']:.1f}", f"{run['peak_rss'] / 2**20:.0f}"])
    print(format_table(["rejections", "seconds", "peak MiB"], rows))


if __name__ == "__main__":
    main()
