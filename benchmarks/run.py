"""`make bench`: imgrec against the scripts it replaces, a framework-free ceiling and an older
revision of itself, interleaved on one machine (issue 10's targets).

    python -m benchmarks.run [--images 10000] [--rounds 2] [--photos 300] [--baseline_rev SHA]
                             [--contenders PATTERNS] [--skip PATTERNS] [--list]
                             [--out benchmarks/results/latest.json]
    python -m benchmarks.run --merge A.json B.json --out C.json   # pool earlier runs' rounds

Contenders (`--list` prints each one's command). Peers are written as a user would, with no
imgrec imports; all write 224x224 RGB, bicubic stretch, tf.train.Example (image bytes + label):

  seed_float32, seq_uint8, seq_jpeg   benchmarks/seed_script.py: the seed's sequential loop
                                      (float32 x/255, uint8, JPEG q90 records)
  pool_uint8, pool_jpeg, pool_float32 benchmarks/pool_script.py: multiprocessing.Pool(2), cv2,
                                      one TFRecordWriter per process
  tfdata_uint8, tfdata_jpeg, ...      benchmarks/tfdata_script.py: tf.data parallel map
                                      (decode_jpeg + resize bicubic), Python Example loop
  imgrec_uint8, imgrec_jpeg, ...      the user's plain command, no running-mode flags:
                                      python -m pipeline.run --runner=DirectRunner --input --output
                                      --normalize=none [--encoding=jpeg --quality=90]
                                      (imgrec_float32: --normalize=unit --encoding=raw)
  imgrec_uint8_gcp_extra              imgrec_uint8 with the harness's own interpreter, whose
                                      virtualenv has the gcp and test extras (see --python)
  prism_uint8                         the same command with --runner=PrismRunner and the Prism
                                      binary of `make engines`, in a loopback-only network
                                      namespace (`unshare --net`, root); not in the default set
  ceiling_uint8, ceiling_jpeg         benchmarks/ceiling.py: imgrec's per-image functions in a bare
                                      loop, 2 processes, same output settings as imgrec_uint8/_jpeg
  *@quarter                           the same on the first N/4 images (steady state, fixed cost,
                                      memory growth)
  *@photos                            on the large-photo corpus (4000x3000 JPEGs, make_photos.py),
                                      --interpolation=area
  baseline_*                          imgrec at --baseline_rev, checked out into a temporary git
                                      worktree, same commands

Every round runs every selected contender once (round-robin, in a seeded random order per round,
so no contender always follows the same neighbour; outputs are deleted and synced between runs,
so a float32 run's writeback does not land in the next run), each as a whole process tree from
start-up to exit: wall seconds, CPU seconds of the
tree (rusage of the reaped tree, or the sum of its polled processes if larger), peak summed RSS
of the tree (sampled every 0.1 s). Each run's output is checked (record count and record size for
its layout) and then deleted. Ratios are computed per round from runs of that round and
summarized by the median over rounds (benchmarks/ratios.py). With --rounds 2, the median is the
mean of the two rounds; the worst round is shown too.

Contenders run with --python's interpreter. `make bench` passes a virtualenv holding imgrec's
default install (`pip install -e .`, no extras), what a user converting local files has; the
harness itself runs in the development virtualenv, and so do baseline_* (an older revision's
default install differs) and imgrec_uint8_gcp_extra. The gcp extra (gs:// paths, Dataflow) makes
`import apache_beam` load Google's client libraries, a fixed cost of every run that
imgrec_uint8_gcp_extra measures.

The machine may be shared: before each run the harness waits (up to --quiet_wait s) for other
work to drop under 25% of the CPUs, records the background load seen during the run (machine-wide
busy CPU minus the tree's own, as a share of all CPUs), and re-runs a contender whose run saw more
than --rerun_above of it (at most --max_reruns times, keeping the least disturbed attempt).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import fnmatch
import json
import os
import pathlib
import platform
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import BinaryIO, Callable, Optional, Sequence

import psutil

from benchmarks.make_corpus import describe, make_corpus
from benchmarks.make_photos import make_photos
from benchmarks.ratios import QUIET, Target, evaluate, steady_state, summarize
from pipeline.tables import format_table
from tests.engines.engines import prism_binary

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SCRATCH = RESULTS / "tmp"  # gitignored
PYTHON = sys.executable
QUIET_WAIT = 30.0  # s to wait, before each run, for other work on the machine to settle

# Prism listens on every interface; run it where the only interface is loopback.
LOOPBACK_ONLY = ("unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh")

RAW_UINT8, RAW_FLOAT32 = 224 * 224 * 3, 224 * 224 * 3 * 4

PLAIN = ("-m", "pipeline.run", "--runner=DirectRunner", "--input={input}", "--output={output}")
# The seed script's resize (stretch, cubic) for every layout, spelled out: imgrec's defaults changed
# (0.4.2) and a baseline revision must convert the same way.
_STRETCH = ("--resize_mode=stretch", "--interpolation=cubic")
LAYOUT_FLAGS = {"uint8": (*_STRETCH, "--normalize=none", "--encoding=raw"),
                "jpeg": (*_STRETCH, "--normalize=none", "--encoding=jpeg", "--quality=90"),
                "float32": (*_STRETCH, "--normalize=unit", "--encoding=raw"),
                "area": ("--resize_mode=stretch", "--normalize=none", "--encoding=raw", "--interpolation=area")}


@dataclasses.dataclass(frozen=True)
class Contender:
    name: str
    argv: tuple[str, ...]  # "{input}" / "{output}" are filled in; "python" is the venv's
    corpus: str  # "full", "quarter" or "photos"
    layout: str  # "uint8", "float32" or "jpeg": what the records must hold
    output_is_dir: bool
    code: str = "head"  # "head": this checkout; "baseline": the --baseline_rev worktree
    doc: str = ""
    # Runs with the harness's interpreter (the development virtualenv: test and gcp extras), not --python.
    harness_python: bool = False


def catalogue(imgrec_flags: Sequence[str] = ()) -> dict[str, Contender]:
    """Every contender the harness knows, by name."""
    found: list[Contender] = []
    seq = {"float32": ("seed_float32", ()), "uint8": ("seq_uint8", ("--dtype=uint8",)),
           "jpeg": ("seq_jpeg", ("--encoding=jpeg",))}
    for layout, (name, flags) in seq.items():
        found.append(Contender(name, ("python", "benchmarks/seed_script.py", "{input}", "{output}", *flags),
                               "full", layout, False, doc="sequential seed loop"))
    peer_flags = {"uint8": (), "jpeg": ("--jpeg",), "float32": ("--float32",)}
    for layout, flags in peer_flags.items():
        found.append(Contender(f"pool_{layout}", ("python", "benchmarks/pool_script.py", "{input}", "{output}", *flags),
                               "full", layout, True, doc="multiprocessing Pool(2) script"))
        found.append(Contender(f"tfdata_{layout}", ("python", "benchmarks/tfdata_script.py", "{input}", "{output}",
                                                    *flags), "full", layout, False, doc="tf.data script"))
    found.append(Contender("pool_area@photos", ("python", "benchmarks/pool_script.py", "{input}", "{output}",
                                                "--interpolation=area"), "photos", "uint8", True,
                           doc="multiprocessing Pool(2) script, area"))
    # An older revision's default install differs (5188ed2's needed apache-beam[tfrecord]): it runs
    # in the development virtualenv, where it always has.
    for code, prefix, dev_venv in (("head", "imgrec", False), ("baseline", "baseline", True)):
        for layout in ("uint8", "jpeg", "float32"):
            argv = ("python", *PLAIN, *LAYOUT_FLAGS[layout], *imgrec_flags)
            found.append(Contender(f"{prefix}_{layout}", argv, "full", layout, True, code, "plain command", dev_venv))
            found.append(Contender(f"{prefix}_{layout}@quarter", argv, "quarter", layout, True, code, "plain command",
                                   dev_venv))
        found.append(Contender(f"{prefix}_area@photos", ("python", *PLAIN, *LAYOUT_FLAGS["area"], *imgrec_flags),
                               "photos", "uint8", True, code, "plain command, area", dev_venv))
    found.append(Contender("imgrec_uint8_gcp_extra", ("python", *PLAIN, *LAYOUT_FLAGS["uint8"], *imgrec_flags),
                           "full", "uint8", True, doc="plain command, gcp extra installed", harness_python=True))
    on_prism = tuple("--runner=PrismRunner" if flag == "--runner=DirectRunner" else flag for flag in PLAIN)
    prism = (*LOOPBACK_ONLY, "python", *on_prism, f"--prism_location={prism_binary()}", *LAYOUT_FLAGS["uint8"],
             *imgrec_flags)
    found.append(Contender("prism_uint8", prism, "full", "uint8", True, doc="plain command on Prism"))
    found.append(Contender("prism_uint8@quarter", prism, "quarter", "uint8", True, doc="plain command on Prism"))
    ceiling = ("python", "-m", "benchmarks.ceiling", "{input}", "{output}", "--config=", "--processes=2")
    for name, corpus, layout in (("ceiling_uint8", "full", "uint8"), ("ceiling_jpeg", "full", "jpeg"),
                                 ("ceiling_uint8@quarter", "quarter", "uint8")):
        found.append(Contender(name, (*ceiling, *LAYOUT_FLAGS[layout]), corpus, layout, True,
                               doc="bare loop, 2 processes"))
    return {c.name: c for c in found}


DEFAULT = ("seed_float32", "seq_uint8", "seq_jpeg", "pool_uint8", "pool_jpeg", "tfdata_uint8",
           "imgrec_uint8", "imgrec_jpeg", "imgrec_float32", "imgrec_uint8@quarter", "imgrec_float32@quarter",
           "ceiling_uint8", "ceiling_uint8@quarter", "imgrec_area@photos", "pool_area@photos",
           "baseline_area@photos", "imgrec_uint8_gcp_extra", "ceiling_jpeg")

TARGETS = (
    Target("imgrec uint8 vs Pool script", "speedup", "imgrec_uint8", "pool_uint8", limit=1.1),
    Target("imgrec uint8 vs sequential script", "speedup", "imgrec_uint8", "seq_uint8", limit=1.8),
    Target("imgrec jpeg vs Pool script", "speedup", "imgrec_jpeg", "pool_jpeg", limit=1.1),
    Target("imgrec jpeg vs sequential script", "speedup", "imgrec_jpeg", "seq_jpeg", limit=1.8),
    Target("imgrec float32 vs float32 seed", "speedup", "imgrec_float32", "seed_float32", limit=1.8),
    Target("steady state imgrec / ceiling (uint8)", "steady", "imgrec_uint8", "ceiling_uint8",
           "imgrec_uint8@quarter", "ceiling_uint8@quarter", limit=0.9),
    Target("fixed cost imgrec uint8 (s)", "intercept", "imgrec_uint8", a_small="imgrec_uint8@quarter",
           limit=3.0, at_least=False),
    Target("photos area: imgrec vs baseline rev", "speedup", "imgrec_area@photos", "baseline_area@photos", limit=2.5),
    Target("peak RSS growth imgrec uint8, 4x images", "memory", "imgrec_uint8", a_small="imgrec_uint8@quarter",
           limit=1.2, at_least=False),
    Target("peak RSS growth imgrec float32, 4x images", "memory", "imgrec_float32", a_small="imgrec_float32@quarter",
           limit=1.2, at_least=False),
    Target("Prism / FnApiRunner, steady-state rate (uint8)", "steady", "prism_uint8", "imgrec_uint8",
           "prism_uint8@quarter", "imgrec_uint8@quarter", limit=1 / 1.2),
    Target("imgrec uint8, default install vs gcp extra installed", "speedup", "imgrec_uint8",
           "imgrec_uint8_gcp_extra"),
    Target("imgrec uint8 vs tf.data script", "speedup", "imgrec_uint8", "tfdata_uint8"),
    Target("imgrec jpeg vs tf.data script", "speedup", "imgrec_jpeg", "tfdata_jpeg"),
    Target("imgrec float32 vs Pool script", "speedup", "imgrec_float32", "pool_float32"),
    Target("ceiling vs imgrec uint8, end to end", "speedup", "ceiling_uint8", "imgrec_uint8"),
    Target("ceiling vs Pool script, uint8 (no framework)", "speedup", "ceiling_uint8", "pool_uint8"),
    Target("ceiling vs Pool script, jpeg (no framework)", "speedup", "ceiling_jpeg", "pool_jpeg"),
    Target("ceiling vs sequential script, uint8", "speedup", "ceiling_uint8", "seq_uint8"),
    Target("ceiling vs sequential script, jpeg", "speedup", "ceiling_jpeg", "seq_jpeg"),
    Target("fixed cost ceiling (s)", "intercept", "ceiling_uint8", a_small="ceiling_uint8@quarter", at_least=False),
    Target("photos area: imgrec vs Pool script", "speedup", "imgrec_area@photos", "pool_area@photos"),
    Target("imgrec uint8 vs baseline rev", "speedup", "imgrec_uint8", "baseline_uint8"),
    Target("imgrec jpeg vs baseline rev", "speedup", "imgrec_jpeg", "baseline_jpeg"),
    Target("imgrec float32 vs baseline rev", "speedup", "imgrec_float32", "baseline_float32"),
)


def select(names: Sequence[str], include: str, skip: str, have_baseline: bool) -> list[str]:
    """Contender names matching `include` (comma-separated fnmatch patterns; "default" stands for
    DEFAULT) and none of `skip`, in catalogue order; baseline_* only with a baseline revision."""
    patterns = [p for p in include.split(",") if p]
    chosen = set()
    for pattern in patterns:
        chosen |= set(DEFAULT) if pattern == "default" else set(fnmatch.filter(names, pattern))
    unknown = chosen - set(names)
    if unknown:
        raise SystemExit(f"unknown contenders {sorted(unknown)}; --list shows them")
    skips = [p for p in skip.split(",") if p]
    chosen = {n for n in chosen if not any(fnmatch.fnmatch(n, p) for p in skips)}
    if not have_baseline:
        chosen = {n for n in chosen if not n.startswith("baseline_")}
    return [n for n in names if n in chosen]


# ---------------------------------------------------------------------------------------------
# Measuring one run


def _busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


class TreeMonitor:
    """Polls a process and all its descendants every `interval` s: peak summed RSS, CPU seconds.

    Summing RSS counts pages shared between processes (libraries) once per process, so it
    overstates memory slightly; it never misses a worker the way the parent's own RSS (or
    ru_maxrss, the largest single process) would. Machine-wide busy CPU over the same period,
    minus the tree's own, is reported as background load.
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

    def stop(self, tree_cpu: float) -> dict:
        self._stop.set()
        self._thread.join()
        wall = time.perf_counter() - self._start
        cpu = max(tree_cpu, sum(self._cpu.values()))
        background = max(0.0, _busy_seconds() - self._busy_start - cpu)
        return {"peak_rss": self.peak, "cpu_seconds": cpu,
                "background_cpu_share": background / (wall * (os.cpu_count() or 1))}


