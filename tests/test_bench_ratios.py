"""The benchmark harness (benchmarks/run.py): its pure ratio functions, and a smoke run of it."""
from __future__ import annotations

import json
import math
import pathlib
import re
import subprocess
import sys
import time

import pytest

from benchmarks.ratios import Target, evaluate, memory_growth, per_round, speedup, steady_state, summarize, verdict
from benchmarks.run import DEFAULT, TARGETS, catalogue, check_output, command, select
from tests.helpers import REPO, subprocess_env


def run(name: str, rnd: int, images: int, seconds: float, peak: float = 100.0) -> dict:
    return {"name": name, "round": rnd, "images": images, "seconds": seconds, "peak_rss_mib": peak,
            "cpu_seconds": 2 * seconds, "output_bytes": 1000}


@pytest.mark.unit
def test_speedup_and_steady_state_are_line_fits():
    assert speedup(20.0, 10.0) == 2.0
    # 5 s fixed + 1 ms per image: 2,500 images in 7.5 s, 10,000 in 15 s.
    rate, intercept = steady_state(2500, 7.5, 10_000, 15.0)
    assert rate == pytest.approx(1000.0)
    assert intercept == pytest.approx(5.0)
    assert memory_growth(100.0, 120.0) == pytest.approx(1.2)
    with pytest.raises(ValueError):
        steady_state(10, 1.0, 10, 2.0)
    assert steady_state(10, 2.0, 20, 2.0)[0] == math.inf


@pytest.mark.unit
def test_ratios_pair_runs_of_the_same_round_and_take_the_median():
    runs = {"fast": [run("fast", 0, 100, 10.0), run("fast", 1, 100, 20.0), run("fast", 2, 100, 10.0)],
            # round 1 was slow for everyone: pairing by round cancels it
            "slow": [run("slow", 0, 100, 15.0), run("slow", 1, 100, 40.0), run("slow", 2, 100, 30.0)]}
    target = Target("fast vs slow", "speedup", "fast", "slow", limit=1.8)
    assert per_round(target, runs) == [1.5, 2.0, 3.0]
    (row,) = evaluate([target], runs)
    assert row["value"] == 2.0 and row["worst"] == 1.5 and row["rounds"] == 3 and row["verdict"] == "met"
    # the quiet median leaves out rounds where a run saw background load
    runs["slow"][2]["background_cpu_share"] = 0.6
    (row,) = evaluate([target], runs)
    assert row["value"] == 2.0 and row["quiet_value"] == 1.75 and row["quiet_rounds"] == 2
    # a round where one side is missing is not paired
    runs["slow"] = runs["slow"][:1]
    assert per_round(target, runs) == [1.5]
    assert evaluate([target], runs)[0]["verdict"] == "NOT met"
    # a target whose runs were not measured gives no row
    assert evaluate([Target("x", "speedup", "fast", "absent", limit=1.0)], runs) == []


@pytest.mark.unit
def test_steady_intercept_and_memory_targets():
    runs = {"a": [run("a", 0, 10_000, 15.0, peak=600.0)], "a@quarter": [run("a@quarter", 0, 2500, 7.5, peak=500.0)],
            "c": [run("c", 0, 10_000, 11.0)], "c@quarter": [run("c@quarter", 0, 2500, 3.5)]}
    steady = Target("steady", "steady", "a", "c", "a@quarter", "c@quarter", limit=0.9)
    fixed = Target("fixed", "intercept", "a", a_small="a@quarter", limit=3.0, at_least=False)
    memory = Target("memory", "memory", "a", a_small="a@quarter", limit=1.2, at_least=False)
    rows = {r["label"]: r for r in evaluate([steady, fixed, memory], runs)}
    assert rows["steady"]["value"] == pytest.approx(1.0)  # both 1,000 images/s at the margin
    assert rows["steady"]["verdict"] == "met"
    assert rows["fixed"]["value"] == pytest.approx(5.0) and rows["fixed"]["verdict"] == "NOT met"
    assert rows["memory"]["value"] == pytest.approx(1.2) and rows["memory"]["verdict"] == "met"
    assert verdict(float("nan"), 1.0, True) == "NOT met" and verdict(0.5, None, True) == "info"


@pytest.mark.unit
def test_summary_and_output_checks():
    s = summarize([run("a", 0, 100, 10.0), run("a", 1, 100, 12.0, peak=300.0)])
    assert s["median_seconds"] == 11.0 and s["images_per_s"] == pytest.approx(100 / 11) and s["peak_rss_mib"] == 300.0
    raw = 224 * 224 * 3
    assert check_output("uint8", 10, 10, 10 * (raw + 40)) is None
    assert "records" in check_output("uint8", 10, 9, 9 * (raw + 40))
    assert "bytes per record" in check_output("float32", 10, 10, 10 * (raw + 40))
    assert check_output("jpeg", 10, 10, 10 * 20_000) is None


