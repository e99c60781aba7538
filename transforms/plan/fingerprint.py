"""An order-independent fingerprint of a run's inputs and config, for skipping unchanged re-runs.

Each input row hashes to a 256-bit number and the fingerprint is their sum modulo 2**256: a
commutative, associative combine, so it needs no sort and no single worker sees every row.
"""
from __future__ import annotations

import hashlib
import json
from typing import Iterable, Mapping

import apache_beam as beam

from transforms.images.decode import DAMAGE_CHECKS
from transforms.inputs.annotations import annotation_digest
from transforms.plan.split import STRATIFIED_ROUNDING
from transforms.rejections import Rejection
from transforms.specs import ConversionSpec

_MODULUS = 2**256
# Output settings that say where to write and what to do with an existing dataset, not what
# the records hold.
POLICY_FIELDS = ("path", "overwrite", "skip_unchanged", "allow_empty", "compare_to", "reuse_from", "keep_last")
# The libraries whose versions can change an image's stored bytes (pipeline.metadata.versions):
# Pillow reads the header facts a decode follows (orientation, transparency).
PIXEL_LIBRARIES = ("imgrec", "opencv", "numpy", "pillow")


def pixel_library_versions(library_versions: Mapping[str, str]) -> dict[str, str]:
    """The versions that both fingerprints hold: those of the libraries that make the pixels."""
    return {name: library_versions[name] for name in PIXEL_LIBRARIES}


def row_hash(row: bytes) -> int:
    return int.from_bytes(hashlib.sha256(row).digest(), "big")


def config_fingerprint(spec: ConversionSpec, library_versions: Mapping[str, str]) -> str:
    """Everything that shapes the records, the versions of the libraries that make the pixels
    included (a dataset another OpenCV made is not what this run would write); where they are
    written and how is left out."""
    config = spec.to_dict()
    config["versions"] = pixel_library_versions(library_versions)
    for field in POLICY_FIELDS:
        config["output"].pop(field)
    if spec.splits.method == "stratified":  # a dataset cut by an older rounding is not unchanged
        config["splits"]["rounding"] = STRATIFIED_ROUNDING
    config["image"]["damage_checks"] = DAMAGE_CHECKS
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode("utf-8")).hexdigest()


def rows_sum(rows: Iterable[bytes]) -> int:
    return add_hashes(*(row_hash(row) for row in rows))


def seeded_fingerprint(total: int, config: str) -> str:
    """The inputs' fingerprint: the sum of their row hashes, seeded with the config's fingerprint."""
    return hashlib.sha256(f"{config}:{total:064x}".encode("ascii")).hexdigest()


def image_row(path: str, content_hash: str, label: str, annotations: str = "") -> bytes:
    """Rows are bytes: a file name that is not UTF-8 (kept by Python as surrogates) still hashes.
    `annotations`: an annotated image's annotation digest, so changed boxes are a changed input."""
    row = f"image\t{path}\t{content_hash}\t{label}" + (f"\t{annotations}" if annotations else "")
    return row.encode("utf-8", "surrogateescape")


def rejection_row(path: str, error: str, message: str) -> bytes:
    return f"rejected\t{path}\t{error}\t{message}".encode("utf-8", "surrogateescape")


def retry_hash(rejection: Rejection) -> int:
    """What a rejection adds to `recorded_fingerprint`'s sum: non-zero for a file rejected while
    converting for its state then (changed, unreadable: `about_the_file_then`)."""
    if rejection.split is None or not rejection.about_the_file_then:
        return 0
    return row_hash(f"retry\t{rejection.path}".encode("utf-8", "surrogateescape"))


def add_hashes(*hashes: int) -> int:
    """The fingerprints' combine: a sum modulo 2**256, so any order and bundling gives the same."""
    return sum(hashes) % _MODULUS


def recorded_fingerprint(fingerprint: str, retries: int) -> str:
    """The fingerprint a dataset records, given the sum of its rejections' `retry_hash`es. Files
    rejected while converting for their state were hashed as images by the first pass, so the
    inputs' fingerprint counts them as written; a later run may write them, so a dataset that
    left them out records another fingerprint and is never found unchanged."""
    if not retries:
        return fingerprint
    return hashlib.sha256(f"{fingerprint}:retry:{retries:064x}".encode("ascii")).hexdigest()


def with_label_map(fingerprint: str, label_map: dict[str, int]) -> str:
    """The label map decides label ids: an empty class folder added shifts them, though no
    image row changed."""
    labels = json.dumps(sorted(label_map.items(), key=lambda item: item[1]))  # ASCII: any name hashes
    return hashlib.sha256(f"{fingerprint}:{labels}".encode("ascii")).hexdigest()


@beam.ptransform_fn
def InputFingerprint(inputs: tuple[beam.PCollection, beam.PCollection, beam.PCollection], spec: ConversionSpec,
                     library_versions: Mapping[str, str]) -> beam.PCollection:
    """(batches of SourceImage, Rejection, label map) → one hex fingerprint."""
    images, rejections, label_map = inputs
    return ((images | "ImageRows" >> beam.Map(
                lambda batch: rows_sum(image_row(i.path, i.content_hash, i.label,
                                                 annotation_digest(i.annotations)) for i in batch)),
             rejections | "RejectionRows" >> beam.Map(lambda r: row_hash(rejection_row(r.path, r.error, r.message))))
            | "InputRows" >> beam.Flatten()
            | "Combine" >> beam.CombineGlobally(lambda partials: add_hashes(*partials))
            | "WithConfig" >> beam.Map(seeded_fingerprint, config_fingerprint(spec, library_versions))
            | "WithLabelMap" >> beam.Map(with_label_map, beam.pvalue.AsSingleton(label_map)))
