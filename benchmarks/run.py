"""`make bench`: imgrec against the seed script and a framework-free ceiling, side by side.

    python -m benchmarks.run [--images 10000] [--config configs/seed.yaml]
                             [--out benchmarks/results/latest.json]

Every contender runs as its own process tree and is timed wall-clock, start-up included:

  (a) seed      benchmarks/seed_script.py: sequential glob → imread → resize → float → TFRecordWriter
  (b) ceiling   benchmarks/ceiling.py: the pipeline's per-image functions in a bare loop, one
                process per core, no framework
  (c) pipeline  python -m pipeline.run --config=<config> on DirectRunner multi_processing, 2 workers

(a) and (c) with the seed config write identical records. (b) and (c) also run on a quarter of the
corpus: the difference between the two sizes gives the steady-state rate (start-up and other
fixed costs cancel) and the memory growth. (c) runs once more with --num_shards=8 (same records,
8 files per split instead of 1) to show what the config's three shard files cost in parallelism. A jpeg-encoded run of (c) is read back with
`pipeline.reader.load_dataset` to time the reader. Peak memory is the highest sum of RSS over the
whole process tree (the runner and its worker processes), sampled every 0.1 s. Outputs are
deleted after each measurement.

The machine may be shared: before each run the harness waits (up to --quiet_wait s) for other
work to drop under 25% of the CPUs, records the background load seen during the run, and with
--repeat N keeps the fastest of N runs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import threading
import time
from typing import Optional, Sequence

import psutil

from benchmarks.make_corpus import describe, make_corpus

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SCRATCH = RESULTS / "tmp"  # gitignored
PYTHON = sys.executable
PIPELINE_FLAGS = ("--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2")
QUIET_WAIT = 60.0  # s to wait, before each run, for other work on the machine to settle
TARGETS = {"pipeline_vs_seed_min": 1.8, "ceiling_vs_pipeline_steady_max": 1.3, "memory_growth_4x_max": 1.5,
           "reader_vs_ceiling_min": 1.0}


def _busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


class TreeMonitor:
    """Polls a process and all its descendants every `interval` s: peak summed RSS, CPU seconds.

    Summing RSS counts pages shared between processes (libraries) once per process, so it
    overstates memory slightly; it never misses a worker the way the parent's own RSS (or
    ru_maxrss, the largest single process) would. Machine-wide busy CPU over the same period,
    minus the tree's own, is reported as background load: other work on the machine slows every
    contender, so results are only comparable when it is low.
    """

    def __init__(self, pid: int, interval: float = 0.1):
        self._root = psutil.Process(pid)
        self._interval = interval
        self.peak = 0
        self._cpu: dict[int, float] = {}
        self._busy_start, self._start = _busy_seconds(), time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self._root, *self._root.children(recursive=True)]
            except psutil.Error:
                break
            total = 0
            for proc in procs:
                try:
                    with proc.oneshot():
                        total += proc.memory_info().rss
                        times = proc.cpu_times()
                    self._cpu[proc.pid] = times.user + times.system
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self._interval)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        wall = time.perf_counter() - self._start
        cpu = sum(self._cpu.values())
        background = max(0.0, _busy_seconds() - self._busy_start - cpu)
        return {"peak_rss": self.peak, "cpu_seconds": cpu,
                "background_cpu_share": background / (wall * (os.cpu_count() or 1))}


def wait_for_quiet(max_wait: float, threshold: float = 0.25) -> float:
    """Waits (up to max_wait s) until other work uses under `threshold` of the machine's CPU."""
    start = time.perf_counter()
    while time.perf_counter() - start < max_wait:
        if psutil.cpu_percent(interval=2.0) / 100 < threshold:
            break
    return time.perf_counter() - start


