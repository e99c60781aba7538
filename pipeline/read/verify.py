"""`python -m pipeline.read.verify OUTPUT [--samples N] [--out DIR]`: verify a finished dataset.

Reads every shard metadata.json lists: TensorFlow checks the CRCs, every record is parsed with
the metadata's parse spec (which must be what the recorded config gives) and its image decoded,
and what was found is compared with what metadata.json claims: counts per file, split, label and
(detection) object, record bytes, size features, boxes, the record indexes (each line frames a
record holding its content hash), and the accounting (every input written or rejected, one
dead-letter row per rejection or dropped object). Prints OK/FAILED per check and exits 0 (all
passed), 1 (a check failed) or 2 (not a readable imgrec dataset, or --out is a file), so it can
gate a training job or a copy. It also draws `contact_sheet.png` and `class_counts.png` for a human.
"""
from __future__ import annotations

from pipeline.standard_streams import open_closed_standard_streams, quiet_tensorflow, say

if __name__ == "__main__":
    open_closed_standard_streams()  # before TensorFlow's import opens files

quiet_tensorflow()

import collections
import contextlib
import dataclasses
import gzip
import json
import posixpath
import re
import sys
import zlib
from typing import Any, BinaryIO, ContextManager, Mapping, Optional, Sequence, TextIO

import numpy as np
import tensorflow as tf

from pipeline.errors import CommandLineParser, UsageError
from pipeline.heap import imports_frozen
from pipeline.interrupts import exit_quietly
from pipeline.read import reader
from pipeline.read.drawing import draw_bar_chart, draw_boxes, draw_contact_sheet, to_display_uint8
from pipeline.tables import format_table
from transforms import files
from transforms.dataset_format import (
    CLASS_COUNTS,
    CONTACT_SHEET,
    METADATA_FILE,
    DatasetMetadata,
    SplitInfo,
    join,
    parse_index,
    parse_shard_file_name,
    tf_compression_type,
)
from transforms.inputs.annotations import OBJECT_STAGE
from transforms.inputs.label_map_files import CSV_FILE, PBTXT_FILE, label_map_csv, label_map_pbtxt
from transforms.specs import FeatureKeys, ImageSpec
from transforms.write import tfrecord
from transforms.write.detection_example import detection_feature_spec, masks_recorded, voc_fields_recorded
from transforms.write.example import feature_spec, image_description, locates_image

_SCAN_BATCH = 256
_SIZE_ROLES = ("height", "width", "channels")  # record features that restate the image shape


@dataclasses.dataclass(frozen=True)
class Check:
    ok: bool
    name: str
    detail: str = ""

    @classmethod
    def of(cls, ok: bool, name: str, problem: str) -> "Check":
        """A check whose detail says what is wrong, shown only when it failed."""
        return cls(ok, name, "" if ok else problem)

    def line(self) -> str:
        return f"  {'OK' if self.ok else 'FAILED':<7} {self.name}" + (f": {self.detail}" if self.detail else "")


@dataclasses.dataclass
class ShardScan:
    """What reading one shard found."""

    path: str
    # records, bytes, and what is wrong: non_finite images, wrong_size records (height/width/channels
    # features not the decoded image's shape); detection: bad_boxes (outside [0, 1] or min > max),
    # bad_lengths (records whose per-object lists differ in length), masks decoded and bad_masks
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    labels: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # per object in detection
    # (label id, label text) pairs, to check the text agrees with label_map.
    label_pairs: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    mask_problems: list = dataclasses.field(default_factory=list)  # the first few bad masks, and why
    error: Optional[str] = None


def _size_keys(layout: reader.RecordLayout) -> dict[str, int]:
    """{feature key: the image axis it must equal} for the size features the records have: a raw
    image reshapes to any shape of the same element count, so only these tell a wrong shape."""
    return {layout.extras[role]: axis for axis, role in enumerate(_SIZE_ROLES) if role in layout.extras}


def _failed(ok: tf.Tensor) -> tf.Tensor:
    """A record's failed check as a count, summed by `scan_shard`."""
    return tf.cast(~ok, tf.int64)


