"""Atomic publishing: shards are staged beside the output and moved in only when complete.

A run that dies leaves its files in `<output>.imgrec-staging/` (removed by the next run) and
nothing in the output; `metadata.json` is written last, so its presence marks a finished
dataset. Works on any Beam filesystem.
"""
from __future__ import annotations

import json
import uuid
from typing import Optional

from apache_beam.io.filesystems import FileSystems

from pipeline.metadata import METADATA_FILE

# Everything a published dataset consists of, including what `pipeline.tfds_export` adds: a new
# publish removes all of it, so no file can describe shards that are gone.
DATASET_PATTERNS = ("*-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].tfrecord*", "errors-*.jsonl",
                    "dataset_info.json", "features.json", "*.labels.txt")


class DatasetExists(RuntimeError):
    pass


def _join(directory: str, name: str) -> str:
    return FileSystems.join(directory.rstrip("/"), name)


def staging_root(output: str) -> str:
    """Staging sits beside the output (same filesystem, so publishing is a rename)."""
    trimmed = output.rstrip("/")
    _, scheme_separator, rest = trimmed.partition("://")
    if not (("/" in rest) if scheme_separator else trimmed):
        raise ValueError(f"--output must be a folder below a filesystem or bucket root, got {output!r}")
    return f"{trimmed}.imgrec-staging"


def new_staging_dir(output: str) -> str:
    return _join(staging_root(output), uuid.uuid4().hex)


def is_finished(output: str) -> bool:
    return FileSystems.exists(_join(output, METADATA_FILE))


def prepare_output(output: str, overwrite: bool, skip_unchanged: bool) -> Optional[str]:
    """Refuses to replace a finished dataset unless asked; clears what dead runs left behind.

    Returns the finished dataset's input fingerprint when `skip_unchanged` may keep it.
    """
    previous = None
    if is_finished(output):
        if not (overwrite or skip_unchanged):
            raise DatasetExists(f"{output} already holds a finished dataset ({METADATA_FILE}); "
                                "pass --overwrite to replace it, or --skip_unchanged to re-run only on changes")
        if skip_unchanged:
            previous = read_json(_join(output, METADATA_FILE)).get("fingerprint")
    root = staging_root(output)
    if FileSystems.exists(root):
        FileSystems.delete([root])
    return previous


def _existing_dataset_files(output: str) -> list[str]:
    matches = FileSystems.match([_join(output, p) for p in DATASET_PATTERNS])
    return [m.path for result in matches for m in result.metadata_list]


def write_json(path: str, value: dict) -> None:
    """Writes via a temporary name and a rename, so readers never see half a file."""
    temporary = f"{path}.tmp-{uuid.uuid4().hex}"
    with FileSystems.create(temporary, mime_type="application/json") as handle:
        handle.write(json.dumps(value, indent=2, sort_keys=False).encode("utf-8"))
    FileSystems.rename([temporary], [path])


def read_json(path: str) -> dict:
    with FileSystems.open(path, compression_type="uncompressed") as handle:
        return json.loads(handle.read().decode("utf-8"))


def publish(staged: dict[str, str], output: str, metadata: dict) -> None:
    """Moves staged files (staged path → final name) into `output`, then writes metadata.json.

    An older dataset there is unpublished first (its metadata.json goes first), so a crash
    mid-way never leaves a metadata.json that describes files which are not there.
    """
    metadata_path = _join(output, METADATA_FILE)
    if FileSystems.exists(metadata_path):
        FileSystems.delete([metadata_path])
    if not FileSystems.exists(output):
        FileSystems.mkdirs(output)
    stale = _existing_dataset_files(output)
    if stale:
        FileSystems.delete(stale)
    sources = sorted(staged)
    if sources:
        FileSystems.rename(sources, [_join(output, staged[s]) for s in sources])
    write_json(metadata_path, metadata)
    discard_staging(output)


def discard_staging(output: str) -> None:
    FileSystems.delete([staging_root(output)])
