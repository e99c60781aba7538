"""The same pipeline code and config on several runners.

- DirectRunner in_memory (the reference), DirectRunner multi_processing (2 worker processes) and
  PortableRunner against Beam's Python job service with an EXTERNAL worker pool (started by
  tests/portable.py) convert data/sample with the built-in defaults; the datasets must hold the
  same records per split, and in fact byte-identical shard files.
- DataflowRunner with --dry_run=True builds the Dataflow job offline, from the built-in defaults and
  from configs/imagenet.yaml as shipped: the job's code runs in Beam's SDK container, and
  --setup_file is built into the workflow.tar.gz that Dataflow would stage (or
  --sdk_container_image names the worker image). Any connection off the loopback fails the test.
  A dry run leaves the output alone: no folder, no lock, no staging.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import errno
import hashlib
import ipaddress
import json
import os
import pathlib
import re
import socket
import tarfile
import tempfile
import time
from typing import Sequence

import grpc
import pytest

from pipeline import __version__
from tests.helpers import IN_MEMORY, MULTI_PROCESSING, REPO, SAMPLE, read_split_records, run_here, run_pipeline
from tests.portable import PortableServices, live_group_members, local_portable_services
from transforms.dataset_format import DatasetMetadata

pytestmark = pytest.mark.e2e



@dataclasses.dataclass(frozen=True)
class Dataset:
    path: pathlib.Path
    metadata: DatasetMetadata


def convert(output: pathlib.Path, runner: Sequence[str]) -> Dataset:
    return Dataset(output, run_pipeline(SAMPLE, output, runner=runner))


def split_records(dataset: Dataset) -> dict[str, list[bytes]]:
    """Every split's serialized records, read back with TensorFlow from the files metadata.json lists."""
    return {split: read_split_records(dataset.path, dataset.metadata, split) for split in dataset.metadata.splits}


def file_digests(dataset: Dataset) -> dict[str, str]:
    """sha256 of every file the run published (shards, record index, dead letters), by name."""
    found = {str(p.relative_to(dataset.path)) for p in dataset.path.rglob("*") if p.is_file()}
    assert found == set(dataset.metadata.owned_files()), "the output holds other files than the dataset's"
    return {name: hashlib.sha256((dataset.path / name).read_bytes()).hexdigest()
            for name in sorted(found) if name != "metadata.json"}


def comparable_metadata(dataset: Dataset) -> dict:
    """metadata.json less what differs between runs by design: run info and the output path."""
    metadata = json.loads(dataset.metadata.dumps())
    metadata.pop("run")
    metadata["config"]["output"].pop("path")
    return metadata


def assert_same_dataset(actual: Dataset, expected: Dataset) -> None:
    actual_records, expected_records = split_records(actual), split_records(expected)
    assert actual_records.keys() == expected_records.keys()
    for split in expected_records:
        assert collections.Counter(actual_records[split]) == collections.Counter(expected_records[split]), split
        # The order is a seeded hash of the path, so even the order within the split agrees.
        assert actual_records[split] == expected_records[split], split
    assert file_digests(actual) == file_digests(expected)
    assert comparable_metadata(actual) == comparable_metadata(expected)


@pytest.fixture(scope="module")
def portable_services(tmp_path_factory) -> PortableServices:
    with local_portable_services(tmp_path_factory.mktemp("portable_services")) as services:
        yield services
    left = [pid for service in (services.job_service, services.worker_pool)
            for pid in live_group_members(service.process.pid)]
    assert not left, f"processes left running: {left}\n{services.output()}"


@pytest.fixture(scope="module")
def forking_pool_services(tmp_path_factory) -> PortableServices:
    with local_portable_services(tmp_path_factory.mktemp("forking_pool"),
                                 worker_pool_module="pipeline.worker_pool") as services:
        yield services
    left = [pid for service in (services.job_service, services.worker_pool)
            for pid in live_group_members(service.process.pid)]
    assert not left, f"processes left running: {left}\n{services.output()}"


@pytest.fixture(scope="module")
def in_memory(tmp_path_factory) -> Dataset:
    return convert(tmp_path_factory.mktemp("in_memory") / "dataset", IN_MEMORY)


