"""Incremental runs: find each planned image's record in a previous dataset by content hash.

The previous dataset's record index (`index/*.idx`, one small line per record) is joined with
the planned images on the content hash, in buckets (transforms/batches.py); only these small
rows cross the shuffle, never the records. The shard writer then copies a matched image's bytes
from the previous shard (read at its offset, checksums verified, and only if the record holds
that content hash) instead of decoding the file again, and keeps them only if the previous
dataset's metadata.json still names the run that published it once the part is written.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator

import apache_beam as beam

from transforms import files
from transforms.batches import batched, bucket_of, flatten, split_by
from transforms.dataset_format import RecordLocation, parse_index
from transforms.refs import Batch


@dataclasses.dataclass(frozen=True)
class ReuseSource:
    """A previous finished dataset whose image bytes this run may take."""

    dataset: str
    run_id: str  # the run that published it: its records are taken only while it still does
    shards: tuple[tuple[str, str], ...]  # (shard path, index path)
    image_key: str  # its records' image feature


def read_index(shard: str, index: str, image_key: str, run_id: str) -> Iterator[tuple[int, tuple[RecordLocation, ...]]]:
    """One shard's index → (bucket of the content hash, the records of that bucket). An index
    that is gone (the dataset was removed or replaced meanwhile) or damaged offers nothing:
    its images are converted, which is always right."""
    try:
        with files.open_regular(index) as handle:
            entries = parse_index(handle.read().decode("ascii"))
    except (OSError, ValueError):  # FormatError and UnicodeDecodeError are ValueErrors
        return
    locations = [RecordLocation(shard, entry, image_key, run_id) for entry in entries]
    yield from split_by(locations, lambda loc: bucket_of(loc.entry.sha256)).items()


def attach(element: tuple[int, dict[str, Iterable]]) -> Iterator[Batch]:
    """One bucket's planned images, each with the first record of its content (if any)."""
    _, grouped = element
    first: dict[str, RecordLocation] = {}
    for location in sorted(flatten(grouped["records"]), key=lambda loc: (loc.shard, loc.entry.offset)):
        first.setdefault(location.entry.sha256, location)
    images = flatten(grouped["images"])
    yield from batched(dataclasses.replace(image, reuse=first.get(image.source.content_hash)) for image in images)


@beam.ptransform_fn
def AttachReusableRecords(planned: beam.PCollection, source: ReuseSource) -> beam.PCollection:
    """Batches of PlannedImage → the same, with `reuse` set where the previous dataset has the
    content."""
    records = (planned.pipeline
               | "IndexFiles" >> beam.Create([(*pair, source.image_key, source.run_id) for pair in source.shards])
               | "SpreadIndexFiles" >> beam.Reshuffle()
               | "ReadIndex" >> beam.FlatMapTuple(read_index))
    images = planned | "BucketImages" >> beam.FlatMap(
        lambda batch: split_by(batch, lambda im: bucket_of(im.source.content_hash)).items())
    return ({"images": images, "records": records}
            | "JoinOnContent" >> beam.CoGroupByKey()
            | "Attach" >> beam.FlatMap(attach))
