"""Parts and shards without Beam: what a part holds, converting one, concatenating a shard.

A part is a fixed number of consecutive records of one shard. Converting it writes its records
to a part file named by a digest of the settings and images it holds, then an outcome file
(counts, rejections, record index) last, so a part with an outcome is complete and a restarted
run takes it as it is (once it checks out: `finished_outcome`); a part cut short is converted
again.
Concatenating a shard's parts in order gives the same bytes as writing the shard in one pass,
because TFRecord framing is per record.

This module imports no Beam: it runs in the converter processes (transforms/write/process_pool.py).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import signal
import socket
import uuid
from typing import Iterable, Optional

import cv2

from transforms import files
from transforms.dataset_format import METADATA_FILE, IndexEntry, index_file_name, join, run_id_of, shard_file_name
from transforms.images import limits
from transforms.images.decode import decoded_size
from transforms.images.geometry import GeometryError
from transforms.images.process import image_to_record
from transforms.images.process_detection import detection_to_record
from transforms.inputs.annotations import annotation_digest, emptied_image
from transforms.inputs.labels import label_list
from transforms.plan.split import order_in_shard
from transforms.refs import PlannedImage
from transforms.rejections import CorruptImage, FileChanged, InputRejected, Rejection
from transforms.specs import AnnotationSpec, FeatureKeys, ImageSpec, OutputSpec
from transforms.write import tfrecord
from transforms.write.example import EncodedRecord, RecordFields, build_example, locates_image
from transforms.write.process_pool import SubprocessPool, WorkerDied

ShardKey = tuple[str, int, int]  # (split, shard index, shard count)
PART_IMAGES = 256  # images per part: the unit of parallel work, of progress and of resumption


@dataclasses.dataclass(frozen=True)
class WriterSettings:
    """What every part and shard writer needs; `record_digest` covers everything (besides the
    images themselves) that decides a record's bytes."""

    image: ImageSpec
    keys: FeatureKeys
    output: OutputSpec
    max_file_bytes: int
    run_dir: str  # shards, index and their staging names
    parts_dir: str  # content-addressed parts, kept across restarts
    record_digest: str
    part_images: int = PART_IMAGES
    local_processes: int = 0  # > 0: convert parts on a pool of this many processes
    filesystems: files.FilesystemOptions = files.FilesystemOptions()  # the run's, for converter processes
    source_root: str = ""  # records name their image below this folder; "": by its path as found
    objects: AnnotationSpec = AnnotationSpec()  # COCO and VOC images: masks, min_visible
    voc_fields: bool = False  # VOC's difficult and truncated flags in the records
    keep_empty: bool = True  # COCO/VOC: write an image whose objects conversion dropped them all

    @property
    def converter(self) -> limits.Converter:
        """What every converter process of this run is set up with: its limits and the run's
        filesystem options (one value, so all steps find one pool)."""
        return limits.Converter.for_spec(self.image, self.filesystems)


@dataclasses.dataclass(frozen=True)
class PartTask:
    """Consecutive records `index * part_images ...` of one shard."""

    shard: ShardKey
    index: int
    images: tuple[PlannedImage, ...]
    digest: str


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    shard: ShardKey
    num_parts: int


@dataclasses.dataclass(frozen=True)
class PartOutcome:
    """A converted part, as stored beside its records (so a restarted run can take it as is)."""

    digest: str
    records: int
    num_bytes: int
    label_counts: tuple[tuple[str, int], ...]
    rejections: tuple[Rejection, ...]
    index: tuple[IndexEntry, ...]
    reused: int
    converted_by: str  # host:pid of the process that converted it
    written_in: str = ""  # the run_dir of the run that converted it ("": a part from before this was stored)
    resumed: int = 0  # records of a part an earlier run finished, taken as they are (not stored)

    def to_json(self) -> str:
        value = {field.name: getattr(self, field.name) for field in dataclasses.fields(self) if field.name != "resumed"}
        return json.dumps({**value, "rejections": [dataclasses.asdict(r) for r in self.rejections],
                           "index": [entry.to_line() for entry in self.index]})

    @classmethod
    def from_json(cls, text: str) -> "PartOutcome":
        value = json.loads(text)
        return cls(**{**value, "label_counts": tuple(map(tuple, value["label_counts"])),
                      "rejections": tuple(Rejection(**r) for r in value["rejections"]),
                      "index": tuple(map(IndexEntry.from_line, value["index"]))})


