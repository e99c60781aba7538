"""imgrec on a Flink session cluster and on a Spark standalone cluster, through Beam's job servers.

Each cluster runs as real separate processes started by the fixture from the fetched
distributions (Flink 1.19: a JobManager and a TaskManager with 2 slots; Spark 3.5: a Master and
a Worker with 2 cores), all on 127.0.0.1, once per engine for the whole module. Beam's job server
for the engine is the jar `make engines` built from engines/ (Maven Central's Beam 2.70 runner
modules; the Python SDK is the lock's Beam). Two ways to run, each over the engine tests' input
(tests/engines/data.py: data/sample, bad files and small photos), with shards, dead letters and
metadata equal to the FnApiRunner reference's:

- "external": the job server the fixture started, `--runner=PortableRunner`, with the Python
  code in imgrec's worker pool (`python -m pipeline.worker_pool`), as on a real cluster;
- "loopback": Beam's `--runner=FlinkRunner`/`SparkRunner` with `--*_job_server_jar`, which start
  the job server for the run, and the Python code in the launching process.

Both slots (cores) convert parts of the shards, and a worker killed with SIGKILL in the middle
of the conversion does what docs/runners.md says.
"""
from __future__ import annotations

import json
import pathlib
import re
import subprocess
import time
from typing import Optional

import pytest
import yaml

from tests.engines.conftest import (
    CHECKS,
    Timer,
    assert_run_ok,
    check_against_reference,
    check_store_run,
    imgrec_flags,
    load_metadata,
)
from tests.engines.engines import (
    JOB_SERVER_JARS,
    cluster,
    job_server,
    job_server_jar,
    loopback_flags,
    private_netns,
    run_imgrec,
)
from tests.helpers import REPO, make_tree
from tests.portable import live_group_members, subprocess_env
from transforms.dataset_format import METADATA_FILE, parts_dir
from transforms.write.parts import PART_IMAGES

ENGINES = ("flink", "spark")
ENVIRONMENTS = ("external", "loopback")
# What a SIGKILLed worker in the middle of the conversion leads to (docs/runners.md, "Faults").
AFTER_A_KILLED_WORKER = {
    "flink": "fails",  # no restart strategy without checkpointing: the job fails; the next run resumes
    "spark": "recovers",  # the lost tasks run again on the Worker that replaces it
}


def group_pids(services) -> list[int]:
    return [pid for service in services for pid in live_group_members(service.process.pid)]


@pytest.mark.engines
@pytest.mark.parametrize("engine", ENGINES)
def test_engine_config_holds_runner_settings_only(engine):
    """configs/<engine>.yaml says how to reach the cluster and nothing else, so a run with it
    converts with the built-in defaults, as the reference does, and names no input or output."""
    config = yaml.safe_load((REPO / "configs" / f"{engine}.yaml").read_text())
    assert list(config) == ["beam"]
    assert config["beam"]["runner"] == "PortableRunner" and config["beam"]["environment_type"] == "EXTERNAL"


@pytest.fixture(scope="module")
def netns(tmp_path_factory):
    """Where the clusters, job servers, worker pools and pipelines run: a network namespace with
    only loopback (Beam's Java servers, in the job server and inside Flink's TaskManagers and
    Spark's executors, listen on every interface)."""
    with private_netns(tmp_path_factory.mktemp("netns")) as namespace:
        yield namespace


@pytest.fixture(scope="module", params=ENGINES)
def engine_cluster(request, netns, tmp_path_factory):
    engine = request.param
    work = tmp_path_factory.mktemp(engine)
    with Timer(f"{engine}: start the cluster"):
        context = cluster(engine, work, netns)
        running = context.__enter__()
    try:
        yield engine, running, work
    finally:
        # Stops every process group the cluster started, and raises if any process survived (a
        # failed test gets here too: tests/engines/test_prism.py shows that for the mechanism).
        context.__exit__(None, None, None)


def listening(netns, pids: set[int]) -> set[str]:
    """host:port of every TCP socket the processes `pids` listen on, as `ss` in their network
    namespace lists them (psutil reads this process's namespace only)."""
    lines = subprocess.run(netns.wrap(["ss", "-H", "-ltnp"]), capture_output=True, text=True, check=True).stdout
    return {line.split()[3] for line in lines.splitlines()
            if {int(pid) for pid in re.findall(r"pid=(\d+)", line)} & pids}