def _object_values(parsed: Mapping[str, tf.Tensor], layout: reader.RecordLayout) -> dict[str, tf.Tensor]:
    """A detection record's per-object checks: whether some per-object list has not one value per
    object, and how many boxes are not 0 <= min <= max <= 1 (NaN included)."""
    count = tf.size(parsed[layout.label_key])
    lists = [key for key, feature in layout.parse_spec.items() if isinstance(feature, tf.io.VarLenFeature)]
    lengths_ok = tf.reduce_all(tf.stack([tf.equal(tf.size(parsed[key]), count) for key in lists]))

    def bad_boxes() -> tf.Tensor:
        ymin, xmin, ymax, xmax = tf.unstack(layout.label(parsed)["boxes"], 4, axis=-1)
        ok = (0 <= xmin) & (xmin <= xmax) & (xmax <= 1) & (0 <= ymin) & (ymin <= ymax) & (ymax <= 1)
        return tf.reduce_sum(_failed(ok))
    # boxes of unequal lists cannot be paired up: such a record is counted in bad_lengths
    return {"bad_lengths": _failed(lengths_ok),
            "bad_boxes": tf.cond(lengths_ok, bad_boxes, lambda: tf.constant(0, tf.int64))}


def mask_problem(png: bytes, height: int, width: int) -> Optional[str]:
    """Why an instance mask is not what readers pair with its image (a PNG of one channel at the
    image's `height x width`), or None. Decoded one at a time, as readers decode it, so a bad
    mask is a reason given, not a shard that fails to read."""
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):  # decode_png would take a JPEG or GIF too
        return "is not a PNG"
    try:
        mask_height, mask_width, channels = tf.io.decode_png(png, channels=0).shape
    except tf.errors.InvalidArgumentError as exc:
        return f"does not decode ({_clean(exc.message)})"
    if channels != 1:  # a palette or grey+alpha PNG decodes to 3 or 2
        return f"has {channels} channels, not one"
    if (mask_height, mask_width) != (height, width):
        return f"is {mask_width}x{mask_height}, its image {width}x{height}"
    return None


_SHOWN_PROBLEMS = 3  # a check's detail names the first few; the count covers them all


def _scan_masks(scan: ShardScan, pngs: tf.RaggedTensor, sizes: tf.Tensor) -> None:
    """Checks a scan batch's masks (per record) against its images' sizes (height, width); the
    batch's records follow the records already counted."""
    for number, (masks, (height, width)) in enumerate(zip(pngs.to_list(), sizes.numpy().tolist()),
                                                      scan.counts["records"] + 1):
        scan.counts["masks"] += len(masks)
        for i, png in enumerate(masks, 1):
            why = mask_problem(png, height, width)
            if why:
                scan.counts["bad_masks"] += 1
                if len(scan.mask_problems) < _SHOWN_PROBLEMS:
                    scan.mask_problems.append(f"{posixpath.basename(scan.path)} record {number} mask {i} {why}")


def _scan_fn(layout: reader.RecordLayout):
    """record → the few values the checks need; using the pixels keeps the decode from being pruned.
    Labels (and their texts) are lists: one per record, or a detection record's one per object."""
    text_key = layout.extras.get("object_text" if layout.box_keys else "label_text")
    sizes = _size_keys(layout)

    def scan(record: tf.Tensor) -> dict:
        parsed = layout.parse(record)
        image = layout.decode_image(parsed[layout.image_key])
        values = {"bytes": tf.strings.length(record, unit="BYTE"),
                  "label": tf.reshape(parsed[layout.label_key], [-1]),
                  "non_finite": _failed(tf.reduce_all(tf.math.is_finite(tf.cast(image, tf.float32))))}
        if text_key:
            values["label_text"] = tf.reshape(parsed[text_key], [-1])
        if sizes:
            shape = tf.shape(image, out_type=tf.int64)
            values["wrong_size"] = _failed(tf.reduce_all(tf.stack([tf.equal(parsed[key], shape[axis])
                                                                   for key, axis in sizes.items()])))
        if layout.box_keys:
            values.update(_object_values(parsed, layout))
        if layout.mask_key:  # decoded by `mask_problem`, one at a time
            values.update(masks=parsed[layout.mask_key], image_size=tf.shape(image)[:2])
        return values
    return scan