@pytest.mark.unit
def test_every_target_and_default_contender_exists():
    known = catalogue()
    assert set(DEFAULT) <= set(known)
    for target in TARGETS:
        assert set(target.needs()) <= set(known), target
    assert "baseline_area@photos" not in select(list(known), "default", "", have_baseline=False)
    assert "baseline_area@photos" in select(list(known), "default", "", have_baseline=True)
    assert select(list(known), "imgrec_*", "*@*", have_baseline=False) == [
        "imgrec_uint8", "imgrec_jpeg", "imgrec_float32", "imgrec_uint8_gcp_extra"]
    # the plain command: no running-mode flags
    assert not any("running_mode" in a or "num_workers" in a for a in known["imgrec_uint8"].argv)


@pytest.mark.unit
def test_contenders_run_with_the_chosen_interpreter_but_the_gcp_extra_one_and_older_revisions():
    known = catalogue()
    corpus, output = pathlib.Path("/in"), pathlib.Path("/out")
    plain = command(known["imgrec_uint8"], "/bench/bin/python", corpus, output)
    assert plain[:3] == ["/bench/bin/python", "-m", "pipeline.run"] and "--input=/in" in plain
    assert command(known["pool_uint8"], "/bench/bin/python", corpus, output)[0] == "/bench/bin/python"
    extras = command(known["imgrec_uint8_gcp_extra"], "/bench/bin/python", corpus, output)
    assert extras == [sys.executable, *plain[1:]]
    assert command(known["baseline_uint8"], "/bench/bin/python", corpus, output) == [sys.executable, *plain[1:]]


@pytest.mark.bench
@pytest.mark.timeout(900)
def test_bench_smoke_run(tmp_path):
    """`python -m benchmarks.run --images 400 --rounds 1` runs every default contender (and the
    current HEAD as the baseline revision), checks their outputs, and reports every target."""
    out = tmp_path / "smoke.json"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--images", "400", "--rounds", "1",
                           "--quiet_wait", "0", "--rerun_above", "1", "--baseline_rev", "HEAD", "--out", str(out)],
                          cwd=REPO, env=subprocess_env(), capture_output=True, text=True)
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results["runs"]) == set(DEFAULT)
    for name, runs in results["runs"].items():
        assert len(runs) == 1 and runs[0]["records"] == runs[0]["images"] > 0, name
        assert runs[0]["seconds"] > 0 and runs[0]["cpu_seconds"] > 0 and runs[0]["peak_rss_mib"] > 50, name
    labels = {t["label"] for t in results["targets"]}
    # every target the default contenders can judge (Prism's needs `make engines` and root)
    limited = {t.label for t in TARGETS if t.limit is not None and set(t.needs()) <= set(DEFAULT)}
    assert limited and limited <= labels
    # a line fit through 100 and 400 images can be degenerate on a noisy machine (no extra time:
    # an infinite rate); the ratios of whole runs cannot
    for t in results["targets"]:
        assert isinstance(t["value"], float), t
        if t["kind"] in ("speedup", "memory"):
            assert math.isfinite(t["value"]) and t["value"] > 0, t
    assert results.get("reader", {}).get("images", 0) > 0
    assert seconds < 240, f"the smoke run took {seconds:.0f} s"


@pytest.mark.unit
def test_stage_names_keep_the_first_and_last_step_without_beams_prefixes():
    from benchmarks.stages import short_name
    fused = ("(((ConvertToTFRecords/WriteShards/GroupParts/Read)+(ref_AppliedPTransform_ConvertToTFRecords-"
             "WriteShards-ConcatShards_109))+(ConvertToTFRecords/GatherTotals/AllFacts/Write/2))")
    assert short_name(fused) == "WriteShards/GroupParts/Read ... GatherTotals/AllFacts/Write/2"
    assert short_name("ConvertToTFRecords/AllInputs/Read") == "AllInputs/Read"


@pytest.mark.bench
def test_stages_times_a_real_run_stage_by_stage(tmp_path):
    """`python -m benchmarks.stages` runs imgrec on the sample data (FnApiRunner) and reports the
    import, the first stage, the conversion stage and the total; the run itself publishes."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.stages", "--min_ms=0", f"--input={REPO / 'data/sample'}",
                           f"--output={out}", "--progress_interval=0"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "metadata.json").is_file()
    report = proc.stderr[proc.stderr.index("imports until pipeline.run was loaded"):]
    assert "first stage starts at" in report and "WriteShards/GroupShards/Read" in report and "Publish" in report
    assert re.search(r"\(total \d+\.\d\d s\)", report)
