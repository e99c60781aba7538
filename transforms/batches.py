"""Image references travel in batches, and group in buckets.

Beam charges every element at every shuffle and stage boundary (30-45 µs each on the
FnApiRunner, more on a cluster): a pipeline that moved a million references one by one through
its planning steps spent seconds per ten thousand images before converting any. In batches of
`BATCH` it pays that cost a few thousand times instead.

A grouping by a fine key (a content hash, a path) is done in `BUCKETS` buckets: each batch is
split by bucket, the runner groups the pieces by bucket, and the per-key grouping happens in
memory inside one bucket. Every item of one key lands in the same bucket, so the result is the
same as a GroupByKey on the key, and a bucket holds 1/BUCKETS of the references.

Functions that Beam calls and that yield tagged outputs (rejections) have no return hint: Beam
would take it for the main output's element type, and check every tagged value against it. For
the same reason an `expand` that takes or returns several PCollections (a tuple, a dict) has no
hint for them: Beam reads it as a PCollection's type, and warns that it ignores it.
"""
from __future__ import annotations

import collections
import zlib
from typing import Callable, Hashable, Iterable, Iterator, TypeVar

import apache_beam as beam

from transforms.refs import Batch

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

BATCH = 256
BUCKETS = 64


def batched(items: Iterable[T], size: int = BATCH) -> Iterator[Batch]:
    """Items in batches of `size` as each fills; a TaggedOutput (a rejection) goes out on its own
    as it comes. A DoFn that yields from this holds one batch, however many items it lists."""
    batch: list[T] = []
    for item in items:
        if isinstance(item, beam.pvalue.TaggedOutput):
            yield item
            continue
        batch.append(item)
        if len(batch) == size:
            yield Batch(batch)
            batch = []
    if batch:
        yield Batch(batch)


def bucket_of(key: str, buckets: int = BUCKETS) -> int:
    """The same bucket in every process (unlike `hash()`)."""
    return zlib.crc32(key.encode("utf-8", "surrogateescape")) % buckets


def split_by(batch: Iterable[T], key: Callable[[T], K]) -> dict[K, Batch]:
    """A batch's items by key, keys in sorted order (so what follows is deterministic)."""
    grouped: dict[K, list[T]] = collections.defaultdict(list)
    for item in batch:
        grouped[key(item)].append(item)
    return {k: Batch(grouped[k]) for k in sorted(grouped)}


def flatten(parts: Iterable[Iterable[T]]) -> list[T]:
    return [item for part in parts for item in part]


@beam.ptransform_fn
def GroupInBuckets(batches: beam.PCollection, key: Callable[[T], str], buckets: int = BUCKETS) -> beam.PCollection:
    """Batches of items → (bucket, [every item of the bucket]), grouped by `key`'s bucket."""
    return (batches
            | "SplitByBucket" >> beam.FlatMap(
                lambda batch: split_by(batch, lambda item: bucket_of(key(item), buckets)).items())
            | "GroupBuckets" >> beam.GroupByKey()
            | "JoinPieces" >> beam.MapTuple(lambda bucket, pieces: (bucket, Batch(flatten(pieces)))))
