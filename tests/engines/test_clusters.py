"""imgrec on a Flink session cluster and on a Spark standalone cluster, through Beam's job servers.

Each cluster runs as real separate processes started by the fixture from the fetched
distributions (Flink: a JobManager and a TaskManager with 2 slots; Spark: a Master and a Worker
with 2 cores), all on 127.0.0.1. Beam's job server for the engine (`java -jar`, from Maven) turns
the pipeline into a Flink or Spark job; the Python code runs in an EXTERNAL worker pool. Over
data/sample and the generated set, the published shards, dead letters and metadata counts must
equal the DirectRunner reference's.

Beam's job-server jars come from Maven Central (`mvn dependency:copy`, see fetch.py). Where the
registry does not serve them, the pipeline tests are skipped with the Maven error, and the
cluster tests still start, check and stop each cluster.
"""
from __future__ import annotations

import psutil
import pytest
import yaml

from tests.engines.conftest import (
    CHECKS,
    CONFIG,
    DATASETS,
    Timer,
    assert_run_ok,
    check_against_reference,
    expect_known_bug,
    imgrec_flags,
)
from tests.engines.engines import cluster, fetch_report, job_server, job_server_jar, run_imgrec
from tests.helpers import REPO
from tests.portable import live_group_members

ENGINES = ("flink", "spark")


def group_pids(services) -> list[int]:
    return [pid for service in services for pid in live_group_members(service.process.pid)]


@pytest.mark.engines
@pytest.mark.parametrize("engine", ENGINES)
def test_engine_config_converts_as_local_yaml_does(engine):
    """configs/<engine>.yaml differs from configs/local.yaml only in its runner flags (and the
    output folder), so what it writes can be compared with the DirectRunner's."""
    ours, local = (yaml.safe_load(path.read_text()) for path in (REPO / "configs" / f"{engine}.yaml", CONFIG))
    assert ours["beam"]["runner"] == "PortableRunner" and ours["beam"]["environment_type"] == "EXTERNAL"
    for config in (ours, local):
        config.pop("beam")
        config["output"].pop("path")
    assert ours == local


@pytest.mark.engines
@pytest.mark.parametrize("engine", ENGINES)
def test_teardown_stops_every_process_when_the_test_fails(engine, tmp_path):
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="a failing test"):
        with Timer(f"{engine}: start a cluster, fail, stop it"), cluster(engine, tmp_path) as running:
            assert running.workers() == 1
            pids = group_pids(running.services)
            raise RuntimeError("a failing test")
    assert pids and not [pid for pid in pids if psutil.pid_exists(pid) and
                         psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(scope="module", params=ENGINES)
def engine_cluster(request, tmp_path_factory):
    engine = request.param
    work = tmp_path_factory.mktemp(engine)
    with Timer(f"{engine}: start the cluster"):
        context = cluster(engine, work)
        running = context.__enter__()
    try:
        yield engine, running, work
    finally:
        context.__exit__(None, None, None)  # raises if a process survived


@pytest.mark.engines
def test_cluster_has_a_worker_and_listens_only_on_loopback(engine_cluster):
    engine, running, _ = engine_cluster
    assert running.workers() == 1
    listening = {(conn.laddr.ip, conn.laddr.port) for pid in group_pids(running.services)
                 for conn in psutil.Process(pid).net_connections("inet") if conn.status == psutil.CONN_LISTEN}
    assert listening
    assert {ip for ip, _ in listening} <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening


@pytest.fixture(scope="module")
def portable_engine(engine_cluster):
    engine, running, work = engine_cluster
    jar = job_server_jar(engine)
    if jar is None:
        recorded = fetch_report().get(f"{engine}_job_server", {})
        pytest.skip(f"no Beam {engine} job server jar: `{recorded.get('command', 'mvn dependency:copy')}` "
                    f"failed: {recorded.get('error', 'not fetched')}")
    with Timer(f"{engine}: start Beam's job server + worker pool"):
        context = job_server(engine, jar, running.master, work / "job-server")
        served = context.__enter__()
    try:
        yield served
    finally:
        context.__exit__(None, None, None)


@pytest.fixture(scope="module")
def cluster_output(engine_cluster, portable_engine, inputs, tmp_path_factory):
    engine = engine_cluster[0]
    outputs = {}

    def get(dataset: str):
        if dataset not in outputs:
            work = tmp_path_factory.mktemp(f"{engine}-{dataset}")
            flags = imgrec_flags(inputs, dataset, work / "out", portable_engine.runner_flags(),
                                 config=REPO / "configs" / f"{engine}.yaml")
            with Timer(f"{engine}: imgrec on {dataset}"):
                run = run_imgrec(flags, work / "imgrec.log")
            assert_run_ok(run)
            outputs[dataset] = work / "out"
        return outputs[dataset]
    return get


@pytest.mark.engines
@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("dataset", DATASETS)
def test_cluster_matches_direct_runner(engine_cluster, cluster_output, reference, dataset, check, request):
    expected = reference(dataset)
    output = cluster_output(dataset)
    expect_known_bug(request, engine_cluster[0], check, dataset)
    check_against_reference(check, output, expected)
