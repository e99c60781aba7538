"""The one place imgrec uses Beam APIs that Beam documents as internal, or reads Beam's messages;
tests/test_runners.py fails the day a Beam release changes them.

`--runner=DirectRunner` first submits the job to Prism (downloading Prism from GitHub when it is
not cached) and falls back to the FnApiRunner when that fails. For this batch job the public
route costs more than imgrec's 5% budget: measured on data/sample, 3 interleaved rounds (issue
39), CPU time 1.25x with Prism available and 1.18x for the failed try offline (median of the
per-round ratios); docs/runners.md has Prism's 2.3 s more per run. So imgrec builds the
FnApiRunner as Beam's DirectRunner builds it after Prism failed. `--runner=PrismRunner` still
runs on Prism.
"""
from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.runners.portability.portable_runner import JobServiceHandle
from apache_beam.runners.runner import PipelineRunner, create_runner


def fn_api_runner(options: PipelineOptions) -> PipelineRunner:
    """The FnApiRunner, with the job's options for its SDK workers (multi_processing workers read
    where S3 is, and every other filesystem option, from them)."""
    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))


def runner_error(runner: str) -> str:
    """Why Beam cannot make `--runner` (a typo, a runner whose extra is not installed), or ''."""
    try:
        create_runner(runner)
    except (ValueError, ImportError) as exc:
        return str(exc).splitlines()[0]
    return ""


def unfetched_job_server(exc: BaseException) -> bool:
    """Whether Beam's FlinkRunner or SparkRunner failed to download its job server jar (no internet,
    or a --*_job_server_jar URL that does not answer): Beam says so only in its message."""
    return isinstance(exc, RuntimeError) and str(exc).startswith("Unable to fetch remote job server jar")