def run_tree(argv: Sequence[str], log: BinaryIO, cwd: Optional[pathlib.Path] = None, env: Optional[dict] = None,
             kill_when: Optional[Callable[[], bool]] = None) -> dict:
    """Runs argv as a process tree, output to `log`, to its end, or kills the whole tree once
    `kill_when()` is true: wall seconds, exit code, whether it was killed, CPU seconds of the
    tree, peak summed RSS, background CPU share (`TreeMonitor`)."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    monitor = TreeMonitor(process.pid)
    killed = False
    # wait4, not poll(): the exit status and the tree's rusage come from the same reaping
    pid, status, rusage = os.wait4(process.pid, os.WNOHANG if kill_when else 0)
    while not pid:
        if not killed and kill_when():
            os.killpg(process.pid, signal.SIGKILL)
            killed = True
        time.sleep(0.05)
        pid, status, rusage = os.wait4(process.pid, os.WNOHANG)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if killed:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # a killed tree's stragglers must not run on
    return {"seconds": seconds, "exit": process.returncode, "killed": killed,
            **monitor.stop(rusage.ru_utime + rusage.ru_stime)}


def wait_for_quiet(max_wait: float, threshold: float = 0.25) -> float:
    """Waits (up to max_wait s) until other work uses under `threshold` of the machine's CPU."""
    start = time.perf_counter()
    while time.perf_counter() - start < max_wait:
        if psutil.cpu_percent(interval=1.0) / 100 < threshold:
            break
    return time.perf_counter() - start


