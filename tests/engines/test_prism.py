"""imgrec on Prism, Beam's Go runner (`--runner=PrismRunner`; Beam's own DirectRunner would run on it
wherever it can get it, imgrec's does not).

Three ways, each over the engine tests' input (tests/engines/data.py: data/sample, bad files and
small photos), compared with the DirectRunner reference:
- "loopback": `--runner=PrismRunner --prism_location=BINARY`, the user's command: the pipeline
  process starts Prism itself and runs the Python SDK harness in-process (LOOPBACK).
- "external": a Prism job server started by the fixture, `--runner=PortableRunner`, with the
  Python code in processes of an EXTERNAL worker pool (as on a cluster).
- "direct": the default `--runner=DirectRunner` (no runner or running-mode flags) with
  Prism in Beam's own cache, as it is on any machine where Beam could download it once: Beam's
  DirectRunner would run the pipeline on Prism; imgrec's runs it on the FnApiRunner.
Prism, the worker pool and the pipeline share a network namespace that has only loopback.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.engines.conftest import (
    CHECKS,
    REFERENCE_RUNNER,
    Timer,
    assert_run_ok,
    check_against_reference,
    check_store_run,
    imgrec_flags,
    load_metadata,
)
from tests.engines.engines import (
    PipelineRun,
    PrismEngine,
    beam_prism_cache_name,
    install_prism_in_beam_cache,
    prism_engine,
    run_imgrec,
)
from tests.helpers import REPO, SAMPLE, make_tree
from tests.portable import live_group_members, subprocess_env

ENVIRONMENTS = ("loopback", "external", "direct")


@pytest.fixture(scope="module")
def prism(tmp_path_factory):
    with Timer("prism: start job server + worker pool"):
        context = prism_engine(tmp_path_factory.mktemp("prism") / "logs")
        engine = context.__enter__()
    try:
        yield engine
    finally:
        context.__exit__(None, None, None)  # raises if a process survived


@pytest.fixture(scope="module")
def prism_run(prism: PrismEngine, inputs, tmp_path_factory):
    """environment → the run on Prism that way (its output is beside its log), each run once."""
    runs: dict[str, PipelineRun] = {}

    def get(environment: str) -> PipelineRun:
        if environment not in runs:
            work = tmp_path_factory.mktemp(f"prism-{environment}")
            env = None
            if environment == "direct":  # no runner flags; Beam finds Prism in HOME's cache
                install_prism_in_beam_cache(work / "home")
                env = subprocess_env({"HOME": str(work / "home")})
            flags = imgrec_flags(inputs, work / "out", prism.runner_flags(environment))
            with Timer(f"prism {environment}: imgrec"):
                run = run_imgrec(flags, work / "imgrec.log", prism.netns, env=env)
            assert_run_ok(run)
            runs[environment] = run
        return runs[environment]
    return get


@pytest.mark.engines
@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_prism_matches_direct_runner(prism_run, reference, environment, check):
    check_against_reference(check, prism_run(environment).log.parent / "out", reference)


@pytest.mark.engines
def test_prism_reads_s3_and_publishes_to_gcs(prism, sample_reference, tmp_path):
    """Input on S3, output on GCS, with the Python code in the worker pool's processes: the
    job's store options (flags) and the hosts' (environment) reach every worker."""
    check_store_run(prism.netns, "s3", "gs", prism.runner_flags("external"), tmp_path, sample_reference)


@pytest.mark.engines
def test_direct_runner_stays_on_the_fn_api_runner_where_beam_has_prism(prism_run):
    """Beam's DirectRunner submits the job to Prism once Beam has it (2.3 s more per run for this
    job); imgrec's `--runner=DirectRunner` runs on the FnApiRunner all the same."""
    run = prism_run("direct")
    cached = run.log.parent / "home" / ".apache_beam" / "cache" / "prism" / "bin" / beam_prism_cache_name()
    assert cached.with_name(cached.name + ".zip").exists()
    # Beam unzips the cached Prism beside the zip before it starts it.
    assert not cached.exists(), "Prism was started"
    log = run.log.read_text(errors="replace")
    assert "on DirectRunner (FnApiRunner)" in log and "Falling back" not in log, log[-3000:]


@pytest.mark.engines
def test_prism_runs_offline_in_its_own_network_namespace(prism):
    """The isolation the other tests rely on: only loopback inside (so Prism's `*:port` and the
    worker pool's `[::]:port` are reachable from nowhere else, and nothing is downloaded)."""
    if not prism.netns.isolated:
        pytest.skip("no network namespace here (needs root and unshare): Prism listened on all interfaces")
    import subprocess
    links = subprocess.run(prism.netns.wrap(["ip", "-o", "link"]), capture_output=True, text=True, check=True).stdout
    assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"]


