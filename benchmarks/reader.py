"""The tf.data reader against the reader of an earlier revision, on the same dataset.

    python -m benchmarks.reader --baseline_rev REV [--images 10000] [--num_shards 64] [--rounds 5]

Converts the first N images of the benchmark corpus once (JPEG records, as `make bench`'s reader
figure, but in `--num_shards` shards per split, so that per-shard costs show), then iterates its
train split with `load_dataset(batch_size=64)` in a fresh process, alternating this checkout's
reader and REV's (a temporary git worktree) for `--rounds` rounds. Prints images/s after import
for each and the median of the per-round ratios (head / baseline).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

from benchmarks.make_corpus import make_corpus
from benchmarks.run import LAYOUT_FLAGS, PYTHON, REPO, baseline_checkout, reader_run, remove_checkout
from pipeline.tables import format_table


def convert(corpus: pathlib.Path, output: pathlib.Path, num_shards: int) -> None:
    done = subprocess.run([PYTHON, "-m", "pipeline.run", f"--input={corpus}", f"--output={output}",
                           *LAYOUT_FLAGS["jpeg"], f"--num_shards={num_shards}", "--progress_interval=0"],
                          cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr[-5000:])
        raise SystemExit(f"converting {corpus} exited with {done.returncode}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline_rev", required=True, help="git revision whose reader is the baseline")
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--num_shards", type=int, default=64, help="shards per split")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=pathlib.Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    baseline, sha = baseline_checkout(args.baseline_rev)
    rows, ratios = [], []
    try:
        with tempfile.TemporaryDirectory(prefix="imgrec-reader-") as scratch:
            output = pathlib.Path(scratch) / "out"
            convert(make_corpus(args.images), output, args.num_shards)
            for round_index in range(args.rounds):
                order = [("head", REPO), ("baseline", baseline)]
                if round_index % 2:
                    order.reverse()
                rate = {name: reader_run(output, code=code)["images_per_s"] for name, code in order}
                ratios.append(rate["head"] / rate["baseline"])
                rows.append((f"r{round_index}", f"{rate['head']:.0f}", f"{rate['baseline']:.0f}",
                             f"{ratios[-1]:.2f}"))
    finally:
        remove_checkout(baseline)
    print(format_table(("round", "head img/s", f"{args.baseline_rev} img/s", "ratio"), rows))
    print(f"median ratio (head / {args.baseline_rev}): {statistics.median(ratios):.2f} over {args.rounds} rounds")
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(["python -m benchmarks.reader", *sys.argv[1:]]),
                                        "baseline": {"rev": args.baseline_rev, "sha": sha},
                                        "rounds": [dict(zip(("round", "head", "baseline", "ratio"), row))
                                                   for row in rows],
                                        "median_ratio": round(statistics.median(ratios), 3)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
