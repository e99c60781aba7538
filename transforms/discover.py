"""Discover (path, label) pairs inside the pipeline: class folders, globs, CSV/JSONL manifests.

Paths are matched and manifests read by Beam sources, so a million inputs never pass through
the driver, and any filesystem Beam knows (local, gs://, s3://) works.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import posixpath

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.filesystems import FileSystems

from transforms.rejections import BadManifestLine, Rejection, SkippedFile
from transforms.specs import InputSpec

REJECTED = "rejected"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """An input file and its label text, before anything is read."""

    path: str
    label: str


def label_from_parent(path: str) -> str:
    """Class-folder convention: `root/<label>/<file>`."""
    return posixpath.basename(posixpath.dirname(path.replace("\\", "/")))


def resolve_path(path: str, manifest: str) -> str:
    """Manifest paths may be absolute, URLs, or relative to the manifest's folder."""
    if "://" in path or path.startswith("/"):
        return path
    return FileSystems.join(posixpath.dirname(manifest), path)


def is_csv_header(line: str) -> bool:
    return [cell.strip().lower() for cell in line.split(",")] == ["path", "label"]


def parse_csv_line(line: str, manifest: str) -> Candidate:
    try:
        row = next(csv.reader([line]))
    except csv.Error as exc:
        raise BadManifestLine(f"unparseable CSV line {line!r}: {exc}") from exc
    if len(row) != 2 or not row[0].strip() or not row[1].strip():
        raise BadManifestLine(f"expected 'path,label', got {line!r}")
    return Candidate(resolve_path(row[0].strip(), manifest), row[1].strip())


def parse_jsonl_line(line: str, manifest: str) -> Candidate:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BadManifestLine(f"invalid JSON {line!r}: {exc}") from exc
    if not isinstance(row, dict) or not row.get("path") or row.get("label") in (None, ""):
        raise BadManifestLine(f"expected {{\"path\": ..., \"label\": ...}}, got {line!r}")
    return Candidate(resolve_path(str(row["path"]), manifest), str(row["label"]))


class ParseManifestLine(beam.DoFn):
    def __init__(self, manifest: str, kind: str):
        self._manifest = manifest
        self._parse = parse_csv_line if kind == "csv" else parse_jsonl_line

    def process(self, line: str):
        line = line.lstrip("\ufeff")  # editors and pandas may save manifests with a UTF-8 BOM
        if not line.strip() or self._parse is parse_csv_line and is_csv_header(line):
            return
        try:
            yield self._parse(line, self._manifest)
        except BadManifestLine as exc:
            yield beam.pvalue.TaggedOutput(REJECTED, Rejection.from_exception(self._manifest, exc))


class _KeepImageFiles(beam.DoFn):
    """Matched files become candidates; files without an image extension are reported, not read."""

    def __init__(self, spec: InputSpec):
        self._extensions = tuple(ext.lower() for ext in spec.extensions)

    def process(self, metadata: FileMetadata):
        path = metadata.path
        if path.lower().endswith(self._extensions):
            yield Candidate(path, label_from_parent(path))
        else:
            reason = SkippedFile(f"extension not in {', '.join(self._extensions)}")
            yield beam.pvalue.TaggedOutput(REJECTED, Rejection.from_exception(path, reason))


class DiscoverImages(beam.PTransform):
    """PBegin → {"candidates": Candidate, "rejected": Rejection}."""

    def __init__(self, spec: InputSpec):
        super().__init__()
        self._spec = spec

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        kind = self._spec.resolved_kind()
        if kind in ("csv", "jsonl"):
            lines = pbegin | "ReadManifest" >> beam.io.ReadFromText(self._spec.path)
            parsed = lines | "ParseManifest" >> beam.ParDo(
                ParseManifestLine(self._spec.path, kind)).with_outputs(REJECTED, main="candidates")
        else:
            pattern = self._spec.path
            if kind == "folders":
                pattern = FileSystems.join(self._spec.path.rstrip("/"), "*", "*")
            files = pbegin | "MatchFiles" >> fileio.MatchFiles(
                pattern, empty_match_treatment=fileio.EmptyMatchTreatment.DISALLOW)
            parsed = files | "KeepImageFiles" >> beam.ParDo(
                _KeepImageFiles(self._spec)).with_outputs(REJECTED, main="candidates")
        return {"candidates": parsed.candidates, REJECTED: parsed[REJECTED]}
