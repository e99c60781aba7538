"""What the summary names as the engine that ran: the runner, and the engine under it as far as
the run can tell from its options and its job service."""
from __future__ import annotations

import posixpath
from typing import Optional

import grpc
from apache_beam.options.pipeline_options import FlinkRunnerOptions, PortableOptions, SparkRunnerOptions
from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

DESCRIBE_TIMEOUT = 5.0  # s: the job service answered the run a moment ago
# A Java job server describes its runner's own options: their names tell the engine.
_ENGINE_OPTIONS = {"flink_master": "Flink", "spark_master": "Spark"}


def engine_of_options(names: set[str]) -> Optional[str]:
    """'Flink' or 'Spark' from the option names a job service describes; None for others."""
    return next((engine for option, engine in _ENGINE_OPTIONS.items() if option in names), None)


def job_service_engine(endpoint: str) -> Optional[str]:
    """The engine behind a job service (DescribePipelineOptions, Beam's Job API); None when it
    does not say or does not answer."""
    with grpc.insecure_channel(endpoint) as channel:
        try:
            response = beam_job_api_pb2_grpc.JobServiceStub(channel).DescribePipelineOptions(
                beam_job_api_pb2.DescribePipelineOptionsRequest(), timeout=DESCRIBE_TIMEOUT)
        except grpc.RpcError:
            return None
    return engine_of_options({option.name for option in response.options})


def _job_server(jar: Optional[str], engine: str) -> str:
    """The jar Beam started (it says which engine and Beam version), else the one Beam downloads."""
    return f"job server {posixpath.basename(jar)}" if jar else f"{engine} job server"


def engine_name(runner: str, options) -> str:
    """e.g. "DirectRunner (FnApiRunner)", "FlinkRunner (Flink 1.19 job server, LOOPBACK environment)",
    "SparkRunner (job server beam-runners-spark-3-job-server-2.70.0.jar, LOOPBACK environment)",
    "PortableRunner (Flink job server at 127.0.0.1:8099, EXTERNAL environment)"."""
    if runner == "DirectRunner":
        return "DirectRunner (FnApiRunner)"
    portable = options.view_as(PortableOptions)
    environment = f", {portable.environment_type} environment" if portable.environment_type else ""
    if runner == "FlinkRunner":
        flink = options.view_as(FlinkRunnerOptions)
        return f"FlinkRunner ({_job_server(flink.flink_job_server_jar, f'Flink {flink.flink_version}')}{environment})"
    if runner == "SparkRunner":
        spark = options.view_as(SparkRunnerOptions)
        return f"SparkRunner ({_job_server(spark.spark_job_server_jar, f'Spark {spark.spark_version}')}{environment})"
    if runner == "PortableRunner" and portable.job_endpoint:
        engine = job_service_engine(portable.job_endpoint)
        service = f"{engine} job server" if engine else "job service"
        return f"PortableRunner ({service} at {portable.job_endpoint}{environment})"
    return runner