def _numpy(batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A scan batch as arrays; per-record lists (ragged, or dense with one value each) flattened."""
    return {key: (value.flat_values if isinstance(value, tf.RaggedTensor) else tf.reshape(value, [-1])).numpy()
            for key, value in batch.items()}


def _clean(message: str) -> str:
    """TF's error text without the graph-function and op names that eager iteration wraps it in."""
    message = re.sub(r"\{\{function_node [^}]*\}\}", "", message)
    message = re.sub(r"\s*\[Op:[^\]]*\].*$", "", message, flags=re.DOTALL)
    return " ".join(message.split())


def scan_shard(path: str, compression: str, layout: reader.RecordLayout) -> ShardScan:
    """Reads, CRC-checks, parses and decodes every record of one shard."""
    if not tf.io.gfile.exists(path):
        return ShardScan(path, error="missing: listed in metadata.json but not found")
    scan = ShardScan(path)
    records = tf.data.TFRecordDataset(path, compression_type=tf_compression_type(compression))
    batches = records.map(_scan_fn(layout), num_parallel_calls=tf.data.AUTOTUNE).ragged_batch(_SCAN_BATCH)
    try:
        for batch in batches:
            if "masks" in batch:
                _scan_masks(scan, batch.pop("masks"), batch.pop("image_size"))
            batch = _numpy(batch)
            labels, texts = batch.pop("label").tolist(), batch.pop("label_text", None)
            scan.labels.update(labels)
            if texts is not None and len(texts) == len(labels):
                scan.label_pairs.update(zip(labels, (text.decode("utf-8", "replace") for text in texts)))
            scan.counts["records"] += len(batch["bytes"])
            scan.counts.update({key: int(values.sum()) for key, values in batch.items()})
    except tf.errors.DataLossError as exc:
        scan.error = f"DataLossError: {_clean(exc.message)} (bad CRC or truncated: the file is damaged)"
    except tf.errors.OpError as exc:
        scan.error = f"{type(exc).__name__}: {_clean(exc.message)}"
    return scan


def _same_counts(name: str, found: Mapping[str, int], expected: Mapping[str, int]) -> Check:
    """A check that two {name: count} are equal; its detail lists the names whose counts differ."""
    differ = sorted(n for n in set(found) | set(expected) if found.get(n, 0) != expected.get(n, 0))
    return Check(dict(found) == dict(expected), name,
                 ", ".join(f"{n} {found.get(n, 0)} (metadata {expected.get(n, 0)})" for n in differ))


def _named_counts(labels: Mapping[int, int], label_map: Mapping[str, int]) -> dict[str, int]:
    """{class name: count}; an id label_map lacks as `<id N>`."""
    id_to_name = {i: n for n, i in label_map.items()}
    return {id_to_name.get(label, f"<id {label}>"): n for label, n in labels.items()}


def split_checks(name: str, info: SplitInfo, scans: Sequence[ShardScan], label_map: Mapping[str, int],
                 layout: reader.RecordLayout) -> list[Check]:
    """Checks one split's shards against metadata; pure, given the scans."""
    detection = bool(layout.box_keys)  # label_counts count objects, not records
    unit = "objects" if detection else "records"
    lengths = info.shard_lengths
    counted = layout.label_lists or sum(info.label_counts.values()) == info.num_examples
    checks = [Check.of(sum(lengths) == info.num_examples and counted, f"{name}: metadata is self-consistent",
                       f"sum(shard_lengths) {sum(lengths)}, label_counts sum {sum(info.label_counts.values())}, "
                       f"num_examples {info.num_examples}")]
    for scan, file, expected in zip(scans, info.files, lengths):
        records = scan.counts["records"]
        checks.append(Check(False, file, scan.error) if scan.error else
                      Check(records == expected, file,
                            f"{records} records" + ("" if records == expected else f", metadata says {expected}")))
    unreadable = sum(1 for scan in scans if scan.error)
    if unreadable:
        return [*checks, Check(False, f"{name}: totals", f"not compared, {unreadable} shard(s) unreadable")]
    totals = sum((scan.counts for scan in scans), collections.Counter())
    checks.append(Check.of(totals["records"] == info.num_examples, f"{name}: {totals['records']} records",
                           f"metadata num_examples {info.num_examples}"))
    labels = sum((scan.labels for scan in scans), collections.Counter())
    out_of_range = sum(n for label, n in labels.items() if label not in label_map.values())
    checks.append(Check.of(out_of_range == 0, f"{name}: label ids in label_map",
                           f"{out_of_range} {unit} with unknown label ids"))
    checks.append(_same_counts(f"{name}: {'object' if detection else 'label'} counts",
                               _named_counts(labels, label_map), info.label_counts))
    pairs = sum((scan.label_pairs for scan in scans), collections.Counter())
    if pairs:
        wrong = sum(n for (label, text), n in pairs.items() if label_map.get(text) != label)
        checks.append(Check.of(wrong == 0, f"{name}: label text agrees with label ids", f"{wrong} {unit} disagree"))
    if detection:  # one value per object in every list; boxes inside the image with min <= max
        checks.append(Check.of(not totals["bad_lengths"], f"{name}: per-object lists have one value per object",
                               f"{totals['bad_lengths']} records disagree"))
        checks.append(Check.of(not totals["bad_boxes"], f"{name}: boxes in [0, 1] with xmin <= xmax, ymin <= ymax",
                               f"{totals['bad_boxes']} boxes are not"))
    if layout.mask_key:
        shown = [problem for scan in scans for problem in scan.mask_problems][:_SHOWN_PROBLEMS]
        checks.append(Check.of(not totals["bad_masks"], f"{name}: {totals['masks']} instance masks decode "
                               "to one channel at their image's size",
                               f"{totals['bad_masks']} do not: " + "; ".join(shown)))
    checks.append(Check.of(totals["bytes"] == info.num_bytes, f"{name}: record bytes",
                           f"{totals['bytes']} read, metadata num_bytes {info.num_bytes}"))
    sizes = _size_keys(layout)
    if sizes:
        shape = ("the parse spec's shape " + "x".join(map(str, layout.shape)) if None not in layout.shape
                 else "each decoded image")
        checks.append(Check.of(not totals["wrong_size"], f"{name}: {', '.join(sizes)} agree with {shape}",
                               f"{totals['wrong_size']} records disagree"))
    if layout.pixel_dtype != tf.uint8:
        checks.append(Check.of(not totals["non_finite"], f"{name}: pixels finite",
                               f"{totals['non_finite']} images with NaN/inf"))
    return checks


def _uncompressed(stored: BinaryIO, compression: str) -> ContextManager[BinaryIO]:
    """The record stream index offsets count in; gzip decompressed as read (lines run forward)."""
    return gzip.GzipFile(fileobj=stored, mode="rb") if compression == "gzip" else contextlib.nullcontext(stored)


def index_check(output: str, name: str, info: SplitInfo, compression: str, image_key: Optional[str]) -> Check:
    """The split's record indexes (which incremental runs and random access trust) list every
    record once, in file order: each line frames the record after the previous line's, holding
    its content hash at the image bytes it names (`image_key`: None when records hold no hash)."""
    problems: list[str] = []
    lines = 0
    for shard, index in zip(info.files, info.index_files):
        try:
            entries = parse_index(files.read_bytes(join(output, index)).decode("ascii"))
            with files.open_read(join(output, shard)) as stored, _uncompressed(stored, compression) as handle:
                end = 0
                for number, entry in enumerate(entries, 1):
                    if entry.offset != end:
                        problems.append(f"{index} line {number}: offset {entry.offset}, but the record after the "
                                        f"previous line's starts at {end}")
                        break
                    data = tfrecord.read_record_at(handle, entry.offset, entry.length)
                    end = entry.offset + entry.length
                    if image_key and not locates_image(data, entry.image_offset, entry.image_length, entry.sha256,
                                                                 image_key):
                        problems.append(f"{index} line {number}: the record there does not hold content "
                                        f"{entry.sha256[:12]}... at the image bytes it names")
                else:  # every line was read: the last must end the shard
                    handle.seek(end)
                    if handle.read(1):
                        problems.append(f"{index}: {shard} holds records after the one its last line frames")
            lines += len(entries)
        # a malformed line or a bad frame is a ValueError; a damaged gzip stream an OSError, EOFError or zlib.error
        except (OSError, ValueError, EOFError, zlib.error) as exc:
            problems.append(f"{index} against {shard}: {exc}")
    if not problems and lines != info.num_examples:
        problems.append(f"{lines} index lines for {info.num_examples} examples")
    return Check.of(not problems, f"{name}: record index matches the shards", "; ".join(problems[:3]))


def label_map_check(label_map: Mapping[str, int]) -> Check:
    """Ids must be distinct; they need not be 0..n-1 (a manifest may label with its own integers)."""
    ids = sorted(label_map.values())
    return Check.of(len(set(ids)) == len(ids), f"label_map: {len(ids)} classes", f"two classes share an id: {ids}")


def label_map_files_check(output: str, label_map: Mapping[str, int]) -> Check:
    """A detection dataset's label_map.pbtxt and label_map.csv, which the OD API and Model Garden
    read instead of metadata.json, must say what its label_map says."""
    problems = []
    for name, text in ((PBTXT_FILE, label_map_pbtxt(label_map)), (CSV_FILE, label_map_csv(label_map))):
        path = posixpath.join(output.rstrip("/"), name)
        if not tf.io.gfile.exists(path):
            problems.append(f"{name} is missing")
            continue
        with tf.io.gfile.GFile(path, "rb") as handle:
            if handle.read() != text.encode("utf-8"):
                problems.append(f"{name} differs from metadata.json's label_map")
    return Check.of(not problems, f"{PBTXT_FILE} and {CSV_FILE} agree with label_map", "; ".join(problems))


def _differences(found: Any, expected: Any, where: str) -> list[str]:
    """`where.key found (config gives expected)` for every leaf where two JSON values differ."""
    if isinstance(found, Mapping) and isinstance(expected, Mapping):
        return [line for key in sorted(set(found) | set(expected))
                for line in _differences(found.get(key), expected.get(key), f"{where}.{key}")]
    return [] if found == expected else [f"{where} {found!r} (config gives {expected!r})"]


def description_check(metadata: DatasetMetadata) -> Check:
    """The parse spec (features) and image section must be what the recorded config gives: readers
    take shape, dtype and normalization from them, and an edit that keeps the element count
    still reads every record."""
    name = "features and image agree with the recorded config"
    try:  # the run's specs, from metadata.json's config (JSON lists back to tuples)
        image = ImageSpec(**{key: tuple(value) if isinstance(value, list) else value
                             for key, value in metadata.config["image"].items()})
        keys = FeatureKeys(**metadata.config["features"])
    except (KeyError, TypeError, ValueError) as exc:
        return Check(False, name, f"config.image or config.features is not a valid config: {type(exc).__name__}: {exc}")
    described = (detection_feature_spec(image, keys, masks_recorded(metadata.config),
                                        voc_fields_recorded(metadata.config)) if metadata.objects is not None
                 else feature_spec(image, keys, bool((metadata.config.get("input") or {}).get("multi_label"))))
    differences = (_differences(metadata.features, described, "features")
                   + _differences(metadata.image, image_description(image), "image"))
    return Check(not differences, name, "; ".join(differences[:3]))


def unlisted_shards(output: str, metadata: DatasetMetadata) -> list[str]:
    """Shard-like files in the folder that metadata.json does not list (readers that glob would read them)."""
    present = {name.rstrip("/") for name in tf.io.gfile.listdir(output)}  # literally: `out[1]` is no pattern
    return sorted(n for n in present - set(metadata.shard_files) if parse_shard_file_name(n))


@dataclasses.dataclass
class DeadLetterCounts:
    """The dead-letter rows: inputs rejected per split and per error class, and (detection) the
    objects and annotation entries dropped per error class (stage "object", not inputs)."""

    by_split: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    by_error: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    objects: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    problems: list[str] = dataclasses.field(default_factory=list)


def dead_letter_counts(output: str, metadata: DatasetMetadata) -> DeadLetterCounts:
    """What the dead-letter files metadata lists hold, and what is wrong with them."""
    counts = DeadLetterCounts()
    for name in metadata.error_files:
        path = posixpath.join(output.rstrip("/"), name)
        if not tf.io.gfile.exists(path):
            counts.problems.append(f"{name} is listed in metadata.json but missing")
            continue
        with tf.io.gfile.GFile(path, "rb") as handle:  # bytes: a line that is not UTF-8 is a bad row, not a crash
            previous = b""
            for number, line in enumerate(handle, 1):
                if line < previous:
                    counts.problems.append(f"{name} line {number} is out of order (imgrec writes the rows sorted)")
                previous = line
                try:
                    row = json.loads(line.decode("utf-8"))
                    error, split = row["error"], row.get("split")
                except (ValueError, KeyError, TypeError):
                    error = split = None
                if not isinstance(error, str) or not isinstance(split, (str, type(None))):
                    counts.problems.append(f"{name} line {number} is not a dead-letter row")
                elif row.get("stage") == OBJECT_STAGE:
                    counts.objects[error] += 1
                else:
                    counts.by_split[split] += 1
                    counts.by_error[error] += 1
    return counts


def accounting_checks(metadata: DatasetMetadata, dead_letters: DeadLetterCounts) -> list[Check]:
    """Every input was written or rejected, and the dead letters say which and why; a detection
    dataset's objects were written (the splits' object counts, each checked against the records)
    or dropped (the dead letters of stage "object"), per error class."""
    by_split, by_error, problems = dead_letters.by_split, dead_letters.by_error, dead_letters.problems
    inputs = metadata.inputs
    written = sum(info.num_examples for info in metadata.splits.values())
    checks = [
        Check.of(inputs.total == inputs.written + inputs.rejected, f"inputs: {inputs.total} = written + rejected",
                 f"{inputs.written} written + {inputs.rejected} rejected"),
        Check.of(inputs.written == written, f"inputs: {inputs.written} written = examples in the splits",
                 f"the splits hold {written}"),
        Check.of(not problems, "dead letters are readable and sorted", "; ".join(problems[:3])),
        Check.of(sum(by_error.values()) == inputs.rejected, f"inputs: {inputs.rejected} rejected = dead-letter rows",
                 f"{sum(by_error.values())} rows"),
        _same_counts("rejected_by_error matches the dead letters", by_error, inputs.rejected_by_error),
        Check.of(sum(inputs.rejected_by_error.values()) == inputs.rejected, "rejected_by_error sums to rejected",
                 f"{sum(inputs.rejected_by_error.values())} != {inputs.rejected}"),
    ]
    for name, info in metadata.splits.items():
        checks.append(Check.of(by_split.get(name, 0) == info.rejected,
                               f"{name}: {info.rejected} rejected = dead letters",
                               f"{by_split.get(name, 0)} rows name split {name}"))
    objects = metadata.objects
    if objects is None:
        return checks
    in_splits = sum((collections.Counter(info.label_counts) for info in metadata.splits.values()),
                    collections.Counter())  # + keeps positive counts only
    return [*checks, _same_counts(f"objects: {sum(objects.written.values())} written = objects in the splits",
                                  objects.written, in_splits),
            _same_counts(f"objects: {sum(objects.dropped.values())} dropped = object dead-letter rows",
                         dead_letters.objects, objects.dropped)]


# --------------------------------------------------------------------------------------------
# Samples and pictures (I/O)


def read_samples(files: Sequence[str], metadata: DatasetMetadata, layout: reader.RecordLayout,
                 count: int) -> tuple[list[np.ndarray], list[str]]:
    """Up to `count` display-ready images and label texts from the start of the given shards
    (`layout`: with metadata, for the label texts)."""
    if count <= 0 or not files:
        return [], []
    dataset = reader.build_dataset(files, layout, compression=metadata.compression,
                                   batch_size=None, with_metadata=True, num_parallel_reads=1).take(count)
    image_config = metadata.config.get("image") or {}
    normalize = image_config.get("normalize", "unknown")
    mean, std = image_config.get("mean", reader.DEFAULT_MEAN), image_config.get("std", reader.DEFAULT_STD)
    id_to_name = {i: n for n, i in metadata.label_map.items()}

    def names(ids: np.ndarray) -> str:
        return ", ".join(id_to_name.get(int(i), f"id {int(i)}") for i in np.atleast_1d(ids))

    images, captions = [], []
    try:
        for image, label, extras in dataset.as_numpy_iterator():
            image = to_display_uint8(image, normalize, mean, std)
            if isinstance(label, dict):  # detection: the boxes drawn, the classes as the caption
                images.append(draw_boxes(image, label["boxes"]))
                captions.append(names(label["classes"]) or "no objects")
                continue
            images.append(image)
            text = extras.get("label_text")
            if isinstance(text, np.ndarray):  # multi-label: its labels' texts
                text = b", ".join(text.tolist())
            text = text.decode("utf-8", "replace") if text is not None else ""
            captions.append(text or names(label) or "no labels")  # no texts recorded: the label map's
    except tf.errors.OpError:
        pass  # already reported by the checks; show what could be read
    return images, captions


def _counts_table(counts: Mapping[str, Mapping[str, int]], classes: Sequence[str]) -> str:
    splits = list(counts)
    rows = [[c, *(counts[s].get(c, 0) for s in splits)] for c in classes]
    rows.append(["total", *(sum(counts[s].values()) for s in splits)])
    return format_table(["class", *splits], rows, indent="  ")


# --------------------------------------------------------------------------------------------
# Command line


def verify_dataset(output: str, samples: int, out_dir: Optional[str], stream: TextIO) -> bool:
    """Runs every check, prints the report, writes the PNGs; True when every check passed."""
    metadata = reader.read_metadata(output)
    published = reader.PublishedRun(output, metadata.run.get("run_id"))
    layout = reader.layout_from_metadata(metadata, with_metadata=True)
    label_map = metadata.label_map
    classes = metadata.class_names()
    shape = "x".join("?" if d is None else str(d) for d in layout.shape)
    say(f"imgrec dataset {output}: format {metadata.format_version}, {metadata.image.get('encoding')} "
        f"{layout.pixel_dtype.name} {shape}, compression {metadata.compression}, "
        f"{len(classes)} classes", stream)
    checks = [label_map_check(label_map), description_check(metadata)]
    if metadata.objects is not None:
        checks.append(label_map_files_check(output, label_map))
    checks.extend(accounting_checks(metadata, dead_letter_counts(output, metadata)))
    say("\n".join(check.line() for check in checks), stream)
    counts: dict[str, dict[str, int]] = {}
    sections = []
    for name, info in metadata.splits.items():
        say(f"\nsplit {name}: {info.num_examples} examples in {info.num_shards} shard(s)", stream)
        paths = reader.shard_paths(output, metadata, name)
        scans = [scan_shard(path, metadata.compression, layout) for path in paths]
        split_result = split_checks(name, info, scans, label_map, layout)
        if info.index_files:
            roles = metadata.role_keys()
            split_result.append(index_check(output, name, info, metadata.compression,
                                            roles["image"] if "content_hash" in roles else None))
        say("\n".join(check.line() for check in split_result), stream)
        checks.extend(split_result)
        counts[name] = _named_counts(sum((scan.labels for scan in scans), collections.Counter()), label_map)
        good = [path for path, scan in zip(paths, scans) if not scan.error]
        images, captions = read_samples(good, metadata, layout, samples)
        sections.append((f"{name}: {len(images)} of {info.num_examples} examples", images, captions))
    extra = unlisted_shards(output, metadata)
    if extra:
        say(f"\n  WARNING shard files not listed in metadata.json (ignored by load_dataset, read by globs): "
            f"{', '.join(extra)}", stream)
    say(f"\nclass counts ({'objects' if metadata.objects is not None else 'records'} read):", stream)
    say(_counts_table(counts, classes + sorted(set().union(*counts.values()) - set(classes))), stream)
    out_dir = out_dir or output
    pictures = {CONTACT_SHEET: draw_contact_sheet(sections)} if samples > 0 else {}
    unit = "objects" if metadata.objects is not None else "examples"
    pictures[CLASS_COUNTS] = draw_bar_chart(counts, classes, title=f"{unit} per class: {output}")
    try:
        tf.io.gfile.makedirs(out_dir)
        for file_name, rgb in pictures.items():
            path = posixpath.join(out_dir, file_name)
            try:
                tf.io.write_file(path, tf.io.encode_png(rgb))
            except tf.errors.OpError:  # a full disk: no cut picture left behind (a folder in its place stays)
                with contextlib.suppress(tf.errors.OpError):
                    if not tf.io.gfile.isdir(path):
                        tf.io.gfile.remove(path)
                raise
        say(f"\nwrote {', '.join(posixpath.join(out_dir, file_name) for file_name in pictures)}", stream)
    except tf.errors.OpError as exc:  # a full disk, a folder in the way: the checks' report still stands
        checks.append(Check(False, f"pictures written to {out_dir}", f"{type(exc).__name__}: {_clean(exc.message)}"))
    try:
        published.check()
    except reader.DatasetChanged:  # what failed may be the new dataset's files, checked against the old
        checks.insert(0, Check(False, "not replaced while verified", f"another run replaced {output} meanwhile (its "
                                      f"{METADATA_FILE} no longer names run {published.run_id}): verify it again"))
    failed = [check for check in checks if not check.ok]
    if failed:
        say("\n".join([f"FAILED: {len(failed)} of {len(checks)} checks failed:", *(c.line() for c in failed)]), stream)
    else:
        say(f"OK: all {len(checks)} checks passed", stream)
    return not failed


def check_out_dir(out_dir: Optional[str]) -> None:
    """Refuses an --out that cannot become a folder (it, or the nearest existing path above it, is
    a file) before the dataset is read, not after every check."""
    path = (out_dir or "").rstrip("/")
    try:
        while path and not tf.io.gfile.exists(path):
            parent = posixpath.dirname(path)
            path = "" if parent == path else parent
    except tf.errors.OpError as exc:  # s3://: not in TensorFlow since 2.6; gs:// it cannot reach
        raise UsageError(f"--out={out_dir}: TensorFlow cannot write there ({exc.message.splitlines()[0]})") from None
    if path and not tf.io.gfile.isdir(path):
        raise UsageError(f"--out={out_dir}: {path} is a file, not a folder for the PNGs")


def main(argv: Optional[Sequence[str]] = None, stream: Optional[TextIO] = None,
         prog: str = "python -m pipeline.read.verify") -> int:
    """0: every check passed; 1: some check failed; 2: bad usage or not a readable imgrec dataset."""
    stream = stream or sys.stdout
    parser = CommandLineParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("output", help="A finished imgrec dataset folder (any TF filesystem, e.g. gs://).")
    parser.add_argument("--samples", type=int, default=8,
                        help="Sample images per split in the contact sheet (0: none).")
    parser.add_argument("--out", help="Where to write the PNGs (default: OUTPUT).")
    try:
        args = parser.parse_args(argv)
        if args.samples < 0:
            raise UsageError(f"--samples={args.samples}: must be 0 or more")
        check_out_dir(args.out)
        with imports_frozen():  # the imports' objects, TensorFlow's too: 0.9 s of a 2,000-image check
            ok = verify_dataset(args.output, args.samples, args.out, stream)
    except UsageError as exc:
        say(f"imgrec: error: {exc}")
        return exc.exit_code
    except (reader.NotAnImgrecDataset, reader.UnsupportedDataset) as exc:
        say(f"FAILED: {exc}", stream)
        say(f"imgrec: error: {exc}")
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    exit_quietly(main())
