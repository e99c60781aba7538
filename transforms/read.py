"""Read each input once up front: content hash and header checks, before any split is chosen.

The hash lets splits follow content (identical images share a split) and finds duplicates;
the header check rejects non-images and decompression bombs without decoding a pixel.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from transforms.concurrency import InflightDoFn
from transforms.decode import check_header
from transforms.discover import REJECTED
from transforms.files import content_hash, read_input
from transforms.refs import Candidate, SourceImage
from transforms.rejections import InputRejected, Rejection
from transforms.specs import ImageSpec

READ_THREADS = 4  # reading and hashing release the GIL


def describe_source(candidate: Candidate, data: bytes, spec: ImageSpec) -> SourceImage:
    header = check_header(data, spec)
    return SourceImage(candidate.path, candidate.label, content_hash(data), header.format,
                       header.width, header.height)


def read_and_check(candidate: Candidate, spec: ImageSpec, max_file_bytes: int) -> SourceImage:
    return describe_source(candidate, read_input(candidate.path, max_file_bytes), spec)


class ReadAndCheck(InflightDoFn):
    """Candidate → SourceImage, or a Rejection naming the file and the reason.

    Files are read and hashed on a few threads (both release the GIL), so this first pass keeps
    the cores busy even on a runner that executes every step in one process.
    """

    def __init__(self, spec: ImageSpec, max_file_bytes: int):
        super().__init__(READ_THREADS)
        self._spec, self._max_file_bytes = spec, max_file_bytes
        self._read = Metrics.counter("imgrec", "files_read")

    def work(self, candidate: Candidate) -> SourceImage:
        return read_and_check(candidate, self._spec, self._max_file_bytes)

    def emit(self, candidate: Candidate, result: SourceImage):
        self._read.inc()
        yield result

    def reject(self, candidate: Candidate, exc: InputRejected):
        yield beam.pvalue.TaggedOutput(REJECTED, Rejection.from_exception(candidate.path, exc))