@pytest.mark.engines
def test_cluster_has_a_worker_and_listens_only_on_loopback(engine_cluster):
    engine, running, _ = engine_cluster
    assert running.workers() == 1
    addresses = listening(running.netns, set(group_pids(running.services)))
    assert addresses
    assert {address.rsplit(":", 1)[0] for address in addresses} <= {"127.0.0.1", "[::ffff:127.0.0.1]"}, addresses


@pytest.fixture(scope="module")
def built_jar(engine_cluster) -> pathlib.Path:
    engine = engine_cluster[0]
    jar = job_server_jar(engine)
    assert jar is not None, (f"no {JOB_SERVER_JARS[engine]} built from the current engines/*.pom: run `make engines` "
                             "(~/.cache/imgrec-engines/versions.json says what the last build did)")
    return jar


@pytest.fixture(scope="module")
def portable_engine(engine_cluster, built_jar):
    engine, running, work = engine_cluster
    with Timer(f"{engine}: start Beam's job server + worker pool"):
        context = job_server(engine, built_jar, running, work / "job-server")
        served = context.__enter__()
    try:
        yield served
    finally:
        context.__exit__(None, None, None)


def runner_flags(engine_cluster, portable_engine, built_jar,
                 environment: str) -> tuple[tuple[str, ...], Optional[pathlib.Path]]:
    """(runner flags, config or None) of one way to run on the module's cluster."""
    engine, running, _ = engine_cluster
    if environment == "external":
        return portable_engine.runner_flags(), REPO / "configs" / f"{engine}.yaml"
    return loopback_flags(engine, running, built_jar), None


# SPARK_LOCAL_IP: the driver inside the job server a loopback run starts binds to loopback.
RUN_ENV = {"SPARK_LOCAL_IP": "127.0.0.1"}


@pytest.fixture(scope="module")
def cluster_run(engine_cluster, portable_engine, built_jar, inputs, tmp_path_factory):
    """environment → (output folder, log) of that run on the module's cluster, once."""
    engine = engine_cluster[0]
    runs: dict[str, tuple[pathlib.Path, pathlib.Path]] = {}

    def get(environment: str) -> tuple[pathlib.Path, pathlib.Path]:
        if environment not in runs:
            work = tmp_path_factory.mktemp(f"{engine}-{environment}")
            flags, config = runner_flags(engine_cluster, portable_engine, built_jar, environment)
            with Timer(f"{engine} {environment}: imgrec"):
                run = run_imgrec(imgrec_flags(inputs, work / "out", flags, config=config),
                                 work / "imgrec.log", engine_cluster[1].netns, env=subprocess_env(RUN_ENV))
            assert_run_ok(run)
            runs[environment] = (work / "out", run.log)
        return runs[environment]
    return get


@pytest.mark.engines
@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_cluster_matches_direct_runner(cluster_run, reference, environment, check):
    output, _ = cluster_run(environment)
    check_against_reference(check, output, reference)


# (input, output) store of the run on each cluster: between them, each store is read and written.
STORE_RUNS = {"flink": ("gs", "s3"), "spark": ("s3", "gs")}


@pytest.mark.engines
def test_cluster_reads_and_publishes_to_object_stores(engine_cluster, portable_engine, sample_reference, tmp_path):
    """With the Python code in the worker pool's processes, as on a real cluster: the job's store
    options (flags) and the hosts' (environment) reach every worker."""
    engine, running, _ = engine_cluster
    check_store_run(running.netns, *STORE_RUNS[engine], portable_engine.runner_flags(), tmp_path, sample_reference,
                    config=REPO / "configs" / f"{engine}.yaml")


SUMMARY_ENGINES = {
    ("flink", "external"): "on PortableRunner (Flink job server at 127.0.0.1:",
    ("flink", "loopback"): f"on FlinkRunner (job server {JOB_SERVER_JARS['flink']}, LOOPBACK environment)",
    ("spark", "external"): "on PortableRunner (Spark job server at 127.0.0.1:",
    ("spark", "loopback"): f"on SparkRunner (job server {JOB_SERVER_JARS['spark']}, LOOPBACK environment)",
}


@pytest.mark.engines
@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_summary_names_the_engine(engine_cluster, cluster_run, environment):
    _, log = cluster_run(environment)
    time_line = next(line for line in log.read_text().splitlines() if line.startswith("time: "))
    assert SUMMARY_ENGINES[(engine_cluster[0], environment)] in time_line


@pytest.mark.engines
def test_both_slots_convert_parts_of_the_shards(cluster_run):
    """The shards are cut into 14 parts (tests/engines/data.py): the cluster's two SDK workers
    (one per slot or core, `sdk_worker_parallelism: 2` in configs/<engine>.yaml) each convert
    some of them."""
    output, _ = cluster_run("external")
    assert load_metadata(output)["run"]["converter_processes"] == 2


