"""Read each input once up front: content hash and header checks, before any split is chosen.

The hash lets splits follow content (identical images share a split) and finds duplicates;
the header check rejects non-images and decompression bombs without decoding a pixel.
"""
from __future__ import annotations

import dataclasses
import hashlib

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from transforms.decode import check_header
from transforms.discover import REJECTED, Candidate
from transforms.rejections import EmptyFile, InputRejected, Rejection, UnreadableFile
from transforms.specs import ImageSpec


@dataclasses.dataclass(frozen=True)
class SourceImage:
    """A readable image file: where it is, its label text, what it holds."""

    path: str
    label: str
    content_hash: str
    format: str
    width: int
    height: int


def read_file(path: str) -> bytes:
    """All bytes of `path` through Beam's FileSystems (local, gs://, s3://, ...)."""
    try:
        with FileSystems.open(path, compression_type="uncompressed") as handle:
            data = handle.read()
    except Exception as exc:  # each filesystem raises its own error types
        raise UnreadableFile(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    if not data:
        raise EmptyFile(f"{path} is empty (0 bytes)")
    return data


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def describe_source(candidate: Candidate, data: bytes, spec: ImageSpec) -> SourceImage:
    header = check_header(data, spec)
    return SourceImage(candidate.path, candidate.label, content_hash(data), header.format,
                       header.width, header.height)


class ReadAndCheck(beam.DoFn):
    """Candidate → SourceImage, or a Rejection naming the file and the reason."""

    def __init__(self, spec: ImageSpec):
        self._spec = spec
        self._bytes_read = Metrics.counter("imgrec", "bytes_read")

    def process(self, candidate: Candidate):
        try:
            data = read_file(candidate.path)
            self._bytes_read.inc(len(data))
            yield describe_source(candidate, data, self._spec)
        except InputRejected as exc:
            yield beam.pvalue.TaggedOutput(REJECTED, Rejection.from_exception(candidate.path, exc))