def folder_bytes(path: pathlib.Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed(name: str, argv: Sequence[str], output: pathlib.Path, images: int, keep: bool = False,
          parse_json: bool = False) -> dict:
    """Runs one contender to completion as a process tree; wall time, peak tree RSS, output size."""
    env = dict(os.environ, PATH=f"{pathlib.Path(PYTHON).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               TF_CPP_MIN_LOG_LEVEL="2")
    if output.exists():
        shutil.rmtree(output) if output.is_dir() else output.unlink()
    output.parent.mkdir(parents=True, exist_ok=True)
    waited = wait_for_quiet(QUIET_WAIT)
    print(f"[{name}] {' '.join(argv)}", flush=True)
    start = time.perf_counter()
    proc = subprocess.Popen(list(argv), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    monitor = TreeMonitor(proc.pid)
    stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - start
    usage = monitor.stop()
    peak = usage["peak_rss"]
    if proc.returncode != 0:
        sys.stderr.write(stderr[-5000:])
        raise SystemExit(f"[{name}] exited with {proc.returncode}")
    result = {"name": name, "command": " ".join(argv), "images": images, "seconds": round(seconds, 2),
              "images_per_s": round(images / seconds, 1), "peak_rss_mib": round(peak / 2**20, 1),
              "output_bytes": folder_bytes(output), "cpu_seconds": round(usage["cpu_seconds"], 1),
              "cpu_ms_per_image": round(1e3 * usage["cpu_seconds"] / images, 2),
              "background_cpu_share": round(usage["background_cpu_share"], 2), "waited_for_quiet_s": round(waited, 1)}
    if parse_json:
        result["detail"] = json.loads(stdout.strip().splitlines()[-1])
    if not keep:
        shutil.rmtree(output, ignore_errors=True) if output.is_dir() else output.unlink(missing_ok=True)
    print(f"[{name}] {images} images in {seconds:.1f} s = {images / seconds:.1f} images/s, "
          f"peak RSS {peak / 2**20:.0f} MiB, output {result['output_bytes'] / 2**20:.0f} MiB, "
          f"{result['cpu_ms_per_image']} CPU ms/image, background load {result['background_cpu_share']:.0%}",
          flush=True)
    return result


REPEAT = 1  # runs per contender; the fastest is kept (background load only ever slows a run down)


def best_of(name: str, argv: Sequence[str], output: pathlib.Path, images: int, keep: bool = False,
            parse_json: bool = False) -> dict:
    runs = [timed(name, argv, output, images, keep=False, parse_json=parse_json) for _ in range(REPEAT - 1)]
    runs.append(timed(name, argv, output, images, keep=keep, parse_json=parse_json))
    best = min(runs, key=lambda r: r["seconds"])
    best["all_seconds"] = [r["seconds"] for r in runs]
    return best


def seed_run(corpus: pathlib.Path, images: int) -> dict:
    out = SCRATCH / "seed.tfrecord"
    return best_of("a_seed", [PYTHON, "benchmarks/seed_script.py", str(corpus), str(out)], out, images)


def ceiling_run(corpus: pathlib.Path, images: int, config: str, processes: int, tag: str = "",
                extra: Sequence[str] = ()) -> dict:
    out = SCRATCH / f"ceiling{tag}"
    return best_of(f"b_ceiling{tag}", [PYTHON, "-m", "benchmarks.ceiling", str(corpus), str(out), f"--config={config}",
                                     f"--processes={processes}", *extra], out, images, parse_json=True)


def pipeline_run(corpus: pathlib.Path, images: int, config: str, tag: str = "", extra: Sequence[str] = (),
                 keep: bool = False) -> dict:
    out = SCRATCH / f"pipeline{tag}"
    return best_of(f"c_pipeline{tag}", [PYTHON, "-m", "pipeline.run", f"--config={config}", *PIPELINE_FLAGS,
                                      f"--input={corpus}", f"--output={out}", "--overwrite", *extra],
                 out, images, keep=keep)


READER_SNIPPET = """
import json, sys, time
start = time.perf_counter()
from pipeline.reader import load_dataset
import tensorflow as tf
out, split = sys.argv[1], sys.argv[2]
ds = load_dataset(out, split, batch_size=64)
built = time.perf_counter()
images = batches = 0
first = None
for images_batch, labels in ds:
    images += int(images_batch.shape[0]); batches += 1
    if first is None:
        first, first_images = time.perf_counter(), images
end = time.perf_counter()
print(json.dumps({"images": images, "batches": batches, "import_and_build_s": built - start,
                  "iterate_s": end - built, "steady_s": end - first, "steady_images": images - first_images}))
"""


def reader_run(output: pathlib.Path, split: str = "train") -> dict:
    """Iterates one split with load_dataset(batch_size=64); rates exclude TensorFlow's import."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    start = time.perf_counter()
    proc = subprocess.Popen([PYTHON, "-c", READER_SNIPPET, str(output), split], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    monitor = TreeMonitor(proc.pid)
    stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - start
    peak = monitor.stop()["peak_rss"]
    if proc.returncode != 0:
        sys.stderr.write(stderr[-5000:])
        raise SystemExit(f"[reader] exited with {proc.returncode}")
    detail = json.loads(stdout.strip().splitlines()[-1])
    result = {"split": split, "images": detail["images"], "batches": detail["batches"],
              "process_seconds": round(seconds, 2), "import_and_build_s": round(detail["import_and_build_s"], 2),
              "iterate_s": round(detail["iterate_s"], 2),
              "images_per_s": round(detail["images"] / detail["iterate_s"], 1),
              "steady_images_per_s": round(detail["steady_images"] / detail["steady_s"], 1),
              "peak_rss_mib": round(peak / 2**20, 1)}
    print(f"[reader] {result['images']} images in {result['iterate_s']:.2f} s = {result['images_per_s']:.0f} "
          f"images/s (after import), peak RSS {peak / 2**20:.0f} MiB", flush=True)
    return result


def steady_rate(big: dict, small: dict) -> float:
    """Images/s of the extra images a larger run converts: fixed costs cancel out."""
    return round((big["images"] - small["images"]) / (big["seconds"] - small["seconds"]), 1)


def versions() -> dict:
    from importlib import metadata

    found = {}
    for package in ("apache-beam", "opencv-python-headless", "numpy", "tensorflow-cpu", "scikit-image", "psutil"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return found


def machine() -> dict:
    return {"cpu_count": os.cpu_count(), "cpu_affinity": len(os.sched_getaffinity(0)),
            "cpu_model": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                               if line.startswith("model name")), platform.processor()),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1), "python": platform.python_version(),
            "platform": platform.platform(), "packages": versions()}


def verdict(value: float, limit: float, at_least: bool) -> str:
    return "met" if (value >= limit if at_least else value <= limit) else "NOT met"


def table(results: dict) -> str:
    rows = [("run", "images", "seconds", "images/s", "peak RSS MiB", "output MiB")]
    for key in ("a_seed", "b_ceiling", "c_pipeline", "b_ceiling_quarter", "c_pipeline_quarter", "c_pipeline_sharded",
                "c_pipeline_sharded_quarter", "c_pipeline_jpeg"):
        r = results["runs"].get(key)
        if r:
            rows.append((key, str(r["images"]), f"{r['seconds']:.1f}", f"{r['images_per_s']:.1f}",
                         f"{r['peak_rss_mib']:.0f}", f"{r['output_bytes'] / 2**20:.0f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    for name, figure in results["ratios"].items():
        lines.append(f"{name:44s} {figure['value']:6.2f}   target {figure['target']}   {figure['verdict']}")
    steady = results.get("steady_state")
    if steady:
        lines.append("steady state (extra images / extra seconds, N vs N/4): " + ", ".join(
            f"{k.replace('_images_per_s', '')} {v:.0f}/s" for k, v in steady.items()))
    reader = results.get("reader")
    if reader:
        lines.append(f"reader (jpeg records, batch 64): {reader['images_per_s']:.0f} images/s after import "
                     f"({reader['images']} images); ceiling decode loop: {results['runs']['b_ceiling']['images_per_s']:.0f} images/s")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    global QUIET_WAIT, REPEAT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--config", default="configs/seed.yaml")
    parser.add_argument("--out", default=str(RESULTS / "latest.json"))
    parser.add_argument("--processes", type=int, default=2, help="ceiling processes (one per core)")
    parser.add_argument("--pipeline_flags", default="", help="extra flags for every pipeline run, space-separated")
    parser.add_argument("--quiet_wait", type=float, default=QUIET_WAIT,
                        help="max seconds to wait before each run for background CPU load to drop below 25%%")
    parser.add_argument("--repeat", type=int, default=1, help="runs per contender; the fastest is reported")
    parser.add_argument("--sharded", type=int, default=8,
                        help="also run the pipeline with --num_shards=N per split (same records, more files) "
                             "to show the cost of the config's few shards; 0 skips it")
    parser.add_argument("--skip", default="", help="comma-separated: seed, quarter, jpeg, reader")
    args = parser.parse_args(argv)
    QUIET_WAIT, REPEAT = args.quiet_wait, max(1, args.repeat)
    skip = set(filter(None, args.skip.split(",")))
    extra = args.pipeline_flags.split()

    free = shutil.disk_usage(REPO).free
    need = args.images * 620_000 * 1.1
    if free < need:
        raise SystemExit(f"need ~{need / 2**30:.1f} GiB free for one raw output; {free / 2**30:.1f} GiB free")
    quarter = max(1, args.images // 4)
    corpus = make_corpus(args.images)
    corpus_small = make_corpus(quarter)
    results: dict = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "command": " ".join([os.path.relpath(PYTHON, REPO), "-m", "benchmarks.run", *(argv or sys.argv[1:])]),
                     "config": args.config, "pipeline_flags": list(PIPELINE_FLAGS) + extra,
                     "machine": machine(), "corpus": describe(corpus), "runs": {}}
    runs = results["runs"]
    if "seed" not in skip:
        runs["a_seed"] = seed_run(corpus, args.images)
    runs["b_ceiling"] = ceiling_run(corpus, args.images, args.config, args.processes)
    runs["c_pipeline"] = pipeline_run(corpus, args.images, args.config, extra=extra)
    if "quarter" not in skip:
        runs["b_ceiling_quarter"] = ceiling_run(corpus_small, quarter, args.config, args.processes, "_quarter")
        runs["c_pipeline_quarter"] = pipeline_run(corpus_small, quarter, args.config, "_quarter", extra=extra)
    if args.sharded:
        flags = [f"--num_shards={args.sharded}", *extra]
        runs["c_pipeline_sharded"] = pipeline_run(corpus, args.images, args.config, "_sharded", flags)
        if "quarter" not in skip:
            runs["c_pipeline_sharded_quarter"] = pipeline_run(corpus_small, quarter, args.config,
                                                              "_sharded_quarter", flags)
    if "jpeg" not in skip:
        jpeg = ["--encoding=jpeg", "--normalize=none", *extra]
        keep = "reader" not in skip
        runs["c_pipeline_jpeg"] = pipeline_run(corpus, args.images, args.config, "_jpeg", jpeg, keep=keep)
        if keep:
            try:
                results["reader"] = reader_run(SCRATCH / "pipeline_jpeg")
            finally:
                shutil.rmtree(SCRATCH / "pipeline_jpeg", ignore_errors=True)

    a, b, c = runs.get("a_seed"), runs["b_ceiling"], runs["c_pipeline"]
    ratios = {}
    if a:
        value = c["images_per_s"] / a["images_per_s"]
        ratios["pipeline / seed (end to end)"] = {"value": round(value, 2), "target": ">= 1.8",
                                                  "verdict": verdict(value, 1.8, True)}
    ratios["ceiling / pipeline (end to end)"] = {"value": round(b["images_per_s"] / c["images_per_s"], 2),
                                                 "target": "info", "verdict": ""}
    if "quarter" not in skip:
        steady_b = steady_rate(b, runs["b_ceiling_quarter"])
        steady_c = steady_rate(c, runs["c_pipeline_quarter"])
        results["steady_state"] = {"ceiling_images_per_s": steady_b, "pipeline_images_per_s": steady_c,
                                   "ceiling_in_loop_images_per_s": b["detail"]["steady_images_per_s"]}
        value = steady_b / steady_c
        ratios["ceiling / pipeline (steady state)"] = {"value": round(value, 2), "target": "<= 1.3",
                                                       "verdict": verdict(value, 1.3, False)}
        if "c_pipeline_sharded_quarter" in runs:
            steady_s = steady_rate(runs["c_pipeline_sharded"], runs["c_pipeline_sharded_quarter"])
            results["steady_state"]["pipeline_sharded_images_per_s"] = steady_s
            ratios[f"ceiling / pipeline --num_shards={args.sharded} (steady)"] = {
                "value": round(steady_b / steady_s, 2), "target": "info", "verdict": ""}
        value = c["peak_rss_mib"] / runs["c_pipeline_quarter"]["peak_rss_mib"]
        ratios["pipeline peak RSS, 4x images"] = {"value": round(value, 2), "target": "< 1.5",
                                                  "verdict": verdict(value, 1.5 - 1e-9, False)}
    if results.get("reader"):
        value = results["reader"]["images_per_s"] / b["images_per_s"]
        ratios["reader / ceiling decode loop"] = {"value": round(value, 2), "target": ">= 1.0",
                                                  "verdict": verdict(value, 1.0, True)}
    results["ratios"] = ratios
    text = table(results)
    results["table"] = text
    print("\n" + text)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nwrote {out}")
    shutil.rmtree(SCRATCH, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
