"""Pure functions behind `make bench`'s verdicts: speed-ups, steady state, fixed cost, memory growth.

Every contender runs once per round, interleaved, so two contenders' runs in the same round saw
about the same machine. Each ratio is therefore computed per round, from runs of the same round,
and summarized by the median over rounds (the worst round is reported too). No timing happens
here: `runs` maps a contender name to its runs, a list of dicts with at least `round`, `images`,
`seconds` and `peak_rss_mib`.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Mapping, Optional, Sequence

Runs = Mapping[str, Sequence[Mapping]]


@dataclasses.dataclass(frozen=True)
class Target:
    """One line of the verdict table.

    kind:
      speedup   `a` is at least `limit` times faster than `b`: b.seconds / a.seconds
      steady    steady-state rate of `a` (quarter `a_small` → full `a`) over that of `b` (`b_small` → `b`)
      intercept fixed cost of `a` in seconds, from `a_small` and `a` (at most `limit`)
      memory    peak RSS of `a` over that of `a_small` (at most `limit`)
    """

    label: str
    kind: str
    a: str
    b: Optional[str] = None
    a_small: Optional[str] = None
    b_small: Optional[str] = None
    limit: Optional[float] = None  # None: informational only
    at_least: bool = True

    def needs(self) -> tuple[str, ...]:
        return tuple(n for n in (self.a, self.b, self.a_small, self.b_small) if n)


def by_round(runs: Sequence[Mapping]) -> dict[int, Mapping]:
    return {int(r["round"]): r for r in runs}


def speedup(slow_seconds: float, fast_seconds: float) -> float:
    """How many times faster the second is: 20 s vs 10 s → 2.0."""
    return slow_seconds / fast_seconds


def steady_state(small_images: int, small_seconds: float, big_images: int, big_seconds: float) -> tuple[float, float]:
    """(images/s of the extra images, fixed cost in s): the line through two (images, seconds)
    points. The rate cancels start-up and other fixed costs; the intercept is that fixed cost."""
    if big_images <= small_images:
        raise ValueError("the big run must have more images than the small one")
    extra_seconds = big_seconds - small_seconds
    rate = (big_images - small_images) / extra_seconds if extra_seconds > 0 else math.inf
    intercept = small_seconds - small_images / rate
    return rate, intercept


def memory_growth(small_peak: float, big_peak: float) -> float:
    return big_peak / small_peak


def per_round(target: Target, runs: Runs, max_background: Optional[float] = None) -> list[float]:
    """The target's value in every round where all the runs it needs are present (and, with
    `max_background`, none of them saw more background load than that share of the CPUs)."""
    rounds = [by_round(runs.get(name, ())) for name in target.needs()]
    common = sorted(set.intersection(*(set(r) for r in rounds))) if rounds else []
    values = []
    for rnd in common:
        get = {name: by_round(runs[name])[rnd] for name in target.needs()}
        if max_background is not None and any(r.get("background_cpu_share", 0.0) > max_background
                                              for r in get.values()):
            continue
        a = get[target.a]
        if target.kind == "speedup":
            values.append(speedup(get[target.b]["seconds"], a["seconds"]))
        elif target.kind == "steady":
            small_a, small_b, b = get[target.a_small], get[target.b_small], get[target.b]
            rate_a = steady_state(small_a["images"], small_a["seconds"], a["images"], a["seconds"])[0]
            rate_b = steady_state(small_b["images"], small_b["seconds"], b["images"], b["seconds"])[0]
            values.append(rate_a / rate_b)
        elif target.kind == "intercept":
            small = get[target.a_small]
            values.append(steady_state(small["images"], small["seconds"], a["images"], a["seconds"])[1])
        elif target.kind == "memory":
            values.append(memory_growth(get[target.a_small]["peak_rss_mib"], a["peak_rss_mib"]))
        else:
            raise ValueError(f"unknown target kind {target.kind!r}")
    return values


def verdict(value: float, limit: Optional[float], at_least: bool) -> str:
    if limit is None:
        return "info"
    if math.isnan(value):
        return "NOT met"
    return "met" if (value >= limit if at_least else value <= limit) else "NOT met"


QUIET = 0.25  # background share of the CPUs up to which a run counts as undisturbed


def evaluate(targets: Sequence[Target], runs: Runs, quiet: float = QUIET) -> list[dict]:
    """One row per target whose runs were measured: median over rounds, worst round, verdict;
    and the median over the "quiet" rounds only, those where no run involved saw more than
    `quiet` background load (None if there is no such round)."""
    rows = []
    for target in targets:
        values = per_round(target, runs)
        if not values:
            continue
        median = statistics.median(values)
        worst = min(values) if target.at_least else max(values)
        quiet_values = per_round(target, runs, quiet)
        rows.append({"label": target.label, "kind": target.kind, "value": median, "worst": worst,
                     "per_round": values, "rounds": len(values),
                     "quiet_value": statistics.median(quiet_values) if quiet_values else None,
                     "quiet_rounds": len(quiet_values),
                     "target": (None if target.limit is None
                                else f"{'>=' if target.at_least else '<='} {target.limit:g}"),
                     "verdict": verdict(median, target.limit, target.at_least)})
    return rows


def summarize(runs: Sequence[Mapping]) -> dict:
    """Median seconds and CPU, worst peak memory of one contender's runs."""
    seconds = [r["seconds"] for r in runs]
    median = statistics.median(seconds)
    images = runs[0]["images"]
    cpu = statistics.median(r["cpu_seconds"] for r in runs)
    return {"images": images, "rounds": len(runs), "seconds": seconds, "median_seconds": median,
            "images_per_s": images / median, "cpu_seconds": cpu, "cpu_ms_per_image": 1e3 * cpu / images,
            "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
            "output_mib": max(r["output_bytes"] for r in runs) / 2**20,
            "background_max": max(r.get("background_cpu_share", 0.0) for r in runs)}