@dataclasses.dataclass(frozen=True)
class PartResult:
    shard: ShardKey
    index: int
    digest: str
    images: int
    records: int
    num_bytes: int
    label_counts: tuple[tuple[str, int], ...]
    reused: int
    converted_by: str
    resumed: int


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """What one written shard holds, for metadata.json."""

    split: str
    index: int
    num_shards: int
    file: str  # name in the output folder
    num_examples: int
    num_bytes: int
    label_counts: tuple[tuple[str, int], ...]
    reused: int = 0
    converters: tuple[str, ...] = ()  # the processes that converted its parts (host:pid)
    resumed: int = 0  # records of parts an earlier run finished


def record_digest(image: ImageSpec, keys: FeatureKeys, versions: dict[str, str], source_root: str = "",
                  objects: Optional[AnnotationSpec] = None, keep_empty: bool = True) -> str:
    """Everything besides the image and its fields that decides a record's bytes, or whether it
    is written (`objects`: what detection records hold beyond boxes; `keep_empty`: whether an
    image whose objects a crop cut off is)."""
    settings = {"image": dataclasses.asdict(image), "keys": dataclasses.asdict(keys), "versions": versions,
                "source_root": source_root,
                **({"objects": dataclasses.asdict(objects), "keep_empty": keep_empty} if objects else {})}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8")).hexdigest()


def part_file(settings: WriterSettings, digest: str, kind: str) -> str:
    """A finished part's records ("records") or outcome ("json"), named by its digest."""
    return join(settings.parts_dir, f"{digest}.{kind}")


