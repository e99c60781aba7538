"""Parts and shards without Beam: what a part holds, converting one, concatenating a shard.

A part is a fixed number of consecutive records of one shard. Converting it writes its records
to a part file named by a digest of the settings and images it holds, then an outcome file
(counts, rejections, record index) last, so a part with an outcome is complete and a restarted
run takes it as it is (once it checks out: `finished_outcome`). On a local disk, a part in
progress also journals every record it has written, so a run killed mid-part leaves records a
restart can take too (`salvaged_record`).
Concatenating a shard's parts in order gives the same bytes as writing the shard in one pass,
because TFRecord framing is per record.

This module imports no Beam: it runs in the converter processes (transforms/process_pool.py).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import posixpath
import signal
import socket
import uuid
from typing import BinaryIO, Iterable, Iterator, Optional

from transforms import files, limits, tfrecord
from transforms.annotations import annotation_digest
from transforms.dataset_format import (
    METADATA_FILE,
    FormatError,
    IndexEntry,
    index_file_name,
    join,
    run_id_of,
    shard_file_name,
)
from transforms.example import EncodedRecord, RecordFields, build_example, locates_image
from transforms.process import image_to_record
from transforms.process_detection import detection_to_record
from transforms.process_pool import SubprocessPool, WorkerDied
from transforms.refs import PlannedImage
from transforms.rejections import CorruptImage, FileChanged, InputRejected, Rejection
from transforms.specs import AnnotationSpec, FeatureKeys, ImageSpec, OutputSpec
from transforms.split import num_shards_for, order_in_shard

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

    def record_path(self, path: str) -> str:
        """What a record's source_path holds for the image at `path`."""
        return files.below(path, self.source_root)

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
    resumed: int = 0  # records taken from an earlier, interrupted attempt (not stored)

    def to_json(self) -> str:
        return json.dumps({"digest": self.digest, "records": self.records, "num_bytes": self.num_bytes,
                           "label_counts": [list(p) for p in self.label_counts], "reused": self.reused,
                           "rejections": [dataclasses.asdict(r) for r in self.rejections],
                           "index": [e.to_line() for e in self.index], "converted_by": self.converted_by})

    @classmethod
    def from_json(cls, text: str) -> "PartOutcome":
        value = json.loads(text)
        return cls(value["digest"], value["records"], value["num_bytes"],
                   tuple((label, n) for label, n in value["label_counts"]),
                   tuple(Rejection(**r) for r in value["rejections"]),
                   tuple(IndexEntry.from_line(line) for line in value["index"]), value["reused"],
                   value["converted_by"])


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
    resumed: int = 0  # records taken from what an interrupted run had written


def record_digest(image: ImageSpec, keys: FeatureKeys, versions: dict[str, str], source_root: str = "",
                  objects: Optional[AnnotationSpec] = None) -> str:
    """Everything besides the image and its fields that decides a record's bytes (`objects`:
    what detection records hold beyond boxes)."""
    settings = {"image": dataclasses.asdict(image), "keys": dataclasses.asdict(keys), "versions": versions,
                "source_root": source_root, **({"objects": dataclasses.asdict(objects)} if objects else {})}
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


def shard_keys(planned_counts: dict[str, int], image: ImageSpec, output: OutputSpec) -> list[ShardKey]:
    """Every shard of every split that has images, so shards no image hashed to exist too."""
    keys = []
    for split, count in sorted(planned_counts.items()):
        num_shards = num_shards_for(count, image, output)
        keys.extend((split, index, num_shards) for index in range(num_shards))
    return keys


def reused_record(image: PlannedImage, fields: RecordFields, settings: WriterSettings) -> EncodedRecord:
    """The record rebuilt around the image bytes of the same content in a previous dataset."""
    location = image.reuse
    try:
        with files.open_read(location.shard) as handle:
            data = tfrecord.read_record_at(handle, location.entry.offset, location.entry.length)
    except (OSError, tfrecord.CorruptRecord) as exc:
        # A damaged previous dataset must not damage this one; converting again is always right.
        raise _ReuseFailed(f"{location.shard}@{location.entry.offset}: {exc}") from exc
    entry = location.entry
    if entry.sha256 != image.source.content_hash or not locates_image(
            data, entry.image_offset, entry.image_length, entry.sha256, location.image_key):
        raise _ReuseFailed(f"{location.shard}@{entry.offset} does not hold content {image.source.content_hash}")
    pixels = data[entry.image_offset:entry.image_offset + entry.image_length]
    return build_example(pixels, fields, settings.image, settings.keys)


class _ReuseFailed(Exception):
    pass


