"""Entry point: `python -m pipeline.run --input=... --output=... [--config=FILE]`.

`run(argv)` converts and publishes and returns Beam's result; `main()` turns the outcome into
an exit code (see pipeline/errors.py) and prints the summary. Schedulers rely on the exit code.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import logging
import os
import re
import socket
import sys
import time
import uuid
from typing import Optional, Sequence

from pipeline import interrupts  # imports no Beam: fields a signal while Beam's imports run
from pipeline.standard_streams import say

if __name__ == "__main__":  # `imgrec run`, which answers --help and fields signals before Beam's imports
    from pipeline.cli import entry_point

    entry_point(["run", *sys.argv[1:]])

import apache_beam as beam  # noqa: E402
import grpc  # noqa: E402
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DirectOptions,
    FlinkRunnerOptions,
    GoogleCloudOptions,
    PortableOptions,
    SetupOptions,
    SparkRunnerOptions,
    StandardOptions,
    TestOptions,
)
from apache_beam.runners.runner import PipelineResult, PipelineState

from pipeline import stores
from pipeline.beam_internals import fn_api_runner, runner_error, unfetched_job_server
from pipeline.convert import UNCHANGED_MARKER, VERDICT_FILE, ConvertToTFRecords, RunContext
from pipeline.engine_name import engine_name
from pipeline.errors import ImgrecError, Interrupted, OutOfSpace, RunFailed, UsageError
from pipeline.heap import imports_frozen
from pipeline.metadata import TooManyErrors, pixel_fingerprint, versions
from pipeline.options import ImgrecOptions, parse_arguments
from pipeline.output.lock import OutputLock
from pipeline.output.progress import ProgressReporter, default_interval
from pipeline.output.publish import interrupted_outcome
from pipeline.output.retention import check_retention, datasets_to_remove, remove_dataset
from pipeline.prepare import (
    LATEST,
    check_layout,
    check_output,
    clear_dead_runs,
    comparison,
    expand_output_template,
    inspect_output,
    output_folder,
    reuse_source,
    stopped_runs_beside,
)
from pipeline.reaper import reaped
from pipeline.summary import format_header, format_summary
from transforms import files, object_stores
from transforms.dataset_format import METADATA_FILE, DatasetMetadata, join, parts_dir, run_dir, staging_dir
from transforms.files import list_names, local_path
from transforms.inputs.coco import AnnotationFileError, looks_like_coco
from transforms.inputs.discover_annotated import coco_categories
from transforms.inputs.manifests import ManifestError, manifest_layout
from transforms.specs import ConversionSpec, glob_root
from transforms.write.concurrency import close_shared_pools, shared_process_pool
from transforms.write.parts import WriterSettings, record_digest

_LOG = logging.getLogger("imgrec")
JOB_SERVICE_CONNECT_TIMEOUT = 10.0  # s
CANCEL_WAIT_SECONDS = 30.0  # for a job cancelled after a signal to stop
PUBLISHED_BEFORE_SIGNAL = "imgrec: a signal came as this run finished; its dataset was published and is complete"
# Runners whose translation loses data imgrec relies on: refused up front.
UNSUPPORTED_RUNNERS = {
    "DaskRunner": "Beam's Dask translation merges tagged outputs (with_outputs) and drops side branches, so "
                  "dead letters and counts would be lost; use the DirectRunner, Prism, Flink, Spark or Dataflow",
}


@dataclasses.dataclass(frozen=True)
class Conversion:
    result: Optional[PipelineResult]
    spec: ConversionSpec
    run_id: str
    engine: str
    elapsed: float = 0.0
    metadata: Optional[DatasetMetadata] = None  # None: dry run, or unchanged
    unchanged_from: Optional[str] = None  # the dataset the inputs and config matched
    dry_run: bool = False


def runner_text(options: beam.options.pipeline_options.PipelineOptions) -> str:
    return options.view_as(StandardOptions).runner or "DirectRunner"  # a flag's text (argv, a config's beam:)


def runner_name(options: beam.options.pipeline_options.PipelineOptions) -> str:
    """The runner's class name: a dotted --runner (`apache_beam.runners.direct.DirectRunner`) is
    the runner it names, with the same checks and the same local converter pool."""
    return runner_text(options).rsplit(".", 1)[-1]


# Beam's local runners, which run the job from this process: nothing to stage for workers.
DIRECT_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner")


def runs_in_one_process(options) -> bool:
    """True when the runner executes every step in the launching process (FnApiRunner in_memory,
    and the LOOPBACK environment of Prism, Flink, Spark, which runs the SDK harness on threads of
    the launching process): then imgrec converts on a pool of processes of its own."""
    name = runner_name(options)
    if name in DIRECT_RUNNERS:
        return options.view_as(DirectOptions).direct_running_mode in (None, "in_memory")
    environment = options.view_as(PortableOptions).environment_type
    return environment == "LOOPBACK" or (name == "PrismRunner" and environment is None)


def convert_processes(options) -> int:
    automatic = (os.cpu_count() or 1) if runs_in_one_process(options) else 0
    return options.view_as(ImgrecOptions).convert_processes or automatic


# The runners that submit to --job_endpoint when it is given (Beam's PortableRunner and its subclasses).
JOB_SERVICE_RUNNERS = ("PortableRunner", "FlinkRunner", "SparkRunner", "PrismRunner")


def check_runner_options(options) -> None:
    """Runner settings Beam would only trip over later, found before anything starts: an unknown
    or unsupported --runner, a job service nobody answers at (Beam waits --job_server_timeout,
    5 minutes, then fails with an empty message), a negative worker count (an IndexError deep in
    the FnApiRunner)."""
    runner, text = runner_name(options), runner_text(options)
    if runner in UNSUPPORTED_RUNNERS:
        raise UsageError(f"--runner={text} is not supported: {UNSUPPORTED_RUNNERS[runner]}")
    error = runner_error(text)
    if error:
        raise UsageError(f"--runner={text}: {error}")
    if (options.view_as(DirectOptions).direct_num_workers or 0) < 0:
        raise UsageError("--direct_num_workers must be 0 (one per core) or more")
    endpoint = options.view_as(PortableOptions).job_endpoint
    host, _, port = (endpoint or "").rpartition(":")
    if host and port.isdigit() and runner in JOB_SERVICE_RUNNERS:
        check_connects("job_endpoint", endpoint, host, int(port), "the job service")
        with grpc.insecure_channel(endpoint) as channel:  # an HTTP port (Flink's web UI) accepts, but Beam waits
            ready = grpc.channel_ready_future(channel)
            try:
                ready.result(timeout=JOB_SERVICE_CONNECT_TIMEOUT)
            except grpc.FutureTimeoutError:
                ready.cancel()
                raise UsageError(f"--job_endpoint={endpoint}: no gRPC service answered in "
                                 f"{JOB_SERVICE_CONNECT_TIMEOUT:.0f} s; is that the job service's port?") from None
    if not endpoint:
        check_cluster_master(options, runner)
    if runner not in DIRECT_RUNNERS:  # Beam's stager packages it for the others
        check_local_files(options)
        check_environment_options(options)
    if runner == "DataflowRunner":
        check_dataflow_options(options)


def check_cluster_master(options, runner: str) -> None:
    """The --flink_master or --spark_master_url that Beam's own job server, started for the run,
    submits to: nobody answering there is a usage error now, where Beam would start the job server
    and fail a minute later with a traceback ending in `java.net.ConnectException: Connection refused`."""
    if runner == "FlinkRunner":
        flag, master = "flink_master", options.view_as(FlinkRunnerOptions).flink_master
    elif runner == "SparkRunner":
        flag, master = "spark_master_url", options.view_as(SparkRunnerOptions).spark_master_url
    else:
        return
    host, _, port = (master or "").split("://", 1)[-1].split("/", 1)[0].rpartition(":")
    if host and port.isdigit():  # not [auto] or local[4]: a cluster Beam starts in the job server
        check_connects(flag, master, host, int(port), "the cluster's master")


def check_connects(flag: str, value: str, host: str, port: int, what: str) -> None:
    try:
        socket.create_connection((host.strip("[]"), port), timeout=JOB_SERVICE_CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise UsageError(f"--{flag}={value}: cannot connect ({exc.strerror or exc}); is {what} running there?"
                         ) from None


def check_environment_options(options) -> None:
    """--environment_type and --environment_config that Beam's own validation refuses (EXTERNAL
    without the worker pool's address; LOOPBACK with one, from configs/flink.yaml, say), which it
    did only once the output was locked, with a traceback."""
    from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
    from apache_beam.portability import common_urns

    portable = options.view_as(PortableOptions)
    environment = portable.environment_type
    if environment and not (environment == "LOOPBACK" or environment.startswith("beam:env:")
                            or (environment.isupper() and hasattr(common_urns.environments, environment))):
        # Beam's validation lets any other name through, and its runner raised "Unknown
        # environment type" with a traceback once the output was locked (`external` too).
        raise UsageError(f"--environment_type={environment}: not an environment type; give EXTERNAL (a worker "
                         "pool), LOOPBACK, DOCKER or PROCESS, in capitals (docs/runners.md)")
    errors = PipelineOptionsValidator(options, None).validate_environment_options(portable)
    if errors:
        raise UsageError(f"--environment_type={portable.environment_type}: "
                         f"{'; '.join(error.strip().rstrip('.') for error in errors)} (--environment_config=HOST:PORT "
                         "is the address of an EXTERNAL worker pool; docs/runners.md)")


def check_local_files(options) -> None:
    """A --setup_file (or --requirements_file, --extra_package, --flink/spark_job_server_jar) that is
    not there, which Beam would refuse only once the output is locked, with a traceback (the
    imagenet config's ./setup.py is relative to the folder the command runs in: imgrec's clone)."""
    setup = options.view_as(SetupOptions)
    setup_file = setup.setup_file
    if setup_file == "":  # `--setup_file=` turns a config's off (the worker image holds imgrec); Beam took ''
        setup.setup_file = None
    elif setup_file and not os.path.isfile(setup_file):
        raise UsageError(f"--setup_file={setup_file}: no such file in {os.getcwd()} (a relative path is relative to "
                         "the folder the command runs in; --config=imagenet names ./setup.py: run it from imgrec's "
                         "clone, or give --setup_file=PATH/setup.py, or --setup_file= with --sdk_container_image)")
    local_files = (("requirements_file", setup.requirements_file),
                   *(("extra_package", package) for package in setup.extra_packages or ()),
                   ("flink_job_server_jar", options.view_as(FlinkRunnerOptions).flink_job_server_jar),
                   ("spark_job_server_jar", options.view_as(SparkRunnerOptions).spark_job_server_jar))
    for flag, path in local_files:
        if path and "://" not in path and not os.path.isfile(path):  # gs:// packages are staged from there
            raise UsageError(f"--{flag}={path}: no such file in {os.getcwd()}")


def check_dataflow_options(options) -> None:
    """No --project or --region, which Beam would refuse only once the output is locked, with a
    traceback (Beam's own validation, which needs no network then)."""
    cloud = options.view_as(GoogleCloudOptions)
    if cloud.project and cloud.region:  # else Beam's checks need no network (no default bucket to look up)
        return
    try:
        from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
        from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner
    except ImportError:  # no gcp extra: Beam says so when it builds the runner
        return
    errors = [error.strip().rstrip(".") for error in PipelineOptionsValidator(options, DataflowRunner()).validate()]
    if errors:
        raise UsageError(f"--runner=DataflowRunner: {'; '.join(errors)} (give --project, --region and "
                         "--temp_location=gs://BUCKET/tmp; docs/runners.md)")


def check_input(spec: ConversionSpec) -> None:
    """A missing input, or one that cannot be reached, listed or entered, is a usage error,
    found before anything starts."""
    kind, path = spec.input.resolved_kind, spec.input.path
    local = local_path(path)
    if kind == "folders" and local is not None:
        reach = "cannot reach the folder"
        for problem, check in ((reach, lambda: os.stat(local)),
                               ("cannot list the folder", lambda: os.scandir(local).close()),
                               ("cannot enter the folder", lambda: os.stat(os.path.join(local, ".")))):
            try:
                check()
            except OSError as exc:
                # ENOTDIR on the way there: a folder on the path is a file (FILE/IN)
                if exc.errno == errno.ENOENT or (exc.errno == errno.ENOTDIR and problem == reach):
                    raise UsageError(f"--input={path}: no such folder") from None
                if exc.errno == errno.ENOTDIR:
                    raise UsageError(f"--input={path}: not a folder (a manifest ends in .csv, .jsonl or .json, "
                                     "or give --input_kind=csv or jsonl)") from None
                raise UsageError(f"--input={path}: {problem}: {exc.strerror or exc}") from None
    if kind == "glob" and local is not None:  # a typo in the folder: nothing matches, exit 1 after a whole run
        root = glob_root(local)
        if root and not os.path.exists(root):
            raise UsageError(f"--input={path}: no such folder {root}" if root != local.rstrip("/")
                             else f"--input={path}: no such file")
    if local is None and kind not in ("csv", "jsonl"):
        reachable("--input", path)  # a folder or glob on an object store need not exist as such
    if local is None and spec.input.kind == "auto":  # auto looks at local disks only (InputSpec.resolved_kind)
        # Converted as class folders or a manifest, an annotated input would make another dataset.
        if kind == "folders" and all(reachable("--input", join(path, name), folder=True)
                                     for name in ("Annotations", "JPEGImages")):
            raise UsageError(f"--input={path} is a Pascal VOC folder, which --input_kind=auto recognises on local "
                             "disks only: pass --input_kind=voc (or --input_kind=folders for class folders)")
        if kind == "jsonl" and path.lower().endswith(".json") and looks_like_coco(path):
            raise UsageError(f"--input={path} is a COCO file, which --input_kind=auto recognises on local disks "
                             "only: pass --input_kind=coco")
    if kind in ("coco", "csv", "jsonl") and not reachable("--input", path):
        raise UsageError(f"--input={path}: no such {'annotation file' if kind == 'coco' else 'manifest'}")
    if kind == "coco":
        try:
            coco_categories.cache_clear()  # the file may have changed since an earlier run in this process
            coco_categories(path, spec.input.class_names)
        except AnnotationFileError as exc:
            raise UsageError(f"--input={path}: {exc}") from None
        root = spec.input.images_root
        local_root = local_path(root) if root is not None else None
        if local_root is not None and not os.path.isdir(local_root):  # a store's prefix need not exist as such
            raise UsageError(f"--images_root={root}: " + ("not a folder" if os.path.exists(local_root)
                                                          else "no such folder"))
    if kind == "voc" and not reachable("--input", join(path, "Annotations"), folder=True):
        raise UsageError(f"--input={path}: no Annotations folder (Pascal VOC: Annotations/*.xml, JPEGImages/)")
    if kind in ("csv", "jsonl"):
        try:
            manifest_layout(spec.input, kind)
        except ManifestError as exc:
            raise UsageError(str(exc)) from None


def reachable(flag: str, path: str, folder: bool = False) -> bool:
    """Whether `path` exists (a `folder`: on an object store, which has no folders, any object
    under it); a filesystem Beam cannot use here (no filesystem for the scheme, or its client
    library not installed: s3:// without apache-beam[aws]) is a usage error."""
    try:
        return files.present(path) if folder else files.exists(path)
    except Exception as exc:  # ValueError for the scheme, BeamIOError around the client's error
        raise UsageError(f"{flag}={path}: {exc}") from None


def _ensure_folder(path: str) -> list[str]:
    """Creates the output folder, and on a local disk its missing parents, if needed; returns the
    folders it created, deepest first, which a run that writes nothing removes again. An
    unwritable place is a usage error."""
    if reachable("--output", path):
        return []
    created = [path]
    local = local_path(path)
    if local is not None:  # as written, not normalized: `r/../q` creates `r`, which abspath drops
        parent = os.path.dirname(local.rstrip(os.sep))
        while parent and not os.path.exists(parent):
            created.append(parent)
            parent = os.path.dirname(parent)
    try:
        FileSystems.mkdirs(path)
    except Exception as exc:  # each filesystem raises its own error types
        raise UsageError(f"cannot create the output folder {path}: {exc}") from None
    return created


def _remove_if_empty(folders: Sequence[str]) -> None:
    """Removes each folder that is empty (a run that wrote nothing there)."""
    for folder in folders:
        local = local_path(folder)
        if local is not None:
            with contextlib.suppress(OSError):  # not empty: another run's output, say
                os.rmdir(local)
        elif files.present(folder) and not list_names(folder):
            files.delete([folder])


# A Java runner's stack frames, and Spark's "Driver stacktrace:" line after them.
_JAVA_STACK = re.compile(r"\s+at \S|\s*\.\.\. \d+ more$|Driver stacktrace:$")


def last_line(exc: BaseException) -> str:
    """The innermost message of an error Beam wrapped (its last line); for a gRPC error (a job
    endpoint that is not a Beam job service, say) its status and details, which its text ends
    after, with a lone `>`."""
    details, code = getattr(exc, "details", None), getattr(exc, "code", None)
    if callable(details) and callable(code):
        return f"{code()}: {details()}"
    # A Java runner's reason (Spark, Flink) is followed by its stack frames, and Spark's by a last
    # "Driver stacktrace:" line: neither says why.
    lines = [line for line in str(exc).strip().splitlines() if line.strip() and not _JAVA_STACK.match(line)]
    return (lines or [""])[-1]


def out_of_space(exc: BaseException) -> bool:
    """A full disk or quota, however many layers (Beam wraps worker errors in RuntimeErrors)
    wrap it."""
    return any(os.strerror(code) in str(exc) for code in (errno.ENOSPC, errno.EDQUOT))


def _cleanup(output: str, this_run: str, keep_run: bool, keep_parts: bool = True) -> None:
    """Nothing of a run that did not publish stays in the output but finished parts (for a
    restart) and, when the error message points at them, its dead letters."""
    if not keep_run and files.present(this_run):
        files.delete([this_run])
    if not keep_parts and files.present(parts_dir(output)):
        files.delete([parts_dir(output)])
    _remove_if_empty([parts_dir(output), staging_dir(output)])


def convert(argv: Sequence[str]) -> Conversion:
    """Builds the pipeline from config + flags, runs it, and publishes what it staged."""
    parsed = parse_arguments(argv)
    options = parsed.options
    filesystems = stores.use_filesystem_options(options)
    runner = runner_name(options)
    check_runner_options(options)
    started = datetime.datetime.now(datetime.timezone.utc)
    template = parsed.spec.output.path
    spec = dataclasses.replace(parsed.spec, output=dataclasses.replace(
        parsed.spec.output, path=expand_output_template(template, started)))
    output = spec.output.path
    run_id = uuid.uuid4().hex
    library_versions = versions()
    interval = options.view_as(ImgrecOptions).progress_interval
    this_run = run_dir(output, run_id)
    source_root = spec.input.root() if spec.input.source_paths == "relative" else ""
    objects = spec.annotations if spec.input.detection else None
    writer = WriterSettings(image=spec.image, keys=spec.features, output=spec.output,
                            max_file_bytes=spec.input.max_file_bytes, run_dir=this_run,
                            parts_dir=parts_dir(output),
                            record_digest=record_digest(spec.image, spec.features, library_versions, source_root,
                                                        objects, spec.input.keep_empty_images),
                            local_processes=convert_processes(options), filesystems=filesystems,
                            source_root=source_root, objects=spec.annotations,
                            voc_fields=spec.input.resolved_kind == "voc", keep_empty=spec.input.keep_empty_images)
    run_info = {"run_id": run_id, "started": started.isoformat(timespec="seconds"), "runner": runner}
    # DataflowRunner --dry_run=True only builds the job: leave the output alone.
    if runner == "DataflowRunner" and options.view_as(TestOptions).dry_run:
        context = RunContext(run_info, output, this_run, writer, library_versions)
        pipeline = beam.Pipeline(options=options)
        _ = pipeline | "ConvertToTFRecords" >> ConvertToTFRecords(spec, context)
        result = pipeline.run()
        return Conversion(result, spec, run_id, runner, dry_run=True)

    for flag, path in (("--input", spec.input.path), ("--output", output), ("--reuse_from", spec.output.reuse_from),
                       ("--compare_to", spec.output.compare_to)):
        if path:
            stores.check_store(flag, path)
    check_input(spec)
    check_retention(template, spec.output.keep_last)
    created = _ensure_folder(output)
    try:
        lock = OutputLock(output, run_id).acquire()
    except (OSError, object_stores.StoreUnavailable) as exc:  # read-only, no permission, no space: before any work
        raise UsageError(f"cannot write into the output folder {output}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    try:
        state = inspect_output(output)
        check_layout(spec.input, output, state)  # first: --overwrite, which check_output suggests, cannot lift it
        check_output(output, spec.output, state)
        clear_dead_runs(output)
        stopped = stopped_runs_beside(template, output)
        # The flags that need the template would make the advised command a usage error.
        dated = [flag for flag, given in (("--compare_to=latest", spec.output.compare_to == LATEST),
                                          ("--reuse_from=latest", spec.output.reuse_from == LATEST),
                                          ("--keep_last", spec.output.keep_last)) if given]
        without = f" (without {', '.join(dated)})" if dated else ""
        for folder in stopped[:3]:
            say(f"imgrec: warning: {folder} holds the staging of a stopped run, and no run of this template "
                f"writes there again; run with --output={folder}{without} to finish it, or delete "
                f"{staging_dir(folder)}")
        if len(stopped) > 3:
            say(f"imgrec: warning: and {len(stopped) - 3} more folders beside it")
        compared = comparison(spec.output, template, state)
        if spec.output.compare_to == LATEST and compared is None:
            say(f"imgrec: --compare_to=latest: no finished dataset in the folders {template} names yet (a first "
                "run, or the template changed); converting everything")
        elif compared and compared.why_not:
            say(f"imgrec: {compared.why_not}; converting again")
        reuse = reuse_source(spec.output, template, pixel_fingerprint(spec, library_versions), output, state)
        if reuse.note:  # a skip may follow: the fingerprint that decides it is the pipeline's
            then = "if anything changed, every image is converted" if compared and compared.fingerprint \
                else "converting every image"
            say(f"imgrec: --reuse_from={spec.output.reuse_from}: {reuse.note}; {then}")
        context = RunContext(
            run_info, output, this_run, writer, library_versions,
            previous_fingerprint=compared.fingerprint if compared else None, reuse=reuse.source,
            output_folder=output_folder(output, state), previous_run_id=state.previous_run_id,
            previous_files=state.owned,
            fail_job_on_refusal=runner == "DataflowRunner", in_one_process=runs_in_one_process(options))
        for folder in (this_run, parts_dir(output)):
            if not files.exists(folder):
                FileSystems.mkdirs(folder)
        _LOG.info("effective config: %s", json.dumps(spec.to_dict(), sort_keys=True))
        say(format_header(spec, runner, parsed.config_file))
        if interval is None:
            interval = 0.0 if runner == "DataflowRunner" else default_interval(sys.stderr)
        reporter = ProgressReporter(this_run, interval)
        with reaped():
            # The converters start (a Python and OpenCV's import each) while Beam builds the job, unless
            # an earlier run in this process left them; they are kept for the next, unless this run fails.
            converters = shared_process_pool(writer.local_processes, writer.converter) \
                if context.in_one_process else None
            close_shared_pools(keep=converters)  # an earlier run's, set up otherwise
            try:
                # DirectRunner: straight to the FnApiRunner, without trying Prism (pipeline/beam_internals.py)
                direct = fn_api_runner(options) if runner == "DirectRunner" else None
                pipeline = beam.Pipeline(runner=direct, options=options)
                _ = pipeline | "ConvertToTFRecords" >> ConvertToTFRecords(spec, context)
                clock = time.monotonic()
                with reporter.running(), interrupts.interruptible():
                    result = _run_to_completion(pipeline, this_run)
            except BaseException:
                close_shared_pools()
                raise
        elapsed = time.monotonic() - clock
        engine = engine_name(runner, options)
        if files.exists(join(this_run, UNCHANGED_MARKER)):
            _cleanup(output, this_run, keep_run=False, keep_parts=False)
            conversion = Conversion(result, spec, run_id, engine, elapsed, unchanged_from=compared.dataset)
        else:
            metadata = read_published(output, run_id)
            reporter.finish(metadata.planned)
            if interrupts.received():  # it came while this process published, which finished first
                say(PUBLISHED_BEFORE_SIGNAL)
            conversion = Conversion(result, spec, run_id, engine, elapsed, metadata)
        _apply_retention(template, spec.output.keep_last, output)
        return conversion
    except BaseException as exc:
        if interrupts.received() is not None:  # Beam may have wrapped the KeyboardInterrupt
            return _after_interrupt(spec, run_id, runner, this_run, started)
        if isinstance(exc, RunFailed):
            _cleanup(output, this_run, keep_run=isinstance(exc, TooManyErrors) or "Dead letters" in str(exc))
            raise
        # Parts kept on a full disk would keep it full, and fail the next run whatever its config.
        full = out_of_space(exc)
        _cleanup(output, this_run, keep_run=False, keep_parts=not full)
        if full:
            raise OutOfSpace(f"{output}'s filesystem is full (or over quota): {last_line(exc)}; removed this "
                             "run's staging and the finished parts kept for a restart") from None
        raise
    finally:
        lock.release()
        _remove_if_empty(created)


def _apply_retention(template: str, keep_last: int, output: str) -> None:
    """--keep_last: the older datasets of a dated output go once this run succeeded."""
    for folder in datasets_to_remove(template, keep_last, output):
        try:
            removed = remove_dataset(folder)
        except (OSError, object_stores.StoreUnavailable) as exc:  # this run's dataset is published all the same
            kept = True  # unless the store can say otherwise
            with contextlib.suppress(OSError, object_stores.StoreUnavailable):
                kept = files.exists(join(folder, METADATA_FILE))
            left = "it is kept for the next run" if kept else \
                "its metadata.json is gone, so no run removes the rest: delete what is left by hand"
            say(f"imgrec: warning: could not remove the dataset in {folder} (--keep_last={keep_last}): "
                f"{object_stores.store_fault(exc) or exc}; {left}")
            continue
        if removed:
            say(f"imgrec: {removed} (--keep_last={keep_last})")
        else:
            say(f"imgrec: warning: {folder} is locked by a run; not removed (--keep_last={keep_last})")


def _after_interrupt(spec: ConversionSpec, run_id: str, runner: str, this_run: str,
                     started: datetime.datetime) -> Conversion:
    """The outcome of a run a signal stopped, read from the output: its dataset (it published
    before the signal took effect: a success), or an `Interrupted` error saying what is there."""
    output = spec.output.path
    if not interrupts.wait_for_publishing():  # a hung filesystem: leave the staging being moved alone
        raise Interrupted(f"interrupted while publishing, which was still under way a minute later; {output} may "
                          "hold no finished dataset until the same command runs again")
    _cleanup(output, this_run, keep_run=False)
    outcome = interrupted_outcome(output, run_id)
    if outcome:
        raise Interrupted(outcome)
    say(PUBLISHED_BEFORE_SIGNAL)
    elapsed = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    return Conversion(None, spec, run_id, runner, elapsed, read_published(output, run_id))


def _check_verdict(this_run: str) -> None:
    """A refusal by the pipeline's last step becomes a RunFailed with the step's reason."""
    verdict = join(this_run, VERDICT_FILE)
    if files.exists(verdict):
        reason = files.read_bytes(verdict).decode("utf-8")
        raise (TooManyErrors if "max_error_fraction" in reason else RunFailed)(reason)


def _run_to_completion(pipeline: beam.Pipeline, this_run: str) -> PipelineResult:
    result = None
    try:
        result = pipeline.run()
        result.wait_until_finish()
    except KeyboardInterrupt:  # a signal (pipeline/interrupts.py)
        if result is not None:
            _cancel(result)
        raise
    except Exception as exc:  # a refusal fails the job on Dataflow: its reason, not Beam's error, is what the run says
        _check_verdict(this_run)
        if isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE:  # a setup fault, not a bug
            raise RunFailed(f"the run failed: the job service stopped answering ({exc.details()}): it crashed or "
                            "was stopped; nothing was published, and the parts finished so far are kept for the next "
                            "run") from None
        raise
    _check_verdict(this_run)
    if result.state != PipelineState.DONE:
        raise RunFailed(f"the pipeline ended in state {result.state}; nothing was published")
    return result


def _cancel(result: PipelineResult) -> None:
    """Stops a job that runs on without this process (on a job server, on Dataflow), as a signal
    promises: its publish would be refused once the lock is released, and its workers would write
    the staging folder back after this process removed it. Waits a while for the job to stop,
    so that none of its workers still moves files while the staging folder is cleared."""
    deadline = time.monotonic() + CANCEL_WAIT_SECONDS
    with contextlib.suppress(Exception):  # best effort: the job service may be gone too
        result.cancel()
        while not PipelineState.is_terminal(result.state) and time.monotonic() < deadline:
            time.sleep(0.5)


def read_published(output: str, run_id: str) -> DatasetMetadata:
    """The metadata.json this run published (another run's would be a bug in the lock)."""
    metadata = DatasetMetadata.loads(files.read_bytes(join(output, METADATA_FILE)))
    if metadata.run.get("run_id") != run_id:
        raise RunFailed(f"{output} holds run {metadata.run.get('run_id')}'s dataset, not this run's")
    return metadata


def run(argv: Optional[Sequence[str]] = None) -> PipelineResult:
    """Runs the conversion to completion (published) and returns Beam's result."""
    return convert(list(sys.argv[1:] if argv is None else argv)).result


VERBOSE_FLAGS = ("-v", "--verbose")


def configure_logging(verbose: bool) -> None:
    """Quiet unless asked: warnings and errors; `-v` adds imgrec's and Beam's INFO (the effective
    config, job submission, worker start-up). The job-submission lines schedulers parse on
    Dataflow (Airflow reads "Created job with id: [...]") are kept either way."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("apache_beam").setLevel(logging.INFO if verbose else logging.ERROR)
    logging.getLogger("apache_beam.runners.dataflow.internal.apiclient").setLevel(logging.INFO)
    # A DoFn's exception reaches `main`, which logs it with its whole chain: Beam's copy repeats it.
    logging.getLogger("apache_beam.runners.common").setLevel(logging.CRITICAL)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`imgrec run`'s exit code; pipeline/cli.py answers --help before Beam is imported."""
    argv = list(sys.argv[1:] if argv is None else argv)
    configure_logging(verbose=any(flag in argv for flag in VERBOSE_FLAGS))
    with interrupts.handled(), imports_frozen():
        return _convert_and_report([arg for arg in argv if arg not in VERBOSE_FLAGS])


def _convert_and_report(argv: Sequence[str]) -> int:
    try:
        conversion = convert(argv)
    except ImgrecError as exc:
        say(f"imgrec: error: {exc}")
        return exc.exit_code
    except Exception as exc:  # a failed pipeline: Beam's own error, with its traceback in the log
        unavailable = object_stores.unavailable(exc)
        if unavailable:  # the store went away or refused: a setup fault, not a bug
            say(f"imgrec: error: the run failed: the object store cannot be used: {unavailable}")
            return 1
        if unfetched_job_server(exc):  # an offline machine: what to give instead, not a traceback
            say(f"imgrec: error: the run failed: {exc} (or give --flink_job_server_jar or --spark_job_server_jar "
                "the path of a job server `make engines` built, or --job_endpoint of a running one: docs/runners.md)")
            return 1
        _LOG.exception("the run failed")
        say(f"imgrec: error: the run failed: {type(exc).__name__}: {last_line(exc)}")
        return 1
    output = conversion.spec.output.path
    if conversion.dry_run:
        say(f"dry run: built the Dataflow job for {output}; nothing was staged, submitted or written", sys.stdout)
    elif conversion.unchanged_from:
        say(f"unchanged: inputs and config match the dataset in {conversion.unchanged_from}; "
            "nothing was converted or written", sys.stdout)
    else:
        say(format_summary(conversion.metadata, output, conversion.elapsed, conversion.engine), sys.stdout)
    return 0
