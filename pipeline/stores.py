"""Object stores from the command line: the filesystem options every imgrec command takes, and
the check that each store a run names can be used before any work starts.

The options are Beam's own (S3Options and AwsOptions for s3://, GoogleCloudOptions for gs://,
AzureOptions, HadoopFileSystemOptions), so they travel with the pipeline options to every Beam
worker (Beam's SDK harness gives them to its FileSystems) on every runner. Where they go besides:

- the driver: `use_filesystem_options` (Beam's FileSystems, and imgrec's own store requests);
- imgrec's converter processes: `WriterSettings.filesystems` → `limits.Converter` (transforms/images/limits.py),
  their initializer; the same value also configures imgrec's own store requests in the Beam
  workers that convert, concatenate and publish.
"""
from __future__ import annotations

from apache_beam.options import pipeline_options
from apache_beam.options.pipeline_options import (
    AzureOptions,
    GoogleCloudOptions,
    HadoopFileSystemOptions,
    PipelineOptions,
    S3Options,
)

from pipeline.errors import UsageError
from transforms import files, object_stores

# Beam 2.78 added AwsOptions (--aws_access_key_id, ...), which S3Options falls back on.
FILESYSTEM_OPTIONS = tuple(cls for cls in (getattr(pipeline_options, "AwsOptions", None), S3Options,
                                           GoogleCloudOptions, AzureOptions, HadoopFileSystemOptions) if cls)


def use_filesystem_options(options: PipelineOptions) -> files.FilesystemOptions:
    """This process opens remote paths with the filesystem options a user set (flags or config);
    returns them as the value that carries them to converter processes."""
    declared = PipelineOptions([])
    names = {name for cls in FILESYSTEM_OPTIONS for name in declared.view_as(cls).get_all_options(current_only=True)}
    values = {name: value for name, value in options.get_all_options(drop_default=True).items() if name in names}
    files.use_filesystem_options(values)
    return files.FilesystemOptions.of(values)


def check_store(flag: str, path: str) -> None:
    """The store of a remote `path` answers, takes the credentials and has the bucket; else a
    usage error naming the flag, before any work."""
    if object_stores.scheme(path) not in ("s3", "gs"):
        return
    fault = object_stores.probe(path)
    if fault:
        raise UsageError(f"{flag}={path}: {fault}")
