"""Incremental runs: find each planned image's record in a previous dataset by content hash.

The previous dataset's record index (`index/*.idx`, one small line per record) is joined with
the planned images on the content hash; only these small rows cross the shuffle, never the
records. The shard writer then copies a matched image's bytes from the previous shard (read at
its offset, checksums verified) instead of decoding the file again.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from transforms.dataset_format import IndexEntry, RecordLocation
from transforms.refs import PlannedImage


@dataclasses.dataclass(frozen=True)
class ReuseSource:
    """A previous finished dataset whose image bytes this run may take."""

    dataset: str
    shards: tuple[tuple[str, str], ...]  # (shard path, index path)


def read_index(shard: str, index: str) -> Iterator[tuple[str, RecordLocation]]:
    with FileSystems.open(index, compression_type="uncompressed") as handle:
        for line in handle.read().decode("ascii").splitlines():
            entry = IndexEntry.from_line(line)
            yield entry.sha256, RecordLocation(shard, entry)


def attach(element: tuple[str, dict[str, Iterable]]) -> Iterator[PlannedImage]:
    """Every planned image of one content hash, with the first record of that content (if any)."""
    _, grouped = element
    locations = sorted(grouped["records"], key=lambda loc: (loc.shard, loc.entry.offset))
    reuse = locations[0] if locations else None
    for image in grouped["images"]:
        yield dataclasses.replace(image, reuse=reuse)


class AttachReusableRecords(beam.PTransform):
    """PlannedImage → PlannedImage with `reuse` set where the previous dataset has its content."""

    def __init__(self, source: ReuseSource):
        super().__init__()
        self._source = source

    def expand(self, planned: beam.PCollection) -> beam.PCollection:
        records = (planned.pipeline
                   | "IndexFiles" >> beam.Create(list(self._source.shards))
                   | "SpreadIndexFiles" >> beam.Reshuffle()
                   | "ReadIndex" >> beam.FlatMapTuple(read_index))
        images = planned | "KeyByContent" >> beam.Map(lambda im: (im.source.content_hash, im))
        return ({"images": images, "records": records}
                | "JoinOnContent" >> beam.CoGroupByKey()
                | "Attach" >> beam.FlatMap(attach))
