"""Scheduled reprocessing, measured: an incremental run and a resumed run against full runs.

    python -m benchmarks.reprocessing [--images 2000] [--added 100] [--replaced 20] [--kill_at 0.7] [--rounds 3]
                                      [--imgrec_flags="--normalize=none --encoding=jpeg"]

1. A dataset of N ImageNet-like images (the first N of the benchmark corpus) is converted in
   full, then 5% new images are added and some replaced by other pictures; the incremental run
   (`--reuse_from=` the first dataset) must use at most 35% of the first run's CPU time and write
   exactly what a from-scratch run on the changed inputs writes.
2. A full run is killed (SIGKILL to the driver and every process it started) once `--kill_at` of
   its images are converted, then started again with the same command: the restart must use at
   most 50% of an uninterrupted run's CPU time and write exactly what the uninterrupted run wrote.
   Converted images are those of finished parts, which the restart takes; the parts in
   progress at the kill are converted again.
3. A full run of the first `--smallest` images: the floor, what every run pays whatever it
   converts (Python, Beam, the converter processes, planning, publishing), as a share of the
   first run and of the uninterrupted one. No incremental run can cost less than the floor, and
   no restart less than the floor plus the images left to convert.

CPU time is that of the whole process tree (the driver, Beam's workers, imgrec's converters),
from the kernel's accounting of waited children plus psutil samples of the live tree. Every run
starts after `os.sync()`, so no run pays for writing back the previous run's output. `--rounds`
repeats both scenarios in fresh folders; the table gives the median of the per-round ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
from typing import Sequence

from benchmarks.make_corpus import make_corpus
from benchmarks.run import run_tree
from pipeline.tables import format_table

REPO = pathlib.Path(__file__).resolve().parents[1]
TARGETS = {"incremental": 0.35, "resumed": 0.50}
FLAGS = ("--runner=DirectRunner", "--progress_interval=0")


def imgrec(python: str, images: pathlib.Path, output: pathlib.Path, *flags: str) -> list[str]:
    return [python, "-m", "pipeline.run", f"--input={images}", f"--output={output}", *FLAGS, *flags]


def measured(argv: Sequence[str], kill_when=None) -> dict:
    """Runs argv to its end (or kills its whole tree once `kill_when()` is true): wall seconds,
    CPU seconds of the tree, exit code, the end of its output."""
    os.sync()  # the previous run's gigabytes are written back now, not charged to this run
    with tempfile.TemporaryFile() as log:
        run = run_tree(argv, log, cwd=REPO, kill_when=kill_when)
        log.seek(0)
        output = log.read().decode(errors="replace")
    return {"seconds": run["seconds"], "cpu_seconds": run["cpu_seconds"], "killed": run["killed"],
            "exit": run["exit"], "stderr": output[-2000:]}


def published(output: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(output)): p.read_bytes() for p in sorted(output.rglob("*"))
            if p.is_file() and p.name != "metadata.json"}


def copy_images(paths: Sequence[pathlib.Path], corpus: pathlib.Path, target: pathlib.Path) -> None:
    for path in paths:
        destination = target / path.relative_to(corpus)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)


def converted(output: pathlib.Path) -> int:
    """Images of the parts a running conversion has finished (its progress markers): what a
    restart takes; the parts in progress are converted again."""
    return sum(int(p.name.rsplit("-", 1)[1]) for p in (output / ".imgrec-staging").glob("run-*/progress/*-*"))


def one_round(args: argparse.Namespace, corpus: pathlib.Path, work: pathlib.Path) -> dict:
    """Both scenarios once, in `work`: every run's measurement and whether the outputs match."""
    paths = sorted(corpus.glob("*/*.jpg"))
    base, added, replacements = (paths[:args.images], paths[args.images:args.images + args.added],
                                 paths[args.images + args.added:])
    images, smallest_images = work / "images", work / "smallest-images"
    copy_images(base, corpus, images)
    copy_images(base[:args.smallest], corpus, smallest_images)
    settings = args.imgrec_flags.split()
    first = measured(imgrec(args.python, images, work / "first", *settings))
    smallest = measured(imgrec(args.python, smallest_images, work / "smallest", *settings))
    copy_images(added, corpus, images)
    for old, new in zip(base[::max(1, len(base) // args.replaced)][:args.replaced], replacements):
        shutil.copyfile(new, images / old.relative_to(corpus))
    incremental = measured(imgrec(args.python, images, work / "incremental", *settings,
                                  f"--reuse_from={work / 'first'}"))
    scratch_run = measured(imgrec(args.python, images, work / "scratch", *settings))
    reuse = json.loads((work / "incremental" / "metadata.json").read_text())["reuse"]
    total = args.images + args.added
    uninterrupted = measured(imgrec(args.python, images, work / "uninterrupted", *settings))
    killed = measured(imgrec(args.python, images, work / "resumed", *settings),
                      kill_when=lambda: converted(work / "resumed") >= args.kill_at * total)
    restarted = measured(imgrec(args.python, images, work / "resumed", *settings))
    resumed = json.loads((work / "resumed" / "metadata.json").read_text())["run"]["resumed_records"]
    return {"smallest": {"first": first, "uninterrupted": uninterrupted, "smallest": smallest},
            "incremental": {"first": first, "incremental": incremental, "from_scratch": scratch_run,
                            "identical": published(work / "incremental") == published(work / "scratch"),
                            "reuse": reuse},
            "resumed": {"uninterrupted": uninterrupted, "killed": killed, "restarted": restarted,
                        "identical": published(work / "resumed") == published(work / "uninterrupted"),
                        "resumed_records": resumed}}


def ratio_row(name: str, rounds: list[dict], full: str, this: str, target: str) -> tuple[str, ...]:
    """One table row over the rounds: median CPU seconds, the median of the per-round ratios."""
    fulls = [r[full]["cpu_seconds"] for r in rounds]
    these = [r[this]["cpu_seconds"] for r in rounds]
    ratios = [t / f for t, f in zip(these, fulls)]
    identical = "" if "identical" not in rounds[0] else "yes" if all(r["identical"] for r in rounds) else "NO"
    return (name, f"{statistics.median(fulls):.1f}", f"{statistics.median(these):.1f}",
            f"{statistics.median(ratios):.2f} ({' '.join(f'{x:.2f}' for x in ratios)})", target, identical)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--added", type=int, default=100)
    parser.add_argument("--replaced", type=int, default=20)
    parser.add_argument("--kill_at", type=float, default=0.7)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smallest", type=int, default=100,
                        help="images of the smallest full run, measured as the floor every run pays")
    parser.add_argument("--imgrec_flags", default="",
                        help="output settings for every imgrec run (default: imgrec's, raw float32 records)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter imgrec runs with (e.g. .venv-bench/bin/python: the default install)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "reprocessing.json"))
    args = parser.parse_args(argv)
    corpus = make_corpus(args.images + args.added + args.replaced)
    rounds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="imgrec-reprocessing-") as scratch:
            rounds.append(one_round(args, corpus, pathlib.Path(scratch)))
    incremental = [r["incremental"] for r in rounds]
    resumed = [r["resumed"] for r in rounds]
    total = args.images + args.added
    rows = [ratio_row(f"incremental (+{args.added} new, {args.replaced} replaced) vs first run", incremental,
                      "first", "incremental", f"<= {TARGETS['incremental']}"),
            ratio_row("incremental vs from scratch", incremental, "from_scratch", "incremental",
                      f"<= {TARGETS['incremental']}"),
            ratio_row(f"restarted (killed at {'/'.join(str(r['resumed_records']) for r in resumed)} of {total} "
                      "converted) vs uninterrupted", resumed, "uninterrupted", "restarted", f"<= {TARGETS['resumed']}"),
            ratio_row(f"floor: full run of the first {args.smallest} images vs first run",
                      [r["smallest"] for r in rounds], "first", "smallest", ""),
            ratio_row("floor vs uninterrupted", [r["smallest"] for r in rounds], "uninterrupted", "smallest", "")]
    failures = [f"{name} exited {run['exit']}: {run['stderr']}"
                for scenario in (*incremental, *resumed, *({"smallest": r["smallest"]["smallest"]} for r in rounds))
                for name, run in scenario.items()
                if isinstance(run, dict) and run.get("exit") not in (None, 0) and not run.get("killed")]
    print(format_table(("run", "full CPU s", "this CPU s", "ratio (per round)", "target", "identical output"), rows))
    settings = f' --imgrec_flags="{args.imgrec_flags}"' if args.imgrec_flags else ""
    settings += f" --smallest {args.smallest}" if args.smallest != parser.get_default("smallest") else ""
    settings += f" --python {args.python}" if args.python != parser.get_default("python") else ""
    print(f"\n{args.images} ImageNet-like images, CPU seconds of the whole process tree, medians of "
          f"{args.rounds} rounds; `python -m benchmarks.reprocessing --images {args.images} --rounds {args.rounds}"
          f"{settings}`")
    pathlib.Path(args.out).write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=2, default=str))
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures or not all(r[-1] in ("yes", "") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