def still_published(dataset: str, run_id: str) -> bool:
    """Whether a dataset records were copied from still holds what run `run_id` published.
    A run replacing it deletes its metadata.json before it touches a shard and writes its own
    last, so records read before this returns True are that run's (a dataset made with other
    settings can have records at the very same offsets, holding the same content hashes)."""
    try:
        return run_id_of(json.loads(files.read_bytes(join(dataset, METADATA_FILE)))) == run_id
    except (OSError, ValueError):  # gone, or being rewritten
        return False


def without_reuse(task: PartTask) -> PartTask:
    return dataclasses.replace(task, images=tuple(dataclasses.replace(image, reuse=None) for image in task.images))


@dataclasses.dataclass(frozen=True)
class Converted:
    """One image's record; `labels`: the class of each thing it counts (the image's label, or
    each object's class); `dropped`: the rows of objects left out of it."""

    record: EncodedRecord
    reused: bool
    labels: tuple[str, ...]
    dropped: tuple[Rejection, ...] = ()


def convert_image(image: PlannedImage, settings: WriterSettings) -> Converted:
    """One planned image's record: its previous bytes if it has some, else a fresh conversion of
    the file, which must still hash to what was planned. An annotated image's record is always
    built afresh (its objects are placed from the decoded geometry)."""
    source = image.source
    fields = RecordFields(image.label_id, source.label, settings.record_path(source.path), source.content_hash)
    if image.reuse is not None and source.annotations is None:
        try:
            return Converted(reused_record(image, fields, settings), True, (source.label,))
        except _ReuseFailed:
            pass
    data = files.read_input(source.path, settings.max_file_bytes)
    if files.content_hash(data) != source.content_hash:
        raise FileChanged(f"{source.path} changed while the pipeline ran (sha256 differs)")
    try:
        if source.annotations is not None:
            keys, path = settings.keys, fields.source_path.encode("utf-8", "surrogateescape")
            extra = {key: value for key, value in ((keys.source_path, path),
                                                   (keys.content_hash, source.content_hash.encode("ascii"))) if key}
            record, objects, dropped = detection_to_record(data, source.header, source.annotations, settings.image,
                                                           settings.objects, settings.voc_fields, extra)
            return Converted(record, False, tuple(obj.text for obj in objects), dropped)
        return Converted(image_to_record(data, source.header, fields, settings.image, settings.keys), False,
                         (source.label,))
    except InputRejected:
        raise
    except Exception as exc:  # OpenCV raises cv2.error on data it cannot handle
        if type(exc).__module__.startswith("cv2"):
            raise CorruptImage(f"OpenCV failed on {source.path}: {exc}") from None
        raise


@dataclasses.dataclass(frozen=True)
class JournalLine:
    """One record an attempt has written: the position of its image in the part, whether its
    image bytes were reused from a previous dataset, and its index entry in the attempt's file."""

    position: int
    reused: bool
    entry: IndexEntry

    def to_line(self) -> str:
        return f"{self.position} {int(self.reused)} {self.entry.to_line()}"

    @classmethod
    def from_line(cls, line: str) -> "JournalLine":
        position, reused, rest = line.split(" ", 2)
        if reused not in ("0", "1"):
            raise FormatError(f"journal line has reused={reused!r}")
        return cls(int(position), reused == "1", IndexEntry.from_line(rest))


class _Journal:
    """The line of every record an attempt has written, appended once the record is in its file
    (unbuffered, so a killed process leaves every line it wrote). No path: no journal."""

    def __init__(self, path: Optional[str]):
        self._handle = open(path, "ab", buffering=0) if path else None

    def add(self, records: BinaryIO, line: JournalLine) -> None:
        if self._handle:
            records.flush()
            self._handle.write(line.to_line().encode("ascii"))

    def close(self) -> None:
        if self._handle:
            self._handle.close()


def parse_journal(text: str, num_images: int) -> dict[int, JournalLine]:
    """A journal's usable lines by image position; damaged lines are skipped, not trusted."""
    lines = {}
    for raw in text.splitlines():
        try:
            line = JournalLine.from_line(raw)
        except (FormatError, ValueError):
            continue
        if 0 <= line.position < num_images and line.entry.offset >= 0 and line.entry.length > 0:
            lines.setdefault(line.position, line)
    return lines


def salvaged_record(line: JournalLine, image: PlannedImage, records: BinaryIO, size: int,
                    image_key: str) -> Optional[bytes]:
    """The framed record an interrupted attempt wrote for `image`, if it is exactly what
    converting the image writes: inside the file, checksums valid, holding the image's content
    hash and image bytes where the line says. Else None, and the image is converted again.

    The part's digest covers its images in order, their fields and the record settings, so a
    record at the same position with these checks has the bytes a conversion would write."""
    entry = line.entry
    if entry.sha256 != image.source.content_hash or entry.offset + entry.length > size:
        return None
    return intact_record(records, entry, image_key)


