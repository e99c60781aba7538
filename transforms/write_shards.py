"""Group planned images into shards and write each shard's TFRecord file in one pass.

Shards are formed by grouping the small `PlannedImage` references, and each shard's images are
read, converted and written by the same DoFn call. Pixels therefore never cross a shuffle: a
`GroupByKey` over encoded images (what `WriteToTFRecord(num_shards=N)` does) makes the
DirectRunner hold the whole dataset in memory, and sharding by bundle (`num_shards=0`) gives
neither a chosen shard count nor a reproducible order. Files are named as `WriteToTFRecord`
names them, framed as TFRecords with Beam's masked CRC32C.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import struct
import uuid
from typing import Callable, Iterable, Iterator, Optional, TypeVar, Union

import apache_beam as beam
import cv2
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordUtil
from apache_beam.metrics import Metrics

from transforms.assign import PlannedImage
from transforms.discover import REJECTED
from transforms.example import RecordFields
from transforms.process import image_to_record
from transforms.read import content_hash, read_file
from transforms.rejections import FileChanged, InputRejected, Rejection
from transforms.specs import FeatureKeys, ImageSpec, OutputSpec
from transforms.split import num_shards_for, order_in_shard, shard_for

ShardKey = tuple[str, int, int]  # (split, shard index, shard count)


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """What one written shard holds, for metadata.json."""

    split: str
    index: int
    num_shards: int
    path: str
    num_examples: int
    num_bytes: int
    label_counts: tuple[tuple[str, int], ...]


def shard_file_name(split: str, index: int, num_shards: int, suffix: str) -> str:
    """`train-00000-of-00004.tfrecord`, the names `WriteToTFRecord` gives."""
    return f"{split}-{index:05d}-of-{num_shards:05d}{suffix}"


def create_tfrecord_file(path: str, compression: str):
    compression_type = CompressionTypes.GZIP if compression == "gzip" else CompressionTypes.UNCOMPRESSED
    return FileSystems.create(path, mime_type="application/octet-stream", compression_type=compression_type)


def write_tfrecord(handle, record: bytes) -> None:
    """Frames one record (length, masked CRC32C of length, data, masked CRC32C of data).

    The same bytes as `_TFRecordUtil.write_record`, whose checksums it uses, but written as three
    pieces instead of joined first: that join copied every (600 KB raw) record once more.
    """
    length = struct.pack("<Q", len(record))
    handle.write(length + struct.pack("<I", _TFRecordUtil._masked_crc32c(length)))
    handle.write(record)
    handle.write(struct.pack("<I", _TFRecordUtil._masked_crc32c(record)))


def key_by_shard(image: PlannedImage, shard_counts: dict[str, int], seed: int) -> tuple[ShardKey, PlannedImage]:
    num_shards = shard_counts[image.split]
    return (image.split, shard_for(image.source.path, seed, num_shards), num_shards), image


def convert_planned_image(image: PlannedImage, label_text: str, spec: ImageSpec, keys: FeatureKeys) -> bytes:
    """Reads the file again and converts it; the hash check catches files rewritten meanwhile."""
    data = read_file(image.source.path)
    if content_hash(data) != image.source.content_hash:
        raise FileChanged(f"{image.source.path} changed while the pipeline ran (sha256 differs)")
    fields = RecordFields(image.label_id, label_text, image.source.path, image.source.content_hash)
    return image_to_record(data, fields, spec, keys)


# Threads converting one shard's images. Decoding, resizing, hashing, float conversion and file
# I/O release the GIL (~90% of the per-image time), so a shard keeps every core busy even when it
# is the only work left: with few shards per split (the seed config has one) the runner gives one
# worker most of the images, and every stage ends waiting for its slowest worker.
CONVERT_THREADS = max(1, min(4, os.cpu_count() or 1))

T = TypeVar("T")
R = TypeVar("R")


def converted_in_order(pool: concurrent.futures.Executor, convert: Callable[[T], R], items: Iterable[T],
                       window: int) -> Iterator[tuple[T, R]]:
    """(item, convert(item)) in the order of `items`, computed on `pool` with at most `window`
    items in flight, so memory stays bounded by a few records whatever the shard size."""
    pending: collections.deque = collections.deque()
    for item in items:
        pending.append((item, pool.submit(convert, item)))
        if len(pending) >= window:
            done, future = pending.popleft()
            yield done, future.result()
    while pending:
        done, future = pending.popleft()
        yield done, future.result()


class _WriteShardFn(beam.DoFn):
    def __init__(self, image: ImageSpec, keys: FeatureKeys, output: OutputSpec, staging_dir: str):
        self._image, self._keys, self._output, self._staging_dir = image, keys, output, staging_dir
        self._written = Metrics.counter("imgrec", "records_written")
        self._bytes = Metrics.counter("imgrec", "record_bytes_written")

    def setup(self) -> None:
        # Images are converted on this DoFn's own threads (see `converted_in_order`), so
        # OpenCV's thread pool (resize, colour conversion) would only oversubscribe the cores:
        # it costs ~10% more CPU per image. One OpenCV thread gives the same pixels.
        cv2.setNumThreads(1)
        self._pool = concurrent.futures.ThreadPoolExecutor(CONVERT_THREADS, thread_name_prefix="imgrec-convert")

    def teardown(self) -> None:
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _convert(self, image: PlannedImage) -> tuple[Optional[bytes], Optional[Exception]]:
        try:
            return convert_planned_image(image, image.source.label, self._image, self._keys), None
        except Exception as exc:  # reported in order by process()
            return None, exc

    def process(self, element: tuple[ShardKey, Iterable[PlannedImage]]) -> Iterator[Union[ShardResult, beam.pvalue.TaggedOutput]]:
        (split, index, num_shards), images = element
        seed = self._output.shuffle_seed
        ordered = sorted(images, key=lambda im: (order_in_shard(im.source.path, seed), im.source.path))
        name = shard_file_name(split, index, num_shards, self._output.suffix)
        final_path = FileSystems.join(self._staging_dir, name)
        # A retried or speculative attempt writes its own file; the last rename wins, and all
        # attempts write identical bytes.
        attempt_path = f"{final_path}.attempt-{uuid.uuid4().hex}"
        label_counts: collections.Counter[str] = collections.Counter()
        num_bytes = 0
        handle = create_tfrecord_file(attempt_path, self._output.compression)
        try:
            for image, (record, exc) in converted_in_order(self._pool, self._convert, ordered, 2 * CONVERT_THREADS):
                if exc is not None:  # any per-image failure becomes a dead letter, not a lost job
                    if not isinstance(exc, InputRejected):
                        exc = InputRejected(f"{type(exc).__name__}: {exc}")
                    yield beam.pvalue.TaggedOutput(REJECTED, Rejection.from_exception(image.source.path, exc, split))
                    continue
                write_tfrecord(handle, record)
                label_counts[image.source.label] += 1
                num_bytes += len(record)
        finally:
            handle.close()
        FileSystems.rename([attempt_path], [final_path])
        self._written.inc(sum(label_counts.values()))
        self._bytes.inc(num_bytes)
        yield ShardResult(split, index, num_shards, final_path, sum(label_counts.values()), num_bytes,
                          tuple(sorted(label_counts.items())))


class WriteShards(beam.PTransform):
    """PlannedImage → {"shards": ShardResult, "rejected": Rejection, "planned_counts": {split: n}}."""

    def __init__(self, image: ImageSpec, keys: FeatureKeys, output: OutputSpec, staging_dir: str):
        super().__init__()
        self._image, self._keys, self._output, self._staging_dir = image, keys, output, staging_dir

    def expand(self, planned: beam.PCollection) -> dict[str, beam.PCollection]:
        image, output = self._image, self._output
        planned_counts = (planned
                          | "SplitOf" >> beam.Map(lambda im: im.split)
                          | "CountPerSplit" >> beam.combiners.Count.PerElement()
                          | "PlannedCounts" >> beam.combiners.ToDict())
        shard_counts = planned_counts | "ShardCounts" >> beam.Map(
            lambda counts: {split: num_shards_for(n, image, output) for split, n in counts.items()})
        written = (planned
                   | "KeyByShard" >> beam.Map(key_by_shard, beam.pvalue.AsSingleton(shard_counts),
                                              output.shuffle_seed)
                   | "GroupShards" >> beam.GroupByKey()
                   | "WriteShardFiles" >> beam.ParDo(_WriteShardFn(
                       image, self._keys, output, self._staging_dir)).with_outputs(REJECTED, main="shards"))
        return {"shards": written.shards, REJECTED: written[REJECTED], "planned_counts": planned_counts}
