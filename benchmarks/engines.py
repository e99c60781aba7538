"""Per-image cost of imgrec on the Flink and Spark session clusters, against the DirectRunner.

    python -m benchmarks.engines [--engines flink,spark] [--sizes 2500,10000] [--rounds 3]
                                 [--variant NAME=FLAGS ...] [-- IMGREC_FLAGS...]

Starts each engine the way `make test-engines` does (tests/engines/engines.py: a Flink session
cluster with a 2-slot TaskManager, a Spark standalone cluster with a 2-core worker, Beam's job
server, imgrec's worker pool), then runs, per round and interleaved, the DirectRunner
(the built-in defaults: the FnApiRunner with imgrec's own converter processes) and every variant
on every engine, on the corpora of benchmarks/make_corpus.py (`--sizes` images each). A variant
is a set of extra runner flags (default: the flags configs/<engine>.yaml and docs/runners.md
give). The cost per extra image is the slope between the two sizes (benchmarks/ratios.py's
`steady_state`), per round; its ratio to the DirectRunner's is taken within the round.

While a cluster run converts, the CPU time of the worker pool's processes (the SDK workers) is
sampled: `worker_cores` is that CPU time over the run's time, so 2.0 means both slots (cores)
were busy throughout, and `workers_both_busy` the share of the time with any worker busy in
which two were. The CPU time of the driver (with the converter processes it waited for) and of
the engine's JVMs is summed up too (`cpu`): on a machine shared with other work, CPU seconds per
extra image vary less than wall seconds. Results go to benchmarks/results/engines-ENGINES.json.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import pathlib
import re
import resource
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from typing import Optional, Sequence

from benchmarks.make_corpus import make_corpus
from benchmarks.ratios import steady_state
from tests.engines.engines import HOST_NETNS, Netns, cluster, job_server, job_server_jar, private_netns, run_imgrec
from tests.helpers import REPO
from tests.portable import live_group_members

RESULTS = REPO / "benchmarks" / "results"  # engines-<engines>.json
# The flags docs/runners.md gives for a session cluster with imgrec's worker pool.
DEFAULT_VARIANTS = {"flink": {"default": ()}, "spark": {"default": ()}}
_TIME = re.compile(r"^time: ([0-9.]+) s", re.MULTILINE)


def cpu_seconds(pid: int) -> Optional[float]:
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in clock ticks of 1/100 s


class GroupCpu:
    """CPU seconds used by the processes of a process group while the block runs (sampled, so
    a process that lives less than a sampling period is missed), and how many of them were busy
    at once: `busy[n]` counts the sampling periods in which n processes each used more than a
    tenth of a core (on a machine shared with other work, a busy process gets less than a core)."""

    def __init__(self, pgid: int, period: float = 0.5):
        self.pgid, self.period = pgid, period
        self.start: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.busy: collections.Counter[int] = collections.Counter()
        self._stop = threading.Event()

    def _sample(self, into: dict[int, float]) -> None:
        for pid in live_group_members(self.pgid):
            seconds = cpu_seconds(pid)
            if seconds is not None:
                into[pid] = seconds

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            before = dict(self.last)
            self._sample(self.last)
            used = [value - before.get(pid, self.start.get(pid, value)) for pid, value in self.last.items()]
            self.busy[sum(1 for seconds in used if seconds > self.period / 10)] += 1

    def both_busy(self) -> Optional[float]:
        """Of the periods in which any process was busy, the share in which two or more were."""
        active = sum(n for busy, n in self.busy.items() if busy >= 1)
        return round(sum(n for busy, n in self.busy.items() if busy >= 2) / active, 2) if active else None

    def __enter__(self) -> "GroupCpu":
        self._sample(self.start)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(self.last)

    @property
    def seconds(self) -> float:
        return sum(value - self.start.get(pid, 0.0) for pid, value in self.last.items())


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(name: str, flags: Sequence[str], work: pathlib.Path, pool_pgid: Optional[int],
            engine_pgids: Sequence[int] = (), netns: Netns = HOST_NETNS) -> dict:
    """One imgrec run, timed, with the CPU seconds of the driver (and the converter processes
    it waited for), of the worker pool's SDK workers and of the engine's JVMs."""
    out = work / "out"
    log = work / f"{name}.log"
    driver = children_cpu()
    with contextlib.ExitStack() as stack:
        cpu = stack.enter_context(GroupCpu(pool_pgid)) if pool_pgid else None
        engine = [stack.enter_context(GroupCpu(pgid)) for pgid in engine_pgids]
        run = run_imgrec([*flags, f"--output={out}", "--overwrite"], log, netns)
    driver = children_cpu() - driver
    text = log.read_text(errors="replace")
    match = _TIME.search(text)
    if run.returncode != 0 or not match:
        raise RuntimeError(f"{name} failed ({run.returncode}):\n{run.tail()}")
    metadata = json.loads((out / "metadata.json").read_text())
    shutil.rmtree(out)  # 1.5 GB of raw records at 10,000 images
    seconds = float(match.group(1))
    result = {"seconds": seconds, "wall": round(run.seconds, 2), "images": metadata["inputs"]["total"],
              "converters": metadata["run"].get("converter_processes"), "driver_cpu": round(driver, 2)}
    if cpu is not None:
        result["worker_cpu"] = round(cpu.seconds, 2)
        result["worker_cores"] = round(cpu.seconds / seconds, 2)
        result["workers_both_busy"] = cpu.both_busy()
    if engine:
        result["engine_cpu"] = round(sum(group.seconds for group in engine), 2)
    result["cpu"] = round(sum(result.get(k, 0.0) for k in ("driver_cpu", "worker_cpu", "engine_cpu")), 2)
    return result


def summarize(runs: list[dict], sizes: Sequence[int]) -> dict:
    """Per contender: median seconds per size, and per round the cost per extra image (ms) and
    its ratio to the DirectRunner's in the same round."""
    small, big = sizes
    table: dict[str, dict] = {}
    contenders = sorted({r["contender"] for r in runs})
    rounds = sorted({r["round"] for r in runs})
    slope: dict[tuple[str, int], float] = {}
    cpu_slope: dict[tuple[str, int], float] = {}
    for name in contenders:
        for rnd in rounds:
            by_size = {r["size"]: r for r in runs if r["contender"] == name and r["round"] == rnd}
            if small in by_size and big in by_size:
                rate, _ = steady_state(small, by_size[small]["seconds"], big, by_size[big]["seconds"])
                slope[(name, rnd)] = 1000.0 / rate
                cpu_rate, _ = steady_state(small, by_size[small]["cpu"], big, by_size[big]["cpu"])
                cpu_slope[(name, rnd)] = 1000.0 / cpu_rate
    for name in contenders:
        mine = [r for r in runs if r["contender"] == name]
        ms = [slope[(name, rnd)] for rnd in rounds if (name, rnd) in slope]
        ratios = [slope[(name, rnd)] / slope[("direct", rnd)] for rnd in rounds
                  if (name, rnd) in slope and ("direct", rnd) in slope]
        table[name] = {
            "seconds": {size: statistics.median(r["seconds"] for r in mine if r["size"] == size) for size in sizes},
            "ms_per_extra_image": [round(v, 3) for v in ms],
            "ratio_to_direct": [round(v, 2) for v in ratios],
            "median_ratio": round(statistics.median(ratios), 2) if ratios else None,
            "cpu_ms_per_extra_image": [round(cpu_slope[(name, rnd)], 3) for rnd in rounds if (name, rnd) in cpu_slope],
            "worker_cores": [r.get("worker_cores") for r in mine if r["size"] == big],
            "workers_both_busy": [r.get("workers_both_busy") for r in mine if r["size"] == big],
            "converters": sorted({r["converters"] for r in mine if r["converters"] is not None}),
        }
    return table


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="flink,spark")
    parser.add_argument("--sizes", default="2500,10000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first and not kept (JIT, caches)")
    parser.add_argument("--variant", action="append", default=[],
                        help="ENGINE:NAME=FLAGS, e.g. 'flink:two-workers=--sdk_worker_parallelism=2'")
    parser.add_argument("--work", type=pathlib.Path, default=None)
    args, imgrec_flags = parser.parse_known_args(argv)
    imgrec_flags = [f for f in imgrec_flags if f != "--"]
    sizes = [int(s) for s in args.sizes.split(",")]
    engines = [e for e in args.engines.split(",") if e]
    variants = {engine: dict(DEFAULT_VARIANTS[engine]) for engine in engines}
    for spec in args.variant:
        engine, rest = spec.split(":", 1)
        name, flags = rest.split("=", 1)
        if engine in variants:
            variants[engine][name] = tuple(shlex.split(flags))
    corpora = {size: make_corpus(size) for size in sizes}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the clusters on the way out
    work = args.work or pathlib.Path(tempfile.mkdtemp(prefix="imgrec-bench-engines-"))
    runs: list[dict] = []
    with contextlib.ExitStack() as stack:
        netns = stack.enter_context(private_netns(work / "netns"))  # as the engine tests run them
        served, engine_groups = {}, {}
        for engine in engines:
            running = stack.enter_context(cluster(engine, work / engine, netns))
            jar = job_server_jar(engine)
            if jar is None:
                raise SystemExit(f"no {engine} job server: run `make engines`")
            served[engine] = stack.enter_context(job_server(engine, jar, running, work / engine / "job-server"))
            # The cluster's processes and the job server (Spark's driver): each its own group.
            engine_groups[engine] = [s.process.pid for s in (*running.services, served[engine].job_server)]
        for rnd in range(-args.warmup, args.rounds):  # rounds below 0 warm the JVMs up and are not kept
            for size in sizes:
                base = [f"--input={corpora[size]}", "--num_shards=2", *imgrec_flags]
                contenders = [("direct", base, None, ())]
                for engine in engines:
                    config = REPO / "configs" / f"{engine}.yaml"
                    for name, flags in variants[engine].items():
                        contenders.append((f"{engine}:{name}",
                                           [f"--config={config}", *base, *served[engine].runner_flags(), *flags],
                                           served[engine].worker_pool.process.pid, engine_groups[engine]))
                for name, flags, pool, groups in contenders:
                    result = one_run(name.replace(":", "-"), flags, work / f"r{rnd}-{size}", pool, groups, netns)
                    print(json.dumps({"contender": name, "round": rnd, "size": size, **result}), flush=True)
                    if rnd >= 0:
                        runs.append({"contender": name, "round": rnd, "size": size, **result})
    table = summarize(runs, sizes)
    results = RESULTS / f"engines-{'-'.join(engines)}.json"
    results.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M"), "sizes": sizes, "rounds": args.rounds,
                                   "imgrec_flags": imgrec_flags, "variants": variants, "runs": runs,
                                   "summary": table}, indent=2) + "\n")
    for name, row in table.items():
        print(f"{name:16s} {row['seconds']}  ms/extra image {row['ms_per_extra_image']}  "
              f"x direct {row['ratio_to_direct']} (median {row['median_ratio']})  "
              f"CPU ms/extra image {row['cpu_ms_per_extra_image']}  worker cores {row['worker_cores']}  "
              f"both busy {row['workers_both_busy']}  "
              f"converters {row['converters']}")
    print(f"(all runs in {results.relative_to(REPO)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