def intact_record(records: BinaryIO, entry: IndexEntry, image_key: str) -> Optional[bytes]:
    """The framed record at `entry` in `records` if its checksums hold and its image bytes are
    where the entry says, hashing to the entry's content hash; else None."""
    try:
        records.seek(entry.offset)
        framed = records.read(entry.length)
        data = tfrecord.parse_framed(framed)
    except (ValueError, OSError):  # CorruptRecord is a ValueError
        return None
    return framed if locates_image(data, entry.image_offset, entry.image_length, entry.sha256, image_key) else None


class _Attempt:
    """Where one attempt at a part writes before its records are complete.

    On a local disk: `{digest}.partial/{run}-{unique}.records` and its journal (`.index`), so a
    restarted run can claim an interrupted run's attempt (`claim`). Elsewhere (object stores,
    whose objects appear only once closed), or when that folder cannot be made, a temporary
    name beside the part."""

    def __init__(self, task: PartTask, settings: WriterSettings):
        self.records_path = part_file(settings, task.digest, "records")
        self.run = posixpath.basename(settings.run_dir.rstrip("/"))
        local = files.local_path(settings.parts_dir)
        self.folder = os.path.join(local, f"{task.digest}.partial") if local is not None else None
        try:
            if self.folder is not None:
                os.makedirs(self.folder, exist_ok=True)
        except OSError:  # e.g. a file in its place: then this attempt cannot be taken over
            self.folder = None
        if self.folder is not None:
            stem = os.path.join(self.folder, f"{self.run}-{uuid.uuid4().hex}")
            self.temporary, self.journal = f"{stem}.records", f"{stem}.index"
        else:
            self.temporary, self.journal = f"{self.records_path}.tmp-{uuid.uuid4().hex}", None

    def claim(self) -> Optional[tuple[str, BinaryIO, str]]:
        """(path, open records file, journal text) of another run's attempt, the longest journal
        first, renamed to this attempt's names: a rename succeeds once, so no two attempts take
        the same one. Only other runs' attempts: this run's own may still be running (a retried
        bundle). What is taken is read, never written to, so even a writer of a killed driver's
        job that is still alive cannot change the records taken. Anything unreadable is skipped."""
        if self.folder is None:
            return None
        candidates = [name for name in os.listdir(self.folder)
                      if name.endswith(".index") and name[:-len(".index")].rsplit("-", 1)[0] != self.run]
        for name in sorted(candidates, key=lambda n: _size(os.path.join(self.folder, n)), reverse=True):
            stem, claimed = os.path.join(self.folder, name[:-len(".index")]), f"{self.temporary}.claimed"
            try:
                os.rename(f"{stem}.index", f"{claimed}.index")
                os.rename(f"{stem}.records", claimed)
                with open(f"{claimed}.index", "rb") as handle:
                    journal = handle.read(_MAX_JOURNAL_BYTES).decode("ascii", "replace")
                os.remove(f"{claimed}.index")
                return claimed, open(claimed, "rb"), journal
            except OSError:  # gone (another claimant), or not a file: not this attempt's to take
                continue
        return None

    def abandon(self) -> None:
        """Removes what this attempt wrote, journal included: nothing of it may be taken over."""
        files.delete([path for path in (self.journal, self.temporary) if path])
        self._remove_folder()

    def finish(self) -> None:
        files.rename(self.temporary, self.records_path)
        if self.folder is not None:
            os.remove(self.journal)
        self._remove_folder()

    def _remove_folder(self) -> None:
        if self.folder is not None:
            try:
                os.rmdir(self.folder)
            except OSError:  # other attempts' leftovers: removed with the parts when a run publishes
                pass


_MAX_JOURNAL_BYTES = 64 * 2**20  # a journal line per record is ~110 bytes


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


@contextlib.contextmanager
def _claimed_attempt(task: PartTask, attempt: _Attempt) -> Iterator[tuple[dict[int, JournalLine], BinaryIO, int]]:
    """An interrupted run's attempt at this part: (its journal lines by position, its records
    file, the file's size), removed afterwards; nothing when there is none."""
    claimed = attempt.claim()
    if claimed is None:
        yield {}, io.BytesIO(), 0
        return
    path, records, journal = claimed
    try:
        with records:
            yield parse_journal(journal, len(task.images)), records, os.fstat(records.fileno()).st_size
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)