@pytest.fixture(scope="module")
def multi_processing(tmp_path_factory) -> Dataset:
    return convert(tmp_path_factory.mktemp("multi_processing") / "dataset", MULTI_PROCESSING)


@pytest.fixture(scope="module")
def portable(tmp_path_factory, portable_services) -> Dataset:
    try:
        return convert(tmp_path_factory.mktemp("portable") / "dataset", portable_services.runner_flags())
    except Exception as exc:
        raise AssertionError(f"PortableRunner run failed: {exc}\n{portable_services.output()}") from exc


@pytest.mark.timeout(120)
def test_direct_in_memory_reference(in_memory):
    metadata = in_memory.metadata
    records = split_records(in_memory)
    assert metadata.run["runner"] == "DirectRunner"
    assert (metadata.inputs.total, metadata.inputs.written) == (38, 36)
    assert {split: len(r) for split, r in records.items()} == {
        split: info.num_examples for split, info in metadata.splits.items()}
    assert sum(map(len, records.values())) == metadata.inputs.written


@pytest.mark.unit
def test_a_full_disk_or_quota_is_recognised_through_beams_wrapping():
    from pipeline.run import out_of_space

    wrapped = RuntimeError(f"OSError: [Errno 122] {os.strerror(errno.EDQUOT)} [while running 'WriteShards']")
    assert out_of_space(wrapped) and out_of_space(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert not out_of_space(OSError(errno.EACCES, os.strerror(errno.EACCES)))


@pytest.mark.unit
def test_a_java_runners_failure_is_told_by_its_reason_not_its_stack():
    """Spark's job failure (its worker pool killed) ended the run's one line with
    `RuntimeError: Driver stacktrace:`: the last line of Spark's message, after the Java frames."""
    from pipeline.run import last_line

    reason = ("Pipeline BeamApp-1 failed in state FAILED: org.apache.spark.SparkException: Job aborted due to stage "
              "failure: Task 2 in stage 19.0 failed 4 times, most recent failure: Lost task 2.3 in stage 19.0 "
              "(TID 52) (127.0.0.1 executor 0): io.grpc.StatusRuntimeException: CANCELLED: call already cancelled.")
    spark = RuntimeError("\n".join([reason, "\tat io.grpc.Status.asRuntimeException(Status.java:524)",
                                     "\tat org.apache.spark.rdd.RDD.iterator(RDD.scala:331)", "\t... 3 more", "",
                                     "Driver stacktrace:"]))
    assert last_line(spark) == reason
    python = RuntimeError("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
                          "ValueError: bad [while running 'Step']")
    assert last_line(python) == "ValueError: bad [while running 'Step']"


@pytest.mark.unit
def test_the_fn_api_runner_is_built_with_the_options_its_workers_see():
    """pipeline/beam_internals.py builds the FnApiRunner as Beam's DirectRunner builds it once Prism
    failed: its SDK workers (multi_processing) get the job's options, such as where S3 is. A Beam
    release that changes these internal APIs fails this test."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from google.protobuf import json_format

    from pipeline.beam_internals import fn_api_runner

    runner = fn_api_runner(PipelineOptions(["--runner=DirectRunner", "--s3_endpoint_url=http://127.0.0.1:9000"]))
    assert isinstance(runner, fn_runner.FnApiRunner)
    seen = json_format.MessageToDict(runner._provision_info.provision_info.pipeline_options)
    assert seen["beam:option:s3_endpoint_url:v1"] == "http://127.0.0.1:9000"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_direct_multi_processing_matches_in_memory(multi_processing, in_memory):
    assert_same_dataset(multi_processing, in_memory)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_portable_runner_external_workers_matches_direct(portable, in_memory, multi_processing, portable_services):
    assert portable.metadata.run["runner"] == "PortableRunner"
    # The job ran on the job service, and its user code in workers the pool started.
    assert "Running job" in portable_services.job_service.output()
    assert "Starting worker with command" in portable_services.worker_pool.output()
    assert_same_dataset(portable, in_memory)
    assert_same_dataset(portable, multi_processing)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_imgrecs_worker_pool_runs_the_sdk_workers(tmp_path, forking_pool_services, in_memory):
    """`python -m pipeline.worker_pool` (SDK workers forked from a process that has Beam and
    imgrec imported) in place of Beam's pool: the same dataset, and the pool is left with no
    worker once the job is done."""
    pool = forking_pool_services.worker_pool.process.pid
    idle = set(live_group_members(pool))
    try:
        dataset = convert(tmp_path / "dataset", forking_pool_services.runner_flags())
    except Exception as exc:
        raise AssertionError(f"PortableRunner run failed: {exc}\n{forking_pool_services.output()}") from exc
    assert_same_dataset(dataset, in_memory)
    deadline = time.monotonic() + 30
    while set(live_group_members(pool)) != idle and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(live_group_members(pool)) == idle, forking_pool_services.output()


# --- DataflowRunner, dry run -------------------------------------------------------------------

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def _is_loopback(host) -> bool:
    if host is None:
        return True
    host = host.decode() if isinstance(host, bytes) else str(host)
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture
def no_network(monkeypatch):
    """Fails the test on any DNS lookup or connection (from Python sockets) off the loopback.

    The sdist build is a subprocess and is not covered; gRPC's C core neither, but a dry run
    never creates a Dataflow API client.
    """
    attempts = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def check(address):
        if isinstance(address, tuple) and not _is_loopback(address[0]):
            attempts.append(address)
            raise OSError(f"test blocks network access to {address!r}")

    def connect(sock, address):
        check(address)
        return real_connect(sock, address)

    def connect_ex(sock, address):
        check(address)
        return real_connect_ex(sock, address)

    def getaddrinfo(host, *args, **kwargs):
        check((host,))
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield attempts
    assert not attempts, f"the dry run tried to reach {attempts}"


def dataflow_dry_run(tmp_path: pathlib.Path, monkeypatch, *flags: str):
    """Runs pipeline.run.run() with DataflowRunner --dry_run=True; returns Beam's result and the output."""
    from pipeline.run import run

    # Beam builds the staged artifacts (sdist, pickled main session) in tempfile.mkdtemp() dirs
    # and leaves them behind: keep them under tmp_path.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    # A local output folder lets the test check that a dry run creates nothing there.
    output = tmp_path / "dataset"
    result = run(["--runner=DataflowRunner", "--dry_run=True", "--project=imgrec-test", "--region=us-central1",
                  "--temp_location=gs://imgrec-test-bucket/tmp", f"--input={SAMPLE}", f"--output={output}", *flags])
    return result, output, scratch


def docker_environments(pipeline_proto) -> dict:
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import beam_runner_api_pb2

    return {env_id: (beam_runner_api_pb2.DockerPayload.FromString(env.payload).container_image, env)
            for env_id, env in pipeline_proto.components.environments.items()
            if env.urn == common_urns.environments.DOCKER.urn}


def staged_files(environment) -> dict[str, pathlib.Path]:
    """staged name (what Dataflow uploads it as) → the local file that would be uploaded."""
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import beam_runner_api_pb2

    staged = {}
    for dep in environment.dependencies:
        assert dep.type_urn == common_urns.artifact_types.FILE.urn
        assert dep.role_urn == common_urns.artifact_roles.STAGING_TO.urn
        name = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(dep.role_payload).staged_name
        staged[name] = pathlib.Path(beam_runner_api_pb2.ArtifactFilePayload.FromString(dep.type_payload).path)
    return staged


def assert_dataflow_job(result, output: pathlib.Path) -> tuple[str, object]:
    """Checks the dry-run job and returns (container image, environment) of our steps."""
    import apache_beam as beam
    from apache_beam.runners.dataflow.internal import apiclient

    assert result.state == beam.runners.runner.PipelineState.DONE
    job = result.job
    assert isinstance(job, apiclient.Job)
    assert job.proto.type_ == apiclient.dataflow.JobType.JOB_TYPE_BATCH
    assert job.proto.name
    used = {t.environment_id for t in job.proto_pipeline.components.transforms.values() if t.environment_id}
    environments = docker_environments(job.proto_pipeline)
    assert used and used <= set(environments), "Dataflow runs user code in a Docker environment"
    # Nothing ran: no dataset, no lock, no staging (which would be inside the output).
    assert not output.exists()
    (environment,) = used  # one environment: every step is imgrec's Python code
    return environments[environment]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("config", [None, "imagenet.yaml"])
def test_dataflow_dry_run_with_setup_file(config, tmp_path, monkeypatch, no_network, capfd):
    import apache_beam as beam

    if config:
        # The Dataflow config as shipped: its beam section names DataflowRunner and
        # setup_file ./setup.py, which (like the docs' commands) is relative to the repo root.
        monkeypatch.chdir(REPO)
        flags = (f"--config={REPO / 'configs' / config}",)
    else:
        flags = (f"--setup_file={REPO / 'setup.py'}",)
    result, output, scratch = dataflow_dry_run(tmp_path, monkeypatch, *flags)
    image, environment = assert_dataflow_job(result, output)
    assert image == f"gcr.io/cloud-dataflow/v1beta3/beam_python3.11_sdk:{beam.__version__}"

    staged = staged_files(environment)
    assert "workflow.tar.gz" in staged, staged  # the sdist of setup.py, installed on every worker
    assert "No module named build" not in capfd.readouterr().err  # the gcp extra has what Beam's stager runs
    sdist = staged["workflow.tar.gz"]
    root = f"imgrec-{__version__}"
    assert sdist.is_relative_to(scratch) and sdist.name == f"{root}.tar.gz"
    with tarfile.open(sdist) as tar:
        members = {m.name for m in tar.getmembers()}
        assert {f"{root}/setup.py", f"{root}/pipeline/run.py", f"{root}/pipeline/convert.py",
                f"{root}/transforms/write/write_shards.py", f"{root}/configs/seed.yaml"} <= members
        assert tar.extractfile(f"{root}/setup.py").read() == (REPO / "setup.py").read_bytes()


@pytest.mark.timeout(120)
def test_dataflow_dry_run_with_custom_container(tmp_path, monkeypatch, no_network):
    image_name = f"us-central1-docker.pkg.dev/imgrec-test/beam/imgrec-worker:{__version__}"
    result, output, _ = dataflow_dry_run(tmp_path, monkeypatch, f"--sdk_container_image={image_name}")
    image, environment = assert_dataflow_job(result, output)
    assert image == image_name
    # The image has the package installed (Dockerfile), so no source package is staged.
    assert "workflow.tar.gz" not in staged_files(environment)



@pytest.mark.timeout(120)
def test_the_imagenet_config_with_the_worker_image_turns_its_setup_file_off(tmp_path, monkeypatch, no_network):
    """runners.md's second way (the worker image, no --setup_file) with the shipped imagenet
    config, which names setup_file ./setup.py: `--setup_file=` was taken by Beam as a file named
    '' (RuntimeError, exit 1), so the config's setup_file could not be turned off."""
    image_name = f"us-central1-docker.pkg.dev/imgrec-test/beam/imgrec-worker:{__version__}"
    monkeypatch.chdir(tmp_path)
    result, output, _ = dataflow_dry_run(tmp_path, monkeypatch, "--config=imagenet", "--setup_file=",
                                         f"--sdk_container_image={image_name}")
    image, environment = assert_dataflow_job(result, output)
    assert image == image_name
    assert "workflow.tar.gz" not in staged_files(environment)

@pytest.mark.timeout(120)
def test_dataflow_dry_run_from_the_command_line_leaves_gcs_alone(tmp_path, monkeypatch, no_network, capsys):
    """`python -m pipeline.run ... --dry_run=True` with gs:// paths: no GCS access, exit code 0."""
    from pipeline.run import main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(REPO)
    assert main(["--config=configs/imagenet.yaml", "--input=gs://imgrec-test-bucket/images",
                 "--output=gs://imgrec-test-bucket/datasets/{date}", "--project=imgrec-test",
                 "--region=us-central1", "--temp_location=gs://imgrec-test-bucket/tmp", "--dry_run=True"]) == 0
    assert "dry run: built the Dataflow job for gs://imgrec-test-bucket/datasets/20" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# Parallelism is not capped by the shard count; runners imgrec cannot trust are refused


def many_small_images(root: pathlib.Path, count: int) -> pathlib.Path:
    import cv2
    import numpy as np

    for i in range(count):
        rng = np.random.default_rng(i)
        path = root / ("ant", "bee")[i % 2] / f"{i:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(path), rng.integers(0, 256, (12, 16, 3), dtype=np.uint8))
    return root


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("runner, count", [(("--convert_processes=2", *IN_MEMORY), 60), (MULTI_PROCESSING, 600)],
                         ids=["converter-processes", "multi-processing"])
def test_one_shard_is_converted_by_two_processes(tmp_path, runner, count):
    """One shard is cut into parts that both processes convert (a local pool cuts 60 images into
    15 parts of 4; Beam's workers get parts of 256 images, 3 of them here); the shard's bytes do
    not depend on who converted which part."""
    images = many_small_images(tmp_path / "images", count)
    flags = ("--num_shards=1", "--split_names=train", "--split_ratios=1", "--height=8", "--width=8")
    metadata = run_pipeline(images, tmp_path / "out", *flags, runner=runner)
    assert metadata.splits["train"].num_shards == 1 and metadata.inputs.written == count
    assert metadata.run["converter_processes"] == 2
    inline = run_pipeline(images, tmp_path / "inline", *flags, "--convert_processes=1", runner=IN_MEMORY)
    assert inline.run["converter_processes"] == 1
    assert read_split_records(tmp_path / "out", metadata, "train") == \
        read_split_records(tmp_path / "inline", inline, "train")


def test_dask_runner_is_refused_with_one_line(tmp_path, capsys):
    from pipeline.run import main

    assert main(["--runner=DaskRunner", f"--input={SAMPLE}", f"--output={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("imgrec: error: --runner=DaskRunner is not supported")
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(60)
def test_the_imagenet_config_run_outside_the_clone_is_a_usage_error(tmp_path, monkeypatch, no_network, capsys):
    """`imgrec run --config=imagenet ...` from a folder without setup.py (a pip-installed imgrec):
    Beam's stager failed with a traceback (exit 1) once the output was locked, on `./setup.py`."""
    from pipeline.run import main

    monkeypatch.chdir(tmp_path)
    output = tmp_path / "out"
    assert main(["--config=imagenet", f"--input={SAMPLE}", f"--output={output}",
                 "--project=imgrec-test", "--region=us-central1", "--temp_location=gs://imgrec-test-bucket/tmp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("imgrec: error: --setup_file=./setup.py: no such file"), err
    assert not output.exists()


@pytest.mark.unit
@pytest.mark.parametrize("runner", ["PortableRunner", "PrismRunner", "FlinkRunner"])
def test_a_missing_setup_file_or_job_server_jar_is_a_usage_error_on_every_runner_that_stages_it(runner, tmp_path):
    """Beam's stager packages --setup_file (--requirements_file, --extra_package) for the portable
    runners too: a missing one failed there with a traceback (exit 1) once the output was locked;
    only Dataflow's setup_file was checked."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.errors import UsageError
    from pipeline.run import check_runner_options

    for flag in ("setup_file", "requirements_file", "extra_package", "flink_job_server_jar", "spark_job_server_jar"):
        with pytest.raises(UsageError, match=rf"^--{flag}=.*: no such file"):
            check_runner_options(PipelineOptions([f"--runner={runner}", f"--{flag}={tmp_path / 'missing'}"]))
    check_runner_options(PipelineOptions(["--runner=DirectRunner", f"--setup_file={tmp_path / 'setup.py'}"]))
    check_runner_options(PipelineOptions([f"--runner={runner}", "--extra_package=gs://bucket/imgrec.tar.gz"]))


@pytest.mark.timeout(60)
def test_a_job_server_beam_cannot_download_is_one_line_that_says_what_to_give_instead(tmp_path, capsys):
    """FlinkRunner without --job_endpoint downloads Beam's job server jar: offline, or from a URL
    that does not answer, that was a traceback."""
    from pipeline.run import main

    output = tmp_path / "out"
    assert main(["--runner=FlinkRunner", "--flink_job_server_jar=http://127.0.0.1:9/job-server.jar",
                 f"--input={SAMPLE}", f"--output={output}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("imgrec: error: the run failed: Unable to fetch remote job server jar at "
                           "http://127.0.0.1:9/job-server.jar")
    assert "--job_endpoint of a running one" in last
    assert not output.exists()


@pytest.mark.timeout(60)
def test_dataflow_without_project_or_region_is_a_usage_error(tmp_path, monkeypatch, no_network, capsys):
    """Beam's own validation (no --project, no --region) ran once the output was locked and came
    out as a traceback and exit 1."""
    from pipeline.run import main

    monkeypatch.delenv("CLOUDSDK_COMPUTE_REGION", raising=False)

    output = tmp_path / "out"
    assert main(["--runner=DataflowRunner", f"--input={SAMPLE}", f"--output={output}", "--project=imgrec-test"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("imgrec: error: --runner=DataflowRunner: "), err
    assert "Missing required option: region" in err[0]
    assert not output.exists()


@pytest.mark.unit
@pytest.mark.parametrize("runner, checked", [("PortableRunner", True), ("FlinkRunner", True), ("PrismRunner", True),
                                             ("DirectRunner", False), (None, False)])
def test_the_job_endpoint_is_checked_only_for_runners_that_submit_to_it(runner, checked):
    """`--config=configs/flink.yaml --runner=DirectRunner` runs here: the config's job endpoint
    is not the runner's business."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.errors import UsageError
    from pipeline.run import check_runner_options

    options = PipelineOptions([*([f"--runner={runner}"] if runner else []), "--job_endpoint=127.0.0.1:1"])
    if checked:
        with pytest.raises(UsageError, match="cannot connect"):
            check_runner_options(options)
    else:
        check_runner_options(options)


@pytest.mark.unit
@pytest.mark.parametrize("flags", [("--runner=FlinkRunner", "--flink_master=127.0.0.1:{port}"),
                                   ("--runner=FlinkRunner", "--flink_master=http://127.0.0.1:{port}"),
                                   ("--runner=SparkRunner", "--spark_master_url=spark://127.0.0.1:{port}")])
def test_a_cluster_master_nobody_answers_at_is_a_usage_error(flags):
    """Beam's FlinkRunner and SparkRunner without --job_endpoint start their job server, which
    submits to the master: a wrong master failed a minute later with a traceback ending in
    `java.net.ConnectException: Connection refused`. With a job endpoint, the master is the job
    server's business."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.errors import UsageError
    from pipeline.run import check_runner_options

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        given = [flag.format(port=closed.getsockname()[1]) for flag in flags]
        with pytest.raises(UsageError, match=f"^{re.escape(given[1])}: cannot connect"):
            check_runner_options(PipelineOptions(given))
        with socket.create_server(("127.0.0.1", 0)) as listening:
            check_runner_options(PipelineOptions([flags[0], flags[1].format(port=listening.getsockname()[1])]))


@pytest.mark.unit
@pytest.mark.parametrize("flags, error", [
    (("--environment_type=EXTERNAL",), "--environment_type=EXTERNAL: Option external_service_address is required"),
    (("--config=flink", "--environment_type=LOOPBACK"),
     "--environment_type=LOOPBACK: Option environment_config is not compatible"),
    (("--config=flink", "--environment_type=BOGUS"), "--environment_type=BOGUS: not an environment type"),
    (("--config=flink", "--environment_type=external"), "--environment_type=external: not an environment type")])
def test_environment_options_beam_refuses_are_a_usage_error(flags, error):
    """EXTERNAL without a worker pool's address, or configs/flink.yaml switched to LOOPBACK (its
    environment_config kept): Beam refused them only once the output was locked, with a
    traceback and exit 1."""
    from pipeline.errors import UsageError
    from pipeline.options import parse_arguments
    from pipeline.run import check_environment_options

    options = parse_arguments(["--runner=PortableRunner", "--input=x", "--output=y", *flags]).options
    with pytest.raises(UsageError, match=f"^{re.escape(error)}"):
        check_environment_options(options)


@pytest.mark.unit
def test_a_job_endpoint_that_accepts_but_speaks_no_grpc_is_a_usage_error(monkeypatch):
    """--job_endpoint at an HTTP port (Flink's web UI, 8081, for the job server's 8099): the
    connect succeeded, and Beam then waited --job_server_timeout (5 minutes) for gRPC and failed
    with a traceback and an empty message."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline import run
    from pipeline.errors import UsageError

    monkeypatch.setattr(run, "JOB_SERVICE_CONNECT_TIMEOUT", 1.0)
    with socket.create_server(("127.0.0.1", 0)) as server:  # listens, never answers
        endpoint = f"127.0.0.1:{server.getsockname()[1]}"
        with pytest.raises(UsageError, match="no gRPC service answered"):
            run.check_runner_options(PipelineOptions(["--runner=FlinkRunner", f"--job_endpoint={endpoint}"]))


@pytest.mark.timeout(120)
def test_a_job_endpoint_that_is_no_beam_job_service_is_named_by_its_status(tmp_path, capsys):
    """A gRPC server without Beam's job service answered: the error line ended in a lone `>`
    (the last line of gRPC's error text), which said nothing. imgrec's main() in this process:
    the line is the same, and there is no interpreter and Beam start to pay for."""
    from pipeline.run import main

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        done = run_here(capsys, main, ["--runner=PortableRunner", f"--job_endpoint=127.0.0.1:{port}",
                                       f"--input={SAMPLE}", f"--output={tmp_path / 'out'}"])
    finally:
        server.stop(0)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1].endswith("StatusCode.UNIMPLEMENTED: Method not found!"), done.stderr[-2000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(300)
def test_a_job_service_that_dies_mid_run_is_one_line(tmp_path, forking_pool_services):
    """The job service killed while the job converts (a Flink or Spark job server that crashed or
    was restarted): one line and exit 1, not gRPC's UNAVAILABLE as two tracebacks (Beam's thread
    reading the job's messages, then the run) ending in `_MultiThreadedRendezvous: ...`."""
    import signal
    import subprocess
    import sys

    from tests.helpers import make_tree, subprocess_env
    from tests.portable import JOB_SERVICE_MODULE, free_port, start_service, stop_service

    make_tree(tmp_path / "in", {"a": 150, "b": 150}, size=(256, 256))
    output = tmp_path / "out"
    port = free_port()  # a job service of its own, for the module's to stay up
    service = start_service("doomed_job_service", JOB_SERVICE_MODULE, [f"--port={port}"], port, tmp_path / "logs",
                            subprocess_env(), 60)
    flags = ["--runner=PortableRunner", f"--job_endpoint=localhost:{port}", "--environment_type=EXTERNAL",
             f"--environment_config={forking_pool_services.worker_pool_endpoint}"]
    driver = subprocess.Popen([sys.executable, "-m", "pipeline.run", *flags, f"--input={tmp_path / 'in'}",
                               f"--output={output}"], cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        while not any(output.glob(".imgrec-staging/run-*/progress/*")) and driver.poll() is None:
            time.sleep(0.05)  # the job converts
        os.killpg(service.process.pid, signal.SIGKILL)
        _, err = driver.communicate(timeout=120)
    finally:
        driver.kill()
        stop_service(service)
    assert driver.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith(
        "imgrec: error: the run failed: the job service stopped answering ("), err[-3000:]
    assert not (output / "metadata.json").exists()


@pytest.mark.unit
def test_worker_pool_on_a_port_in_use_is_one_line(capsys):
    """A host's second `python -m pipeline.worker_pool` on the same port: exit 1 with one line
    saying why, not gRPC's `RuntimeError: Failed to bind` traceback."""
    from pipeline import worker_pool

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert worker_pool.main([f"--service_port={port}", "--host=127.0.0.1"]) == 1
    assert capsys.readouterr().err == (f"python -m pipeline.worker_pool: error: cannot listen on 127.0.0.1:{port}: "
                                       "is something else (another worker pool) listening there?\n")
