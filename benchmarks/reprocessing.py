"""Scheduled reprocessing, measured: an incremental run and a resumed run against full runs.

    python -m benchmarks.reprocessing [--images 2000] [--added 100] [--replaced 20] [--kill_at 0.7]

1. A dataset of N ImageNet-like images (the first N of the benchmark corpus) is converted in
   full, then 5% new images are added and some replaced by other pictures; the incremental run
   (`--reuse_from=` the first dataset) must use at most 35% of the first run's CPU time and write
   exactly what a from-scratch run on the changed inputs writes.
2. A full run is killed (SIGKILL to the driver and every process it started) once `--kill_at` of
   its images are converted, then started again with the same command: the restart must use at
   most 50% of an uninterrupted run's CPU time and write exactly what the uninterrupted run wrote.

CPU time is that of the whole process tree (the driver, Beam's workers, imgrec's converters),
from the kernel's accounting of waited children plus psutil samples of the live tree.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Sequence

import psutil

from benchmarks.make_corpus import make_corpus
from benchmarks.run import TreeMonitor
from pipeline.tables import format_table

REPO = pathlib.Path(__file__).resolve().parents[1]
TARGETS = {"incremental": 0.35, "resumed": 0.50}
FLAGS = ("--runner=DirectRunner", "--progress_interval=0")


def imgrec(images: pathlib.Path, output: pathlib.Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.run", f"--input={images}", f"--output={output}", *FLAGS, *flags]


def measured(argv: Sequence[str], kill_when=None) -> dict:
    """Runs argv to its end (or kills its whole tree once `kill_when()` is true): wall seconds,
    CPU seconds of the tree, exit code."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    monitor = TreeMonitor(process.pid)
    killed = False
    # wait4, not poll(): the exit status and the tree's rusage come from the same reaping
    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    while not pid:
        if kill_when is not None and not killed and kill_when():
            os.killpg(process.pid, signal.SIGKILL)
            killed = True
        time.sleep(0.05)
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    process.returncode = os.waitstatus_to_exitcode(status)
    children = psutil.Process().children(recursive=True)
    for child in children:  # a killed tree's orphans, if any, must not run on
        child.kill()
    tree_cpu = usage.ru_utime + usage.ru_stime
    result = monitor.stop(tree_cpu)
    return {"seconds": time.perf_counter() - start, "cpu_seconds": result["cpu_seconds"], "killed": killed,
            "exit": os.waitstatus_to_exitcode(status), "stderr": process.stderr.read().decode()[-2000:]}


def published(output: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(output)): p.read_bytes() for p in sorted(output.rglob("*"))
            if p.is_file() and p.name != "metadata.json"}


def copy_images(paths: Sequence[pathlib.Path], corpus: pathlib.Path, target: pathlib.Path) -> None:
    for path in paths:
        destination = target / path.relative_to(corpus)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)


def converted(output: pathlib.Path) -> int:
    """Images in finished parts of a running conversion (the progress markers)."""
    progress = list((output / ".imgrec-staging").glob("run-*/progress/*-*"))
    return sum(int(p.name.rsplit("-", 1)[1]) for p in progress)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--added", type=int, default=100)
    parser.add_argument("--replaced", type=int, default=20)
    parser.add_argument("--kill_at", type=float, default=0.7)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "reprocessing.json"))
    args = parser.parse_args(argv)
    corpus = make_corpus(args.images + args.added + args.replaced)
    paths = sorted(corpus.glob("*/*.jpg"))
    base, added, replacements = (paths[:args.images], paths[args.images:args.images + args.added],
                                 paths[args.images + args.added:])
    rows, results, failures = [], {}, []
    with tempfile.TemporaryDirectory(prefix="imgrec-reprocessing-") as scratch:
        work = pathlib.Path(scratch)
        images = work / "images"
        copy_images(base, corpus, images)
        first = measured(imgrec(images, work / "first"))
        copy_images(added, corpus, images)
        for old, new in zip(base[::max(1, len(base) // args.replaced)][:args.replaced], replacements):
            shutil.copyfile(new, images / old.relative_to(corpus))
        incremental = measured(imgrec(images, work / "incremental", f"--reuse_from={work / 'first'}"))
        scratch_run = measured(imgrec(images, work / "scratch"))
        same = published(work / "incremental") == published(work / "scratch")
        reuse = json.loads((work / "incremental" / "metadata.json").read_text())["reuse"]
        results["incremental"] = {"first": first, "incremental": incremental, "from_scratch": scratch_run,
                                  "identical": same, "reuse": reuse}
        rows.append(("incremental (+%d new, %d replaced)" % (args.added, args.replaced), f"{first['cpu_seconds']:.1f}",
                     f"{incremental['cpu_seconds']:.1f}", f"{incremental['cpu_seconds'] / first['cpu_seconds']:.2f}",
                     f"<= {TARGETS['incremental']}", "yes" if same else "NO"))

        total = args.images + args.added
        uninterrupted = measured(imgrec(images, work / "uninterrupted"))
        killed = measured(imgrec(images, work / "resumed"),
                          kill_when=lambda: converted(work / "resumed") >= args.kill_at * total)
        restarted = measured(imgrec(images, work / "resumed"))
        same = published(work / "resumed") == published(work / "uninterrupted")
        resumed = json.loads((work / "resumed" / "metadata.json").read_text())["run"]["resumed_records"]
        results["resumed"] = {"uninterrupted": uninterrupted, "killed": killed, "restarted": restarted,
                              "identical": same, "resumed_records": resumed}
        rows.append((f"resumed (killed at {resumed}/{total} converted)", f"{uninterrupted['cpu_seconds']:.1f}",
                     f"{restarted['cpu_seconds']:.1f}",
                     f"{restarted['cpu_seconds'] / uninterrupted['cpu_seconds']:.2f}",
                     f"<= {TARGETS['resumed']}", "yes" if same else "NO"))
        for name, run in [*results["incremental"].items(), *results["resumed"].items()]:
            if isinstance(run, dict) and run.get("exit") not in (None, 0) and not run.get("killed"):
                failures.append(f"{name} exited {run['exit']}: {run['stderr']}")
    print(format_table(("run", "full CPU s", "this CPU s", "ratio", "target", "identical output"), rows))
    print(f"\n{args.images} ImageNet-like images, CPU seconds of the whole process tree; "
          f"`python -m benchmarks.reprocessing --images {args.images}`")
    pathlib.Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2, default=str))
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures or not all(r[-1] == "yes" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
