"""One input file → a SourceImage: read (bounded), hashed, header-checked, before any split is
chosen.

The hash lets splits follow content (identical images share a split) and finds duplicates; the
header check rejects non-images and decompression bombs without decoding a pixel; what the header
says travels with the image to its conversion. Beam-free: it runs in the converter processes
(transforms/write/process_pool.py) too.
"""
from __future__ import annotations

from transforms.files import content_hash, read_input
from transforms.images.image_header import check_header
from transforms.refs import Batch, Candidate, SourceImage
from transforms.rejections import InputRejected, Rejection
from transforms.specs import ImageSpec


def describe_source(candidate: Candidate, data: bytes, spec: ImageSpec) -> SourceImage:
    return SourceImage(candidate.path, candidate.label, content_hash(data), check_header(data, spec),
                       candidate.annotations)


def read_batch(batch: Batch, spec: ImageSpec, max_file_bytes: int) -> tuple[Batch, tuple[Rejection, ...]]:
    images, rejections = [], []
    for candidate in batch:
        try:
            images.append(describe_source(candidate, read_input(candidate.path, max_file_bytes), spec))
        except InputRejected as exc:
            rejections.append(Rejection.from_exception(candidate.path, exc))
    return Batch(images), tuple(rejections)
