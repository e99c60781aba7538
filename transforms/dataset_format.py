"""The imgrec dataset format: file names, metadata.json as typed values, and the record index.

This is the one home of the format. The writer (transforms/, pipeline/), the reader, the verifier
and the TFDS export all build and parse it through this module, which imports neither Beam nor
OpenCV nor TensorFlow, so training jobs can use it without the pipeline's dependencies.

An output folder holds:

    train-00000-of-00002.tfrecord      shards (`.tfrecord.gz` with gzip), named as WriteToTFRecord does
    errors-00000-of-00001.jsonl        dead letters: one JSON object per rejected input
    index/train-00000-of-00002.tfrecord.idx
                                       record index: one line per record, see `IndexEntry`
    metadata.json                      written last: its presence marks a finished dataset
    .imgrec.lock, .imgrec-staging/     only while a run is writing (hidden)

`metadata.json` lists every file the run published; imgrec only ever deletes files listed there.
"""
from __future__ import annotations

import dataclasses
import json
import posixpath
import re
from typing import Any, Mapping, Optional, Sequence

FORMAT_VERSION = 2
METADATA_FILE = "metadata.json"
LOCK_FILE = ".imgrec.lock"
STAGING_DIR = ".imgrec-staging"
RUN_DIR_PREFIX = "run-"  # a run's folder in the staging folder
INDEX_DIR = "index"
DEAD_LETTERS_FILE = "errors-00000-of-00001.jsonl"  # one file: sorted rows, any runner
# Drawn into the dataset folder by `imgrec verify` (by default): imgrec's, though not listed.
CONTACT_SHEET = "contact_sheet.png"
# A detection dataset's label map as the OD API (StringIntLabelMap text) and Model Garden (id,name) read it.
LABEL_MAP_FILES = ("label_map.pbtxt", "label_map.csv")
CLASS_COUNTS = "class_counts.png"

# compression name → (shard suffix, TFRecordDataset compression_type)
COMPRESSIONS: Mapping[str, tuple[str, str]] = {"none": (".tfrecord", ""), "gzip": (".tfrecord.gz", "GZIP")}

_SHARD_NAME = re.compile(r"(?P<split>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})(?P<suffix>\.tfrecord(\.gz)?)")


class FormatError(ValueError):
    """metadata.json is missing fields, has the wrong types, or a version this code cannot read."""


def shard_suffix(compression: str) -> str:
    if compression not in COMPRESSIONS:
        raise FormatError(f"unknown compression {compression!r}; expected one of {', '.join(COMPRESSIONS)}")
    return COMPRESSIONS[compression][0]


def tf_compression_type(compression: str) -> str:
    """imgrec's compression name → `tf.data.TFRecordDataset(compression_type=...)`."""
    shard_suffix(compression)
    return COMPRESSIONS[compression][1]


def shard_file_name(split: str, index: int, num_shards: int, compression: str) -> str:
    """`train-00000-of-00004.tfrecord`, the names `WriteToTFRecord` (and TFDS) give."""
    return f"{split}-{index:05d}-of-{num_shards:05d}{shard_suffix(compression)}"


def parse_shard_file_name(name: str) -> Optional[tuple[str, int, int]]:
    """(split, index, count) of a shard file name, or None."""
    match = _SHARD_NAME.fullmatch(name)
    return (match["split"], int(match["index"]), int(match["count"])) if match else None


def index_file_name(shard_file: str) -> str:
    """The record index of a shard, in the `index/` subfolder so that `train-*` globs skip it."""
    return posixpath.join(INDEX_DIR, f"{shard_file}.idx")


def join(directory: str, name: str) -> str:
    """`directory/name` for local paths and URLs alike (gs://b/x + y → gs://b/x/y)."""
    return f"{directory.rstrip('/')}/{name}"


def staging_dir(output: str) -> str:
    """Hidden, inside the output: the same filesystem (and mount) as the output, so publishing is
    a rename, and a `train-*` glob in the output never sees it."""
    return join(output, STAGING_DIR)


