"""What the summary names as the engine (pipeline/engine_name.py), and which runs convert on
imgrec's own process pool (pipeline/run.py: runs_in_one_process)."""
from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.engine_name import engine_name, engine_of_options
from pipeline.run import runner_name, runs_in_one_process
from tests.portable import free_port

pytestmark = pytest.mark.unit


def named(*flags: str) -> str:
    options = PipelineOptions(list(flags))
    return engine_name(runner_name(options), options)


def test_a_java_job_server_is_told_by_the_options_it_describes():
    assert engine_of_options({"flink_master", "parallelism", "runner"}) == "Flink"
    assert engine_of_options({"spark_master", "storage_level"}) == "Spark"
    assert engine_of_options({"runner", "job_endpoint"}) is None


def test_the_summary_names_the_engine_under_the_runner():
    assert named() == "DirectRunner (FnApiRunner)"
    assert named("--runner=FlinkRunner", "--flink_version=1.19", "--environment_type=LOOPBACK") == \
        "FlinkRunner (Flink 1.19 job server, LOOPBACK environment)"
    assert named("--runner=SparkRunner", "--spark_job_server_jar=/jars/beam-runners-spark-3-job-server-2.70.0.jar") == \
        "SparkRunner (job server beam-runners-spark-3-job-server-2.70.0.jar)"
    assert named("--runner=PrismRunner") == "PrismRunner"
    assert named("--runner=apache_beam.runners.direct.direct_runner.DirectRunner") == "DirectRunner (FnApiRunner)"


def test_a_job_service_that_does_not_answer_is_named_by_its_address():
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    assert named("--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=EXTERNAL") == \
        f"PortableRunner (job service at {endpoint}, EXTERNAL environment)"


@pytest.mark.parametrize("flags, one_process", [
    ((), True),
    (("--direct_running_mode=multi_processing",), False),
    (("--runner=PrismRunner",), True),
    (("--runner=PrismRunner", "--environment_type=EXTERNAL"), False),
    (("--runner=FlinkRunner", "--environment_type=LOOPBACK"), True),
    (("--runner=SparkRunner", "--environment_type=LOOPBACK"), True),
    (("--runner=PortableRunner", "--environment_type=LOOPBACK"), True),
    (("--runner=PortableRunner", "--environment_type=EXTERNAL"), False),
    (("--runner=FlinkRunner", "--environment_type=DOCKER"), False),
    (("--runner=apache_beam.runners.direct.direct_runner.DirectRunner",), True),  # the runner a dotted name names
])
def test_loopback_runs_every_step_in_the_launching_process(flags, one_process):
    """LOOPBACK runs the SDK harness on threads of the launching process, whatever the runner:
    imgrec then converts on its own processes (one per core) instead of on those threads."""
    assert runs_in_one_process(PipelineOptions(list(flags))) is one_process