def finished_parts(output: pathlib.Path) -> list[dict]:
    """What the part files written so far say (records, digest, ...), one entry per part."""
    folder = pathlib.Path(parts_dir(str(output)))
    return [json.loads(path.read_text()) for path in folder.glob("*.json")] if folder.is_dir() else []


def cluster_parts(dataset: pathlib.Path) -> int:
    """How many parts a cluster cuts the shards of a dataset into (PART_IMAGES images each)."""
    return sum(-(-length // PART_IMAGES) for info in load_metadata(dataset)["splits"].values()
               for length in info["shard_lengths"])


@pytest.mark.engines
def test_a_worker_killed_while_converting(engine_cluster, portable_engine, inputs, reference, tmp_path):
    """SIGKILL to the TaskManager (Flink) or the Worker (Spark) once the first part is
    converted. Flink fails the job: nothing is published, the finished parts stay, and the same
    command with a new TaskManager resumes from them. Spark runs the lost tasks again on the
    Worker that replaces the killed one (started at once, as a supervisor would). Either way the
    published dataset is the reference's, byte for byte: no record twice, none missing."""
    engine, running, _ = engine_cluster
    output = tmp_path / "out"
    flags = imgrec_flags(inputs, output, portable_engine.runner_flags(), config=REPO / "configs" / f"{engine}.yaml")
    killed_after: list[int] = []

    def kill_mid_conversion() -> bool:
        done = len(finished_parts(output))
        if done < 1:
            return False
        running.kill_worker()
        killed_after.append(done)
        if AFTER_A_KILLED_WORKER[engine] == "recovers":
            running.start_worker()
        return True

    with Timer(f"{engine}: imgrec, worker killed"):
        first = run_imgrec(flags, tmp_path / "killed.log", running.netns, meanwhile=kill_mid_conversion)
    assert killed_after and killed_after[0] < cluster_parts(reference), f"not killed in the middle: {killed_after}"
    if AFTER_A_KILLED_WORKER[engine] == "fails":
        assert first.returncode == 1, first.tail()
        assert "imgrec: error: the run failed" in first.tail(5)
        assert not (output / METADATA_FILE).exists()
        kept = finished_parts(output)
        assert len(kept) >= killed_after[0]
        running.start_worker()
        with Timer(f"{engine}: imgrec, resumed"):
            second = run_imgrec(flags, tmp_path / "resumed.log", running.netns)
        assert_run_ok(second)
        # The failed job's SDK workers (in the worker pool, not the TaskManager) may finish the
        # parts they were converting after the driver gave up: the next run takes those too.
        assert load_metadata(output)["run"]["resumed_records"] >= sum(part["records"] for part in kept) > 0
        assert "resumed: " in second.tail(15)
    else:
        assert_run_ok(first)
    for check in CHECKS:
        check_against_reference(check, output, reference)


@pytest.mark.engines
def test_a_stopped_run_stops_its_job_on_the_cluster(engine_cluster, portable_engine, tmp_path):
    """SIGTERM to imgrec once the first part is converted: exit 130, nothing published, and the
    job stops on the cluster without writing the staging folder back. Beam's Flink job server
    (2.70) reports a batch job cancelled but leaves it running: it converted every image and wrote
    its shards back after the driver had cleared the staging (it now fails at the next part that
    finishes, pipeline/output/lock.check_run_goes_on). Spark's job server cancels the job."""
    engine, running, _ = engine_cluster
    make_tree(tmp_path / "in", {"a": 400, "b": 400}, size=(128, 128))
    output = tmp_path / "out"
    flags = imgrec_flags(tmp_path / "in", output, portable_engine.runner_flags(),
                         config=REPO / "configs" / f"{engine}.yaml")
    run = run_imgrec(flags, tmp_path / "stopped.log", running.netns,
                     terminate_when=lambda: any(output.glob(".imgrec-staging/run-*/progress/*")), timeout=300)
    assert run.returncode == 130 and run.tail(1) == "imgrec: error: interrupted; nothing was published", run.tail()
    deadline = time.monotonic() + 120
    while running.jobs_running() and time.monotonic() < deadline:
        time.sleep(1)
    assert running.jobs_running() == 0, f"{engine}'s job still runs 120 s after the driver stopped"
    assert not (output / METADATA_FILE).exists()
    assert not list(output.glob(".imgrec-staging/run-*/**/*.tfrecord*"))