def parts_dir(output: str) -> str:
    """Converted parts, named by a digest of what they hold: a restarted run finds them again."""
    return join(staging_dir(output), "parts")


def run_dir(output: str, run_id: str) -> str:
    """One run's shards, index, dead letters and staged metadata.json, until it publishes."""
    return join(staging_dir(output), f"{RUN_DIR_PREFIX}{run_id}")


# --------------------------------------------------------------------------------------------
# The record index


@dataclasses.dataclass(frozen=True)
class IndexEntry:
    """Where one record sits in its (uncompressed) shard and where its image bytes sit in it.

    One line per record: `offset length sha256 image_offset image_length`, space-separated.
    `offset`/`length` frame the whole TFRecord entry (12-byte header, data, 4-byte CRC), so the
    first two columns are DALI's TFRecord index format (`cut -d' ' -f1,2`). `image_offset` and
    `image_length` locate the encoded image inside the record's data, which lets an incremental
    run copy an unchanged image without parsing the Example.
    """

    offset: int
    length: int
    sha256: str
    image_offset: int
    image_length: int

    def to_line(self) -> str:
        return f"{self.offset} {self.length} {self.sha256} {self.image_offset} {self.image_length}\n"

    @classmethod
    def from_line(cls, line: str) -> "IndexEntry":
        parts = line.split()
        if len(parts) != 5:
            raise FormatError(f"index line has {len(parts)} fields, expected 5: {line!r}")
        offset, length, sha256, image_offset, image_length = parts
        return cls(int(offset), int(length), sha256, int(image_offset), int(image_length))

    def shifted(self, by: int) -> "IndexEntry":
        return dataclasses.replace(self, offset=self.offset + by)


def parse_index(text: str) -> list[IndexEntry]:
    """A record index file's lines, in record order."""
    return [IndexEntry.from_line(line) for line in text.splitlines()]


@dataclasses.dataclass(frozen=True)
class RecordLocation:
    """A record of a published dataset: its shard's full path, its index entry, and the run
    that published it (shard names stay the same when a run replaces the dataset)."""

    shard: str
    entry: IndexEntry
    image_key: str  # the feature whose value is at entry.image_offset
    run_id: str

    @property
    def dataset(self) -> str:
        return posixpath.dirname(self.shard)


# --------------------------------------------------------------------------------------------
# metadata.json