def tfrecord_files(path: pathlib.Path) -> list[pathlib.Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith((".tfrecord", ".tfrecord.gz")))


def count_records(path: pathlib.Path) -> tuple[int, int]:
    """(records, payload bytes) of the TFRecord file(s) at `path`, reading only the framing."""
    records = payload = 0
    for file in tfrecord_files(path):
        with open(file, "rb") as handle:
            while head := handle.read(12):
                (length,) = struct.unpack("<Q", head[:8])
                handle.seek(length + 4, os.SEEK_CUR)
                records += 1
                payload += length
    return records, payload


def check_output(layout: str, images: int, records: int, payload: int) -> Optional[str]:
    """Why the output is wrong for its layout, or None: every image must be a record of the
    layout's size (raw pixels plus at most 1 KiB of other features; JPEGs smaller than raw)."""
    if records != images:
        return f"{records} records for {images} images"
    per_record = payload / max(records, 1)
    low, high = {"uint8": (RAW_UINT8, RAW_UINT8 + 1024), "float32": (RAW_FLOAT32, RAW_FLOAT32 + 1024),
                 "jpeg": (1, RAW_UINT8)}[layout]
    if not low <= per_record <= high:
        return f"{per_record:.0f} bytes per record, expected {low}..{high} for {layout}"
    return None