@pytest.mark.engines
def test_prism_teardown_stops_every_process_when_the_test_fails(tmp_path):
    groups: list[int] = []
    with pytest.raises(RuntimeError, match="a failing test"):
        with prism_engine(tmp_path / "logs") as engine:
            groups = [engine.job_service.process.pid, engine.worker_pool.process.pid]
            if engine.netns.holder:
                groups.append(engine.netns.holder.process.pid)
            assert all(live_group_members(pgid) for pgid in groups)
            raise RuntimeError("a failing test")
    assert groups and not [pgid for pgid in groups if live_group_members(pgid)]


@pytest.mark.engines
@pytest.mark.parametrize("moment", ["staging", "summary"])
def test_sigterm_on_prism_tells_what_the_output_holds(prism, tmp_path, moment):
    """SIGTERM to `--runner=PrismRunner` (loopback), the user's command. While the run stages,
    it exits 130 with one line and stops the Prism it started. Once the summary is out, what is
    left is Beam stopping Prism (an atexit hook that sleeps a second): the run keeps its exit 0,
    with no traceback."""
    out, log_path = tmp_path / "out", tmp_path / "imgrec.log"

    def summary_printed() -> bool:
        return f"output: {out} (metadata.json" in log_path.read_text(errors="replace")

    run = run_imgrec(imgrec_flags(SAMPLE, out, prism.runner_flags("loopback")), log_path, prism.netns,
                     terminate_when=summary_printed if moment == "summary" else (out / ".imgrec-staging").exists,
                     timeout=300)
    assert not run.survivors, f"processes outlived the pipeline: {run.survivors}"
    assert "Traceback" not in run.log.read_text(errors="replace"), run.tail()
    if moment == "summary":
        assert run.returncode == 0, run.tail()
    else:
        assert run.returncode == 130, run.tail()
        assert run.tail(1) == "imgrec: error: interrupted; nothing was published", run.tail()
        assert not (out / "metadata.json").exists()


# The jobs a Beam job service knows, with their states: `python -c` inside the tests' namespace.
JOB_STATES = """
import sys, grpc
from apache_beam.portability.api import beam_job_api_pb2 as api, beam_job_api_pb2_grpc as api_grpc
with grpc.insecure_channel(sys.argv[1]) as channel:
    for job in api_grpc.JobServiceStub(channel).GetJobs(api.GetJobsRequest(), timeout=10).job_info:
        print(job.job_id, api.JobState.Enum.Name(job.state))
"""


@pytest.mark.engines
def test_sigterm_cancels_the_job_on_a_job_server(prism, tmp_path):
    """SIGTERM to a run on a job server (here Prism's; Flink's and Spark's in test_clusters.py): the job is
    cancelled. It ran on after the driver had exited 130 and removed the staging folder, wrote
    the folder back, and ended with its publish refused."""
    def job_states() -> dict[str, str]:
        listed = subprocess.run(prism.netns.wrap([sys.executable, "-c", JOB_STATES, prism.job_endpoint]), cwd=REPO,
                                env=subprocess_env(), capture_output=True, text=True, timeout=60, check=True)
        return dict(line.split() for line in listed.stdout.splitlines())

    make_tree(tmp_path / "in", {"a": 150, "b": 150}, size=(256, 256))
    out, before = tmp_path / "out", job_states()
    run = run_imgrec(imgrec_flags(tmp_path / "in", out, prism.runner_flags("external")), tmp_path / "imgrec.log",
                     prism.netns, terminate_when=lambda: any(out.glob(".imgrec-staging/run-*/progress/*")),
                     timeout=300)
    assert run.returncode == 130 and run.tail(1) == "imgrec: error: interrupted; nothing was published", run.tail()
    assert [state for job, state in job_states().items() if job not in before] == ["CANCELLED"]
    assert not list(out.glob(".imgrec-staging/run-*/**/*.tfrecord*"))


@pytest.mark.engines
def test_prism_converts_coco_as_the_direct_runner_does(prism, tmp_path):
    """A COCO detection dataset (data/detection/coco) through the worker pool: the same records,
    label map and object counts as the reference runner's."""
    coco = REPO / "data" / "detection" / "coco" / "instances.json"
    runs = {}
    for name, runner in (("reference", REFERENCE_RUNNER), ("prism", prism.runner_flags("external"))):
        run = run_imgrec([*imgrec_flags(coco, tmp_path / name, runner), "--input_kind=coco"], tmp_path / f"{name}.log",
                         prism.netns)
        assert_run_ok(run)
        runs[name] = tmp_path / name
    for check in CHECKS:
        check_against_reference(check, runs["prism"], runs["reference"])
    assert (runs["prism"] / "label_map.pbtxt").read_bytes() == (runs["reference"] / "label_map.pbtxt").read_bytes()
    assert load_metadata(runs["prism"])["objects"] == load_metadata(runs["reference"])["objects"]