def _require(mapping: Mapping, key: str, kind: Any, where: str) -> Any:
    if key not in mapping:
        raise FormatError(f"{where}: missing {key!r}")
    value = mapping[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise FormatError(f"{where}.{key} must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _counts(mapping: Mapping, key: str, where: str) -> dict[str, int]:
    counts = _require(mapping, key, dict, where)
    for name, value in counts.items():
        if not _is_count(value):
            raise FormatError(f"{where}.{key}[{name!r}] must be a count, got {value!r}")
    return dict(counts)


def _items(mapping: Mapping, key: str, kind: type, where: str) -> tuple:
    """A list of `kind`s (of counts, for int): readers sum and open them as they are."""
    items = tuple(_require(mapping, key, list, where))
    for index, item in enumerate(items):
        if not (_is_count(item) if kind is int else isinstance(item, kind)):
            raise FormatError(f"{where}.{key}[{index}] must be {'a count' if kind is int else kind.__name__}, "
                              f"got {item!r}")
    return items


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split: its shard files in order, their record counts, and what was rejected."""

    num_examples: int
    num_bytes: int  # serialized records, before framing and compression
    files: tuple[str, ...]
    shard_lengths: tuple[int, ...]
    label_counts: Mapping[str, int]
    rejected: int

    @property
    def num_shards(self) -> int:
        return len(self.files)

    @property
    def index_files(self) -> tuple[str, ...]:
        return tuple(index_file_name(f) for f in self.files)

    def to_json(self) -> dict:
        return {"num_examples": self.num_examples, "num_bytes": self.num_bytes, "num_shards": self.num_shards,
                "files": list(self.files), "shard_lengths": list(self.shard_lengths),
                "label_counts": dict(sorted(self.label_counts.items())), "rejected": self.rejected}

    @classmethod
    def from_json(cls, value: Mapping, where: str) -> "SplitInfo":
        info = cls(num_examples=_require(value, "num_examples", int, where),
                   num_bytes=_require(value, "num_bytes", int, where),
                   files=_items(value, "files", str, where),
                   shard_lengths=_items(value, "shard_lengths", int, where),
                   label_counts=_counts(value, "label_counts", where),
                   rejected=_require(value, "rejected", int, where))
        if len(info.files) != len(info.shard_lengths):
            raise FormatError(f"{where}: {len(info.files)} files but {len(info.shard_lengths)} shard_lengths")
        if value.get("num_shards", info.num_shards) != info.num_shards:  # what other readers of the file take
            raise FormatError(f"{where}: num_shards {value['num_shards']!r} but {info.num_shards} files")
        return info


@dataclasses.dataclass(frozen=True)
class InputAccounting:
    """Every input is either written or rejected: total = written + rejected."""

    total: int
    written: int
    rejected: int
    errors: int  # rejections that count against max_error_fraction (not skipped files, dropped copies)
    rejected_by_error: Mapping[str, int]
    rejected_by_stage: Mapping[str, int]

    @property
    def error_fraction(self) -> float:
        """Errors among the inputs that were images to convert: skipped files (a README, 150
        `.txt` files) and dropped copies neither count as errors nor dilute them."""
        considered = self.written + self.errors
        return self.errors / considered if considered else 0.0

    def to_json(self) -> dict:
        return {"total": self.total, "written": self.written, "rejected": self.rejected, "errors": self.errors,
                "error_fraction": self.error_fraction,
                "rejected_by_error": dict(sorted(self.rejected_by_error.items())),
                "rejected_by_stage": dict(sorted(self.rejected_by_stage.items()))}

    @classmethod
    def from_json(cls, value: Mapping, where: str = "inputs") -> "InputAccounting":
        totals = {key: _require(value, key, int, where) for key in ("total", "written", "rejected", "errors")}
        return cls(**totals, rejected_by_error=_counts(value, "rejected_by_error", where),
                   rejected_by_stage=_counts(value, "rejected_by_stage", where))


@dataclasses.dataclass(frozen=True)
class DuplicateSummary:
    """Identical images (same SHA-256): how many groups, extra copies, how many groups hold copies
    with different labels (label conflicts), and the first groups."""

    groups: int = 0
    extra_copies: int = 0
    dropped: bool = False
    examples: tuple[Mapping[str, Any], ...] = ()
    label_conflicts: int = 0

    def to_json(self) -> dict:
        return {"groups": self.groups, "extra_copies": self.extra_copies, "dropped": self.dropped,
                "label_conflicts": self.label_conflicts, "examples": [dict(e) for e in self.examples]}

    @classmethod
    def from_json(cls, value: Mapping) -> "DuplicateSummary":
        return cls(int(value.get("groups", 0)), int(value.get("extra_copies", 0)), bool(value.get("dropped")),
                   tuple(value.get("examples", ())), int(value.get("label_conflicts", 0)))


@dataclasses.dataclass(frozen=True)
class ReuseSummary:
    """What an incremental run (`--reuse_from`) took from a previous dataset."""

    source: str
    reused: int
    converted: int

    def to_json(self) -> dict:
        return {"from": self.source, "reused": self.reused, "converted": self.converted}

    @classmethod
    def from_json(cls, value: Mapping) -> "ReuseSummary":
        return cls(str(value["from"]), int(value["reused"]), int(value["converted"]))


@dataclasses.dataclass(frozen=True)
class ObjectAccounting:
    """A detection dataset's objects: written per class, dropped per reason (error class). Its
    label map is also written beside the shards (transforms/inputs/label_map_files.py)."""

    written: Mapping[str, int]
    dropped: Mapping[str, int]

    def to_json(self) -> dict:
        return {"written": dict(sorted(self.written.items())), "dropped": dict(sorted(self.dropped.items()))}

    @classmethod
    def from_json(cls, value: Mapping) -> "ObjectAccounting":
        return cls(_counts(value, "written", "objects"), _counts(value, "dropped", "objects"))


@dataclasses.dataclass(frozen=True)
class DatasetMetadata:
    """metadata.json of a finished dataset."""

    splits: Mapping[str, SplitInfo]
    features: Mapping[str, Mapping[str, Any]]  # key → {"role", "dtype", ...}: the parse spec
    image: Mapping[str, Any]
    compression: str
    label_map: Mapping[str, int]
    inputs: InputAccounting
    duplicates: DuplicateSummary
    error_files: tuple[str, ...]
    fingerprint: str  # inputs + config, for --skip_unchanged
    pixel_fingerprint: str  # everything that determines the image bytes, for --reuse_from
    config: Mapping[str, Any]
    run: Mapping[str, Any]
    versions: Mapping[str, str]
    reuse: Optional[ReuseSummary] = None
    exports: tuple[str, ...] = ()  # files added later by `imgrec export-tfds`
    objects: Optional[ObjectAccounting] = None  # COCO and VOC inputs
    format_version: int = FORMAT_VERSION

    @property
    def planned(self) -> int:
        """Images the run set out to convert: each split's records and its conversion rejections."""
        return sum(split.num_examples + split.rejected for split in self.splits.values())

    @property
    def shard_files(self) -> tuple[str, ...]:
        return tuple(f for split in self.splits.values() for f in split.files)

    @property
    def index_files(self) -> tuple[str, ...]:
        return tuple(f for split in self.splits.values() for f in split.index_files)

    def owned_files(self) -> tuple[str, ...]:
        """Every file this dataset consists of (relative names): what a republish may remove."""
        label_maps = LABEL_MAP_FILES if self.objects is not None else ()
        return (*self.shard_files, *self.index_files, *self.error_files, *self.exports, *label_maps, METADATA_FILE)

    def role_keys(self) -> dict[str, str]:
        """{role: feature key}, e.g. {"image": "image", "label": "label", ...}."""
        return {described.get("role"): key for key, described in self.features.items()}

    def class_names(self) -> list[str]:
        return [name for name, _ in sorted(self.label_map.items(), key=lambda item: item[1])]

    def to_json(self) -> dict:
        return {
            "format_version": self.format_version,
            "splits": {name: info.to_json() for name, info in self.splits.items()},
            "features": {key: dict(described) for key, described in self.features.items()},
            "image": dict(self.image),
            "compression": self.compression,
            "label_map": dict(sorted(self.label_map.items(), key=lambda item: item[1])),
            "inputs": self.inputs.to_json(),
            "duplicates": self.duplicates.to_json(),
            "error_files": list(self.error_files),
            "fingerprint": self.fingerprint,
            "pixel_fingerprint": self.pixel_fingerprint,
            "reuse": self.reuse.to_json() if self.reuse else None,
            "exports": list(self.exports),
            **({"objects": self.objects.to_json()} if self.objects is not None else {}),
            "config": self.config,
            "run": dict(self.run),
            "versions": dict(self.versions),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    @classmethod
    def from_json(cls, value: Any) -> "DatasetMetadata":
        if not isinstance(value, dict):
            raise FormatError(f"metadata.json must hold a JSON object, not {type(value).__name__}")
        version = value.get("format_version")
        if version != FORMAT_VERSION:
            raise FormatError(f"format_version {version!r} is not supported (this imgrec reads version "
                              f"{FORMAT_VERSION}); rewrite the dataset with this imgrec, or read it with the "
                              "imgrec that wrote it")
        splits = _require(value, "splits", dict, "metadata")
        compression = _require(value, "compression", str, "metadata")
        shard_suffix(compression)
        features = _require(value, "features", dict, "metadata")
        for key, described in features.items():  # readers find every feature by its role
            if not isinstance(described, dict) or not isinstance(described.get("role"), str):
                raise FormatError(f"metadata.features[{key!r}] must be an object with a role, got {described!r}")
        return cls(
            splits={name: SplitInfo.from_json(info, f"splits.{name}") for name, info in splits.items()},
            features=features,
            image=_require(value, "image", dict, "metadata"),
            compression=compression,
            label_map=_counts(value, "label_map", "metadata"),
            inputs=InputAccounting.from_json(_require(value, "inputs", dict, "metadata")),
            duplicates=DuplicateSummary.from_json(value.get("duplicates") or {}),
            error_files=tuple(_require(value, "error_files", list, "metadata")),
            fingerprint=_require(value, "fingerprint", str, "metadata"),
            pixel_fingerprint=_require(value, "pixel_fingerprint", str, "metadata"),
            config=_require(value, "config", dict, "metadata"),
            run=_require(value, "run", dict, "metadata"),
            versions=value.get("versions") or {},
            reuse=ReuseSummary.from_json(value["reuse"]) if value.get("reuse") else None,
            exports=tuple(value.get("exports") or ()),
            objects=ObjectAccounting.from_json(value["objects"]) if isinstance(value.get("objects"), dict) else None,
        )

    @classmethod
    def loads(cls, text: str | bytes) -> "DatasetMetadata":
        """From metadata.json's text or bytes (bytes that are not UTF-8 are a FormatError too)."""
        try:
            value = json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise FormatError(f"{METADATA_FILE} is not valid JSON: {exc}") from None
        return cls.from_json(value)


def _inside(name: object) -> bool:
    """A relative name that stays inside the dataset folder (a listed `../x` must never let a
    republish delete files elsewhere)."""
    if not isinstance(name, str) or not name or "://" in name or name.startswith("/"):
        return False
    normal = posixpath.normpath(name)
    return normal not in (".", "..") and not normal.startswith("../")


def is_temporary_metadata(name: str) -> bool:
    """A metadata.json being written (`write_atomically`'s temporary name): imgrec's."""
    return name.startswith(f"{METADATA_FILE}.tmp-")


def run_id_of(value: Any) -> Optional[str]:
    """`run.run_id` of a parsed metadata.json (None if it names no run): which run published it."""
    run = value.get("run") if isinstance(value, dict) else None
    return run.get("run_id") if isinstance(run, dict) else None


def is_dataset_metadata(value: Any) -> bool:
    """Whether a parsed metadata.json was written by imgrec (any format version). Any other
    metadata.json is somebody else's file: never a dataset to replace."""
    return (isinstance(value, dict) and isinstance(value.get("format_version"), int)
            and isinstance(value.get("splits"), dict) and "imgrec" in (value.get("versions") or {}))


def dataset_names(value: Mapping) -> frozenset[str]:
    """The names directly inside a folder holding the dataset `value` (its parsed metadata.json)
    describes that imgrec wrote: its files, and the pictures `imgrec verify` draws beside them."""
    written = {METADATA_FILE, INDEX_DIR, DEAD_LETTERS_FILE, STAGING_DIR, LOCK_FILE, CONTACT_SHEET, CLASS_COUNTS}
    return frozenset(written | {f.split("/", 1)[0] for f in listed_files(value)})


def listed_files(value: Mapping) -> list[str]:
    """The files a metadata.json of any format version says its dataset consists of (so an
    older imgrec's dataset can be replaced without touching anything else)."""
    shards = [f for split in (value.get("splits") or {}).values() for f in split.get("files", []) if _inside(f)]
    indexes = [index_file_name(f) for f in shards if "/" not in f] if value.get("format_version", 0) >= 2 else []
    others = [f for f in [*(value.get("error_files") or []), *(value.get("exports") or [])] if _inside(f)]
    label_maps = LABEL_MAP_FILES if isinstance(value.get("objects"), dict) else ()
    return [posixpath.normpath(f) for f in (*shards, *indexes, *others, *label_maps)]


def split_files(metadata: DatasetMetadata, split: str) -> Sequence[str]:
    """metadata.splits[split].files, with an error naming the splits that exist."""
    if split not in metadata.splits:
        raise ValueError(f"no split {split!r} in this dataset; it has {', '.join(metadata.splits) or 'no splits'}")
    return metadata.splits[split].files