def convert_part(task: PartTask, settings: WriterSettings, refused: Optional[dict[int, str]] = None) -> PartOutcome:
    """Writes the part's records (or finds them from an earlier attempt); returns its outcome.
    `refused`: the images (by position) that ended an earlier attempt's converter process, and
    why; they are rejected without being converted again.

    Runs in a converter process (`convert_part_on`), each image within its limits
    (transforms/limits.py). The records go to a temporary name and the
    outcome is written last, so a part whose outcome exists is complete, and taken as it is if it
    checks out (`finished_outcome`) and rejected no file for its state then (unreadable,
    changed). Records an interrupted run wrote for this part are taken when they check out
    (`salvaged_record`) and were converted, not copied from a previous dataset; every other
    image, including those it rejected, is converted again. Records copied from a previous
    dataset are kept only if it was not replaced meanwhile (`still_published`), else the part
    is written again without copying.
    """
    split = task.shard[0]
    found = finished_outcome(task, settings)
    if found is not None and not any(r.about_the_file_then for r in found.rejections):
        # Records do not hold their split, so the part is the same under renamed splits.
        rejections = tuple(dataclasses.replace(r, split=split) for r in found.rejections)
        return dataclasses.replace(found, rejections=rejections, resumed=found.records)
    attempt = _Attempt(task, settings)
    label_counts: collections.Counter[str] = collections.Counter()
    rejections, index = [], []
    offset = num_bytes = reused = resumed = 0
    copied_from: set[tuple[str, str]] = set()  # (dataset, the run that published it) of each copied record
    journal = _Journal(attempt.journal)
    try:
        with files.create(attempt.temporary) as handle, _claimed_attempt(task, attempt) as (earlier, records, size):
            for position, image in enumerate(task.images):
                if refused and position in refused:
                    rejections.append(Rejection.from_exception(image.source.path, CorruptImage(refused[position]),
                                                               split))
                    continue
                line = earlier.get(position)
                # A copied record: see still_published. An annotated image's dropped objects are not
                # journalled, so it is converted again.
                salvage = line is not None and not line.reused and image.source.annotations is None
                framed = salvaged_record(line, image, records, size, settings.keys.image) if salvage else None
                if framed is not None:
                    handle.write(framed)
                    entry, was_reused = dataclasses.replace(line.entry, offset=offset), line.reused
                    labels = (image.source.label,)
                    resumed += 1
                else:
                    try:
                        with limits.image_time(position, image.source.header.width * image.source.header.height):
                            converted = convert_image(image, settings)
                    except InputRejected as exc:
                        rejections.append(Rejection.from_exception(image.source.path, exc, split))
                        continue
                    record, was_reused, labels = converted.record, converted.reused, converted.labels
                    rejections.extend(dataclasses.replace(row, split=split) for row in converted.dropped)
                    entry = IndexEntry(offset, tfrecord.write_record(handle, record.data),
                                       image.source.content_hash, record.image_offset, record.image_length)
                    if was_reused:
                        copied_from.add((image.reuse.dataset, image.reuse.run_id))
                index.append(entry)
                journal.add(handle, JournalLine(position, was_reused, entry))
                offset += entry.length
                num_bytes += entry.length - tfrecord.framed_length(0)
                label_counts.update(labels)
                reused += was_reused
    finally:
        journal.close()
    if not all(still_published(dataset, run_id) for dataset, run_id in copied_from):
        attempt.abandon()
        return convert_part(without_reuse(task), settings, refused)
    attempt.finish()
    outcome = PartOutcome(task.digest, len(index), num_bytes, tuple(sorted(label_counts.items())),
                          tuple(rejections), tuple(index), reused, f"{socket.gethostname()}:{os.getpid()}")
    files.write_atomically(part_file(settings, task.digest, "json"), outcome.to_json().encode("utf-8"))
    return dataclasses.replace(outcome, resumed=resumed)


def convert_part_on(converters: SubprocessPool, task: PartTask, settings: WriterSettings) -> PartOutcome:
    """`convert_part` in a converter process. An image that takes more than its CPU time ends
    that process (transforms/limits.py): it becomes a dead letter, and the part is converted
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
            if not all(intact_record(handle, entry, settings.keys.image) for entry in outcome.index):
                return None
    except (OSError, ValueError, KeyError, TypeError):  # damaged JSON, a line that is no entry
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
    label_counts: collections.Counter[str] = collections.Counter()
    for part in parts:
        label_counts.update(dict(part.label_counts))
    return ShardResult(split, index, num_shards, name, sum(p.records for p in parts),
                       sum(p.num_bytes for p in parts), tuple(sorted(label_counts.items())),
                       sum(p.reused for p in parts), tuple(sorted({p.converted_by for p in parts})),
                       sum(p.resumed for p in parts))