def part_digest(images: Iterable[PlannedImage], record_settings: str) -> str:
    digest = hashlib.sha256(record_settings.encode("ascii"))
    for image in images:
        digest.update(f"{image.source.path}\t{image.source.content_hash}\t{image.label_id}\t"
                      f"{image.source.label}{annotation_digest(image.source.annotations)}\n"
                      .encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def shard_order(images: Iterable[PlannedImage], seed: int, source_root: str = "") -> list[PlannedImage]:
    """The records' order in their shard: a seeded hash of the path below the input root, the
    same on every runner and wherever the input lies."""
    def key(image: PlannedImage) -> tuple[int, str]:
        name = files.below(image.source.path, source_root)
        return order_in_shard(name, seed), name

    return sorted(images, key=key)


def part_size(shard: ShardKey, images: int, total: int, settings: WriterSettings) -> int:
    """Images per part of a shard of `images` (of `total` images in all).

    On one machine (a local pool of `local_processes`), a shard of a split with several shards
    (so gigabytes of records: the shard count comes from the bytes) that holds at most a share of
    1 / (2 × processes) of all images is written as one part: the shard is then the part file
    itself, hard-linked, not copied, and every process still gets at least two such units of
    work. Other shards are cut into at least 8 parts per process, so a few heavy images
    (12-megapixel photos) still spread over every process, and at most `part_images`: copying
    a split of one shard costs less than an idle core. Elsewhere (a cluster) parts of
    `part_images`."""
    _, _, num_shards = shard
    processes = settings.local_processes
    if not processes:
        return settings.part_images
    if num_shards > 1 and images * 2 * processes <= total:
        return max(images, 1)
    return max(1, min(settings.part_images, -(-total // (8 * processes))))


def cut_into_parts(shard: ShardKey, images: list[PlannedImage], settings: WriterSettings,
                   total: int = 0) -> list[PartTask]:
    size = part_size(shard, len(images), total or len(images), settings)
    chunks = [tuple(images[start:start + size]) for start in range(0, len(images), size)]
    return [PartTask(shard, i, chunk, part_digest(chunk, settings.record_digest)) for i, chunk in enumerate(chunks)]


def shard_keys(shard_counts: dict[str, int]) -> list[ShardKey]:
    """Every shard of every split that has images, so shards no image hashed to exist too."""
    return [(split, index, num_shards) for split, num_shards in sorted(shard_counts.items())
            for index in range(num_shards)]


def reused_pixels(image: PlannedImage) -> Optional[bytes]:
    """The image bytes of the same content in a previous dataset, checked to be that content's;
    None if they cannot be read or are not (a damaged previous dataset must not damage this one:
    converting again is always right)."""
    location, entry = image.reuse, image.reuse.entry
    try:
        with files.open_read(location.shard) as handle:
            data = tfrecord.read_record_at(handle, entry.offset, entry.length)
    except (OSError, tfrecord.CorruptRecord):
        return None
    if entry.sha256 != image.source.content_hash or not locates_image(
            data, entry.image_offset, entry.image_length, entry.sha256, location.image_key):
        return None
    return data[entry.image_offset:entry.image_offset + entry.image_length]


def still_published(dataset: str, run_id: str) -> bool:
    """Whether a dataset records were copied from still holds what run `run_id` published.
    A run replacing it deletes its metadata.json before it touches a shard and writes its own
    last, so records read before this returns True are that run's (a dataset made with other
    settings can have records at the very same offsets, holding the same content hashes)."""
    try:
        return run_id_of(json.loads(files.read_bytes(join(dataset, METADATA_FILE)))) == run_id
    except (OSError, ValueError):  # gone, or being rewritten
        return False


@dataclasses.dataclass(frozen=True)
class Converted:
    """One image's record; `labels`: the class of each thing it counts (the image's label, or
    each object's class); `dropped`: the rows of objects left out of it, and the image's own row
    when it is not written (`record` None: a crop left it no objects, --no_keep_empty_images)."""

    record: Optional[EncodedRecord]
    reused: bool
    labels: tuple[str, ...]
    dropped: tuple[Rejection, ...] = ()


def record_of(image: PlannedImage, data: bytes, fields: RecordFields, settings: WriterSettings,
              reused: bool) -> Converted:
    """The record of the image file's `data`, or (`reused`) rebuilt around a previous dataset's
    image bytes of the same content; an annotated image's objects are placed afresh either way,
    so changed annotations are honoured; imgrec's own features are added to an annotated
    image's. `labels`: its label, or each of a multi-label image's, or each object's class."""
    source, keys = image.source, settings.keys
    if source.annotations is not None:
        own = ((keys.source_path, fields.source_path.encode("utf-8", "surrogateescape")),
               (keys.content_hash, source.content_hash.encode("ascii")))
        record, objects, dropped = detection_to_record(data, source.header, source.annotations, settings.image,
                                                       settings.objects, settings.voc_fields,
                                                       {key: value for key, value in own if key}, reused)
        skipped = emptied_image(source.annotations, len(objects), dropped, settings.keep_empty)
        if skipped is not None:
            return Converted(None, reused, (), (*dropped, skipped))
        return Converted(record, reused, tuple(obj.text for obj in objects), dropped)
    if reused:
        record = build_example(data, fields, settings.image, keys, size=decoded_size(source.header, settings.image))
    else:
        record = image_to_record(data, source.header, fields, settings.image, keys)
    labels = label_list(source.label) if isinstance(image.label_id, tuple) else (source.label,)
    return Converted(record, reused, labels)


def convert_image(image: PlannedImage, settings: WriterSettings) -> Converted:
    """One planned image's record: its previous bytes if it has some, else a fresh conversion of
    the file, which must still hash to what was planned."""
    source = image.source
    fields = RecordFields(image.label_id, source.label, files.below(source.path, settings.source_root),
                          source.content_hash)
    pixels = reused_pixels(image) if image.reuse is not None else None
    if pixels is not None:
        try:
            return record_of(image, pixels, fields, settings, True)
        except GeometryError:  # converting the file again is always right
            pass
    data = files.read_input(source.path, settings.max_file_bytes)
    if files.content_hash(data) != source.content_hash:
        raise FileChanged(f"{source.path} changed while the pipeline ran (sha256 differs)")
    try:
        return record_of(image, data, fields, settings, False)
    except cv2.error as exc:  # what OpenCV raises on data it cannot handle
        raise CorruptImage(f"OpenCV failed on {source.path}: {exc}") from None


def convert_part(task: PartTask, settings: WriterSettings, refused: Optional[dict[int, str]] = None) -> PartOutcome:
    """Writes the part's records (or finds them finished by an earlier run); returns its outcome.
    `refused`: the images (by position) that ended an earlier attempt's converter process, and
    why; they are rejected without being converted again.

    Runs in a converter process (`convert_part_on`), each image within its limits
    (transforms/images/limits.py). The records go to a temporary name, renamed once complete, and the
    outcome is written last, so a part whose outcome exists is complete: it is taken as it is
    if it checks out (`finished_outcome`) and rejected no file for its state then (unreadable,
    changed). A part cut short (kill -9, a stopped run) is converted again in full. Records
    copied from a previous dataset are kept only if it was not replaced meanwhile
    (`still_published`), else the part is written again without copying.
    """
    split = task.shard[0]
    found = finished_outcome(task, settings)
    if found is not None and not any(r.about_the_file_then for r in found.rejections):
        # Records do not hold their split, so the part is the same under renamed splits.
        rejections = tuple(dataclasses.replace(r, split=split) for r in found.rejections)
        # This run's own part (a task run again, as Spark does for a lost worker's) is not resumed.
        resumed = 0 if found.written_in == settings.run_dir else found.records
        return dataclasses.replace(found, rejections=rejections, resumed=resumed)
    records_path = part_file(settings, task.digest, "records")
    temporary = f"{records_path}.tmp-{uuid.uuid4().hex}"  # a killed attempt's: removed with the staging
    label_counts: collections.Counter[str] = collections.Counter()
    rejections, index = [], []
    offset = reused = 0  # offset: the bytes written so far
    copied_from: set[tuple[str, str]] = set()  # (dataset, the run that published it) of each copied record
    with files.create(temporary) as handle:
        for position, image in enumerate(task.images):
            if refused and position in refused:
                rejections.append(Rejection.from_exception(image.source.path, CorruptImage(refused[position]), split))
                continue
            try:
                with limits.image_time(position, image.source.header.width * image.source.header.height):
                    converted = convert_image(image, settings)
            except InputRejected as exc:
                rejections.append(Rejection.from_exception(image.source.path, exc, split))
                continue
            record = converted.record
            rejections.extend(dataclasses.replace(row, split=split) for row in converted.dropped)
            if record is None:
                continue
            entry = IndexEntry(offset, tfrecord.write_record(handle, record.data),
                               image.source.content_hash, record.image_offset, record.image_length)
            if converted.reused:
                copied_from.add((image.reuse.dataset, image.reuse.run_id))
            index.append(entry)
            offset += entry.length
            label_counts.update(converted.labels)
            reused += converted.reused
    if not all(still_published(dataset, run_id) for dataset, run_id in copied_from):
        files.delete([temporary])
        unreused = tuple(dataclasses.replace(image, reuse=None) for image in task.images)
        return convert_part(dataclasses.replace(task, images=unreused), settings, refused)
    files.rename(temporary, records_path)
    num_bytes = offset - len(index) * tfrecord.framed_length(0)  # the records' own bytes, without framing
    outcome = PartOutcome(task.digest, len(index), num_bytes, tuple(sorted(label_counts.items())),
                          tuple(rejections), tuple(index), reused, f"{socket.gethostname()}:{os.getpid()}",
                          settings.run_dir)
    files.write_atomically(part_file(settings, task.digest, "json"), outcome.to_json().encode("utf-8"))
    return outcome


def convert_part_on(converters: SubprocessPool, task: PartTask, settings: WriterSettings) -> PartOutcome:
    """`convert_part` in a converter process. An image that takes more than its CPU time ends
    that process (transforms/images/limits.py): it becomes a dead letter, and the part is converted
    again without it in the process that takes the dead one's place."""
    refused: dict[int, str] = {}
    while True:
        try:
            return converters.submit(convert_part, task, settings, refused).result()
        except WorkerDied as died:
            if died.returncode != -signal.SIGPROF or died.note is None:
                raise
            header = task.images[died.note].source.header
            seconds = limits.image_seconds(header.width * header.height)
            refused[died.note] = (f"converting it took more than {seconds:.0f} s of CPU time, the limit for "
                                  f"{header.width}x{header.height} pixels (a progressive jpeg of thousands of scans?)")


def finished_outcome(task: PartTask, settings: WriterSettings) -> Optional[PartOutcome]:
    """The outcome of an earlier run's finished part, if it checks out: readable, this part's,
    its records file as long as its index says and every record intact (nothing is fsynced, so
    a power loss can leave a torn or zeroed file behind a finished name). Else None: the part is
    converted again. Checking reads the part once, which costs far less than converting it."""
    records = part_file(settings, task.digest, "records")
    if not (files.exists(part_file(settings, task.digest, "json")) and files.exists(records)):
        return None
    try:
        outcome = _read_outcome(settings, task.digest)
        if outcome.digest != task.digest or files.size(records) != sum(e.length for e in outcome.index):
            return None
        with files.open_read(records) as handle:
            for entry in outcome.index:  # checksums valid, the image where the entry says, with its hash
                data = tfrecord.read_record_at(handle, entry.offset, entry.length)
                if not locates_image(data, entry.image_offset, entry.image_length, entry.sha256, settings.keys.image):
                    return None
    # damaged JSON, a line that is no entry, a torn record (CorruptRecord is a ValueError)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return outcome


def _read_outcome(settings: WriterSettings, digest: str) -> PartOutcome:
    return PartOutcome.from_json(files.read_bytes(part_file(settings, digest, "json")).decode("utf-8"))


def concat_shard(plan: ShardPlan, parts: list[PartResult], settings: WriterSettings) -> ShardResult:
    """The shard file (and its index) from its parts in order; a missing part is a bug."""
    split, index, num_shards = plan.shard
    parts = sorted(parts, key=lambda p: p.index)
    if [p.index for p in parts] != list(range(plan.num_parts)):
        raise RuntimeError(f"shard {plan.shard}: parts {[p.index for p in parts]} != 0..{plan.num_parts - 1}")
    name = shard_file_name(split, index, num_shards, settings.output.compression)
    shard_path, index_path = join(settings.run_dir, name), join(settings.run_dir, index_file_name(name))
    temporary = f"{shard_path}.tmp-{uuid.uuid4().hex}"
    gzip = settings.output.compression == "gzip"
    records = [part_file(settings, part.digest, "records") for part in parts]
    # A shard of one part is that part's bytes: linked, not copied (the part stays for a restart).
    if not (len(records) == 1 and not gzip and files.link(records[0], temporary)):
        with files.create(temporary, gzip=gzip) as shard:
            for path in records:
                files.append_file(shard, path)
    lines, offset = [], 0
    for part in parts:
        outcome = _read_outcome(settings, part.digest)
        lines.extend(entry.shifted(offset).to_line() for entry in outcome.index)
        offset += sum(entry.length for entry in outcome.index)
    files.rename(temporary, shard_path)
    files.write_atomically(index_path, "".join(lines).encode("ascii"))
    label_counts = sum((collections.Counter(dict(part.label_counts)) for part in parts), collections.Counter())
    return ShardResult(split, index, num_shards, name, sum(p.records for p in parts),
                       sum(p.num_bytes for p in parts), tuple(sorted(label_counts.items())),
                       sum(p.reused for p in parts), tuple(sorted({p.converted_by for p in parts})),
                       sum(p.resumed for p in parts))