def folder_bytes(path: pathlib.Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def remove(path: pathlib.Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def command(contender: Contender, python: str, corpus: pathlib.Path, output: pathlib.Path) -> list[str]:
    """The contender's argv; its "python" is `python`, or the harness's own interpreter for a
    `harness_python` contender."""
    python = PYTHON if contender.harness_python else python
    return [python if a == "python" else a.format(input=corpus, output=output) for a in contender.argv]


def run_contender(contender: Contender, round_index: int, corpus: pathlib.Path, images: int, code_dir: pathlib.Path,
                  quiet_wait: float, keep: bool = False, python: str = PYTHON) -> dict:
    """Runs one contender's `command` to completion as a process tree and checks its output."""
    output = SCRATCH / (contender.name.replace("@", "-") + ("" if contender.output_is_dir else ".tfrecord"))
    remove(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    argv = command(contender, python, corpus, output)
    # Multi-process runners start `python` from PATH.
    env = dict(os.environ, PATH=f"{pathlib.Path(argv[0]).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(code_dir), TF_CPP_MIN_LOG_LEVEL="2")
    waited = wait_for_quiet(quiet_wait) if quiet_wait > 0 else 0.0
    log_path = SCRATCH / f"{output.name}.log"
    with open(log_path, "wb") as log:
        usage = run_tree(argv, log, cwd=code_dir, env=env)
    seconds = usage["seconds"]
    if usage["exit"] != 0:
        sys.stderr.write(log_path.read_text(errors="replace")[-5000:])
        raise SystemExit(f"[{contender.name}] exited with {usage['exit']}: {' '.join(argv)}")
    records, payload = count_records(output)
    problem = check_output(contender.layout, images, records, payload)
    if problem:
        raise SystemExit(f"[{contender.name}] wrong output: {problem} ({output})")
    result = {"name": contender.name, "round": round_index, "images": images, "seconds": round(seconds, 3),
              "cpu_seconds": round(usage["cpu_seconds"], 2), "peak_rss_mib": round(usage["peak_rss"] / 2**20, 1),
              "output_bytes": folder_bytes(output), "records": records,
              "background_cpu_share": round(usage["background_cpu_share"], 3), "waited_for_quiet_s": round(waited, 1)}
    if not keep:
        remove(output)
    log_path.unlink(missing_ok=True)
    os.sync()  # write back what is left of this output now, not during the next contender's run
    print(f"  r{round_index} {contender.name:24s} {seconds:7.2f} s  {images / seconds:6.0f} img/s  "
          f"cpu {usage['cpu_seconds']:6.1f} s  peak {usage['peak_rss'] / 2**20:5.0f} MiB  "
          f"bg {usage['background_cpu_share']:.0%}", flush=True)
    return result


READER_SNIPPET = """
import json, sys, time
start = time.perf_counter()
from pipeline.read.reader import load_dataset
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


def reader_run(output: pathlib.Path, split: str = "train", code: pathlib.Path = REPO) -> dict:
    """Iterates one split of a jpeg-encoded imgrec output with load_dataset(batch_size=64), with
    the reader of the checkout `code`."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(code))
    proc = subprocess.run([PYTHON, "-c", READER_SNIPPET, str(output), split], cwd=code, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-5000:])
        raise SystemExit(f"[reader] exited with {proc.returncode}")
    detail = json.loads(proc.stdout.strip().splitlines()[-1])
    result = {"split": split, "images": detail["images"], "import_and_build_s": round(detail["import_and_build_s"], 2),
              "iterate_s": round(detail["iterate_s"], 2),
              "images_per_s": round(detail["images"] / detail["iterate_s"], 1),
              "steady_images_per_s": round(detail["steady_images"] / max(detail["steady_s"], 1e-9), 1)}
    print(f"  reader: {result['images']} images in {result['iterate_s']:.2f} s = {result['images_per_s']:.0f} "
          f"images/s after import", flush=True)
    return result


# ---------------------------------------------------------------------------------------------
# Baseline revision


def baseline_checkout(rev: str) -> tuple[pathlib.Path, str]:
    """A temporary detached git worktree of `rev` (its pipeline runs as the baseline_* contenders)."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                         check=True, capture_output=True, text=True).stdout.strip()
    path = pathlib.Path(tempfile.mkdtemp(prefix=f"imgrec-baseline-{sha[:8]}-"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--force", str(path), sha],
                   check=True, capture_output=True, text=True)
    return path, sha


def remove_checkout(path: pathlib.Path) -> None:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], capture_output=True)
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Report


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


def steady_pairs(runs: dict) -> dict:
    """For every X with an X@quarter: median (over rounds) steady rate and fixed cost."""
    out = {}
    for name in runs:
        small = runs.get(f"{name}@quarter")
        if "@" in name or not small:
            continue
        small_by_round = {r["round"]: r for r in small}
        pairs = [steady_state(small_by_round[r["round"]]["images"], small_by_round[r["round"]]["seconds"],
                              r["images"], r["seconds"]) for r in runs[name] if r["round"] in small_by_round]
        if pairs:
            out[name] = {"images_per_s": statistics.median(p[0] for p in pairs),
                         "fixed_cost_s": statistics.median(p[1] for p in pairs)}
    return out


def report(results: dict) -> str:
    rows = [("contender", "images", "seconds per round", "median s", "img/s", "CPU s", "cores", "CPU ms/img",
             "peak MiB", "output MiB", "bg max")]
    for name, s in results["summary"].items():
        rows.append((name, str(s["images"]), " ".join(f"{x:.1f}" for x in s["seconds"]), f"{s['median_seconds']:.1f}",
                     f"{s['images_per_s']:.0f}", f"{s['cpu_seconds']:.1f}",
                     f"{s['cpu_seconds'] / s['median_seconds']:.2f}", f"{s['cpu_ms_per_image']:.2f}",
                     f"{s['peak_rss_mib']:.0f}", f"{s['output_mib']:.0f}", f"{s['background_max']:.0%}"))
    lines = format_table(rows[0], rows[1:]).splitlines()
    if results["steady"]:
        lines.append("")
        lines.append("steady state (N/4 → N, median over rounds): " + "; ".join(
            f"{name} {v['images_per_s']:.0f} img/s + {v['fixed_cost_s']:.1f} s fixed"
            for name, v in results["steady"].items()))
    lines.append("")
    rows = [("target", "median", "worst", "per round", "quiet (n)", "target", "verdict")]
    for t in results["targets"]:
        quiet = f"{t['quiet_value']:.2f} ({t['quiet_rounds']})" if t.get("quiet_value") is not None else "- (0)"
        rows.append((t["label"], f"{t['value']:.2f}", f"{t['worst']:.2f}", " ".join(f"{v:.2f}" for v in t["per_round"]),
                     quiet, t["target"] or "", t["verdict"]))
    lines += format_table(rows[0], rows[1:]).splitlines()
    reader = results.get("reader")
    if reader:
        lines.append(f"\nreader (imgrec jpeg records, batch 64): {reader['images_per_s']:.0f} images/s after import")
    rounds = results["rounds"]
    lines.append(f"\n{rounds} round(s), contenders interleaved; ratios are per round, median over rounds; "
                 f"'quiet': median over the rounds where every run involved saw <= {QUIET:.0%} background load.")
    return "\n".join(lines)


def finish(results: dict, out: pathlib.Path) -> None:
    results["summary"] = {n: summarize(runs) for n, runs in results["runs"].items() if runs}
    results["steady"] = steady_pairs(results["runs"])
    results["targets"] = evaluate(TARGETS, results["runs"])
    text = report(results)
    results["table"] = text
    print("\n" + text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nwrote {out}")


def merge_results(paths: Sequence[str], out: str) -> int:
    """Pools earlier runs: rounds are renumbered file after file, so pairs never cross files."""
    merged: dict = {"merged_from": [], "runs": {}, "rounds": 0}
    for path in paths:
        data = json.loads(pathlib.Path(path).read_text())
        offset = merged["rounds"]
        merged["merged_from"].append({"path": str(path), "date": data.get("date"), "command": data.get("command"),
                                      "head": data.get("head"), "baseline": data.get("baseline")})
        for name, runs in data["runs"].items():
            merged["runs"].setdefault(name, []).extend(dict(r, round=r["round"] + offset) for r in runs)
        merged["rounds"] += data["rounds"]
        merged.setdefault("machine", data.get("machine"))
    finish(merged, pathlib.Path(out))
    return 0


# ---------------------------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=10_000, help="ImageNet-like images (the quarter runs use N/4)")
    parser.add_argument("--photos", type=int, default=None,
                        help="4000x3000 photos for the *@photos contenders (default: min(300, max(8, images // 30)))")
    parser.add_argument("--photo_grain", type=float, default=0.0, help="noise sigma of the photo corpus")
    parser.add_argument("--rounds", type=int, default=2, help="every contender runs once per round")
    parser.add_argument("--contenders", default="default",
                        help="comma-separated names or fnmatch patterns ('default' = the standard set)")
    parser.add_argument("--skip", default="", help="comma-separated names or patterns to leave out")
    parser.add_argument("--baseline_rev", default=None,
                        help="git revision whose pipeline runs as the baseline_* contenders (e.g. main)")
    parser.add_argument("--imgrec_flags", default="",
                        help="extra flags (space-separated) for every imgrec_*/baseline_* run, e.g. another runner")
    parser.add_argument("--python", default=PYTHON,
                        help="the interpreter the contenders run with (make bench: a virtualenv with imgrec's "
                             "default install, no extras)")
    parser.add_argument("--no_reader", action="store_true", help="skip timing the reader on imgrec_jpeg's output")
    parser.add_argument("--quiet_wait", type=float, default=QUIET_WAIT,
                        help="max seconds to wait before each run for background CPU load to drop below 25%%")
    parser.add_argument("--rerun_above", type=float, default=0.25,
                        help="re-run a contender (in the same round) whose background load exceeded this share of "
                             "the CPUs, keeping the least disturbed attempt")
    parser.add_argument("--max_reruns", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS / "latest.json"))
    parser.add_argument("--list", action="store_true", help="print the contenders and their commands, then exit")
    parser.add_argument("--merge", nargs="+", default=None, metavar="RESULTS_JSON",
                        help="run nothing: pool the rounds of earlier result files (each file's rounds stay paired) "
                             "and report them together")
    args = parser.parse_args(argv)
    args.python = os.path.abspath(args.python)  # contenders run in other folders; a venv's python is a symlink: keep it
    if args.merge:
        return merge_results(args.merge, args.out)
    # A killed harness still removes its baseline worktree and scratch outputs (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    known = catalogue(args.imgrec_flags.split())
    if args.list:
        for c in known.values():
            print(f"{c.name:24s} [{c.corpus}, {c.layout}{', ' + c.code if c.code != 'head' else ''}] "
                  f"{' '.join(c.argv)}")
        return 0
    names = select(list(known), args.contenders, args.skip, args.baseline_rev is not None)
    if not names:
        raise SystemExit("no contenders selected")
    quarter = max(1, args.images // 4)
    photos = args.photos if args.photos is not None else min(300, max(8, args.images // 30))
    needs = {known[n].corpus for n in names}
    if "full" in needs and args.images * RAW_FLOAT32 * 1.1 > shutil.disk_usage(REPO).free:
        raise SystemExit("not enough free disk for one raw float32 output")
    corpora = {}
    if "full" in needs:
        corpora["full"] = (make_corpus(args.images), args.images)
    if "quarter" in needs:
        corpora["quarter"] = (make_corpus(quarter), quarter)
    if "photos" in needs:
        corpora["photos"] = (make_photos(photos, grain=args.photo_grain), photos)
    for folder, _ in corpora.values():  # the first contender should not pay for cold disk reads
        for path in folder.glob("*/*.jpg"):
            path.read_bytes()
    for python in {args.python, PYTHON}:  # nor for reading the libraries' files from disk
        warm = subprocess.run([python, "-c", "import apache_beam, cv2, tensorflow"], capture_output=True, text=True)
        if warm.returncode != 0:
            raise SystemExit(f"{python} cannot import what the contenders need:\n{warm.stderr[-3000:]}")

    baseline_dir, baseline_sha = (None, None)
    results: dict = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "command": " ".join(["python -m benchmarks.run", *(argv if argv is not None else sys.argv[1:])]),
                     "head": subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                                            text=True).stdout.strip(),
                     "machine": machine(), "rounds": args.rounds, "python": args.python,
                     "corpora": {k: {"path": str(f), "images": n} for k, (f, n) in corpora.items()},
                     "contenders": {n: {"argv": list(known[n].argv), "corpus": known[n].corpus, "code": known[n].code}
                                    for n in names},
                     "runs": {n: [] for n in names}}
    if "full" in corpora:
        results["corpora"]["full"].update(describe(corpora["full"][0]))
    started = time.perf_counter()
    reader_name = "imgrec_jpeg" if "imgrec_jpeg" in names and not args.no_reader else None
    try:
        if any(known[n].code == "baseline" for n in names):
            baseline_dir, baseline_sha = baseline_checkout(args.baseline_rev)
            results["baseline"] = {"rev": args.baseline_rev, "sha": baseline_sha}
            print(f"baseline: {args.baseline_rev} = {baseline_sha} in {baseline_dir}")
        for round_index in range(args.rounds):
            order = list(names)
            random.Random(round_index).shuffle(order)  # no contender always follows the same one
            print(f"round {round_index + 1}/{args.rounds}", flush=True)
            for name in order:
                contender = known[name]
                folder, images = corpora[contender.corpus]
                code_dir = baseline_dir if contender.code == "baseline" else REPO
                keep = name == reader_name and round_index == args.rounds - 1
                attempts = [run_contender(contender, round_index, folder, images, code_dir, args.quiet_wait, keep,
                                          args.python)]
                while (attempts[-1]["background_cpu_share"] > args.rerun_above
                       and len(attempts) <= args.max_reruns):  # another load spoilt it: run it again
                    attempts.append(run_contender(contender, round_index, folder, images, code_dir,
                                                  args.quiet_wait, keep, args.python))
                best = min(attempts, key=lambda r: r["background_cpu_share"])
                best["attempts"] = len(attempts)
                results["runs"][name].append(best)
        if reader_name:
            output = SCRATCH / reader_name
            try:
                results["reader"] = reader_run(output)
            finally:
                remove(output)
    finally:
        if baseline_dir is not None:
            remove_checkout(baseline_dir)
        shutil.rmtree(SCRATCH, ignore_errors=True)
    results["harness_seconds"] = round(time.perf_counter() - started, 1)
    finish(results, pathlib.Path(args.out))
    print(f"({results['harness_seconds']:.0f} s of runs)")
    shutil.rmtree(SCRATCH, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
