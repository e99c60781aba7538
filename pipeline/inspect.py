"""`python -m pipeline.inspect OUTPUT [--samples N] [--out DIR]`: verify a finished dataset.

Reads every shard that metadata.json lists, end to end: TFRecord CRCs are checked by TensorFlow
(a bad one raises DataLossError), every record is parsed with the metadata's parse spec and its
image decoded, and what was found is compared with what metadata.json claims (per-file record
counts, per-split totals, label counts and record bytes). Prints OK/FAILED per check and exits
non-zero on any failure, so it can gate a training job or a copy to another bucket.

It also draws `contact_sheet.png` (sample images per split with their labels) and
`class_counts.png` (class counts per split) with OpenCV, for a quick look by a human. The
drawing functions are pure (arrays in, an RGB array out) and kept apart from the I/O.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # a CLI: TF's start-up chatter hides the report

import argparse
import collections
import dataclasses
import posixpath
import re
import sys
from typing import Mapping, Optional, Sequence, TextIO

import cv2
import numpy as np
import tensorflow as tf

from pipeline import reader

CONTACT_SHEET = "contact_sheet.png"
CLASS_COUNTS = "class_counts.png"
_SCAN_BATCH = 256
_SHARD_PATTERN = "*.tfrecord*"

# --------------------------------------------------------------------------------------------
# Drawing: pure functions, RGB uint8 arrays in and out.

_FONT = cv2.FONT_HERSHEY_SIMPLEX
_BACKGROUND = (255, 255, 255)
_TILE_BACKGROUND = (230, 230, 230)
_TEXT = (20, 20, 20)
_MUTED = (110, 110, 110)
# One color per split (RGB), cycled when there are more splits.
_SPLIT_COLORS = ((66, 133, 244), (234, 134, 0), (52, 168, 83), (171, 71, 188), (219, 68, 55), (0, 172, 193))


def _ascii(text: str) -> str:
    """Hershey fonts only draw ASCII; anything else would come out as garbage glyphs."""
    return text.encode("ascii", "replace").decode("ascii")


def _text_width(text: str, scale: float, thickness: int = 1) -> int:
    return cv2.getTextSize(text, _FONT, scale, thickness)[0][0]


def _fit_text(text: str, max_width: int, scale: float, thickness: int = 1) -> str:
    """The text, shortened with a trailing '~' until it fits `max_width` pixels."""
    text = _ascii(text)
    if _text_width(text, scale, thickness) <= max_width:
        return text
    while text and _text_width(text + "~", scale, thickness) > max_width:
        text = text[:-1]
    return text + "~"


def _put_text(canvas: np.ndarray, text: str, x: int, baseline: int, scale: float,
              color: tuple[int, int, int] = _TEXT, thickness: int = 1) -> None:
    cv2.putText(canvas, text, (int(x), int(baseline)), _FONT, scale, color, thickness, cv2.LINE_AA)


def _as_rgb_uint8(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise ValueError(f"images to draw must be uint8 (see to_display_uint8); got {image.dtype}")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise ValueError(f"images to draw must be HxW, HxWx1, HxWx3 or HxWx4; got {image.shape}")
    if image.shape[2] == 1:
        return np.repeat(image, 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3])


def _fit_tile(image: np.ndarray, tile: int) -> np.ndarray:
    """The image scaled to fit a tile x tile square (aspect kept), centered on a grey tile."""
    image = _as_rgb_uint8(image)
    height, width = image.shape[:2]
    scale = tile / max(height, width, 1)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    interpolation = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    resized = cv2.resize(image, size, interpolation=interpolation)
    out = np.full((tile, tile, 3), _TILE_BACKGROUND, np.uint8)
    top, left = (tile - size[1]) // 2, (tile - size[0]) // 2
    out[top:top + size[1], left:left + size[0]] = resized
    return out


def draw_contact_sheet(sections: Sequence[tuple[str, Sequence[np.ndarray], Sequence[str]]],
                       tile: int = 160, columns: int = 8) -> np.ndarray:
    """One block per (title, images, captions): a title line, then the images in a grid with
    each caption under its image. Images are uint8 RGB/grey of any size; returns RGB uint8."""
    margin, gap, header, caption = 10, 8, 30, 22
    widest = max([len(images) for _, images, _ in sections] + [1])
    columns = max(1, min(columns, widest))
    width = 2 * margin + columns * tile + (columns - 1) * gap
    heights = []
    for _, images, _ in sections:
        rows = max(1, -(-len(images) // columns))
        heights.append(header + rows * (tile + caption) + (rows - 1) * gap + gap)
    canvas = np.full((margin + sum(heights) + margin, width, 3), _BACKGROUND, np.uint8)
    top = margin
    for (title, images, captions), block_height in zip(sections, heights):
        if len(captions) != len(images):
            raise ValueError(f"section {title!r}: {len(images)} images but {len(captions)} captions")
        _put_text(canvas, _fit_text(title, width - 2 * margin, 0.7, 2), margin, top + 22, 0.7, thickness=2)
        if not images:
            _put_text(canvas, "(no images)", margin, top + header + 20, 0.5, _MUTED)
        for i, (image, text) in enumerate(zip(images, captions)):
            row, col = divmod(i, columns)
            x, y = margin + col * (tile + gap), top + header + row * (tile + caption + gap)
            canvas[y:y + tile, x:x + tile] = _fit_tile(image, tile)
            _put_text(canvas, _fit_text(text, tile, 0.5), x, y + tile + 16, 0.5)
        top += block_height
    return canvas


def draw_bar_chart(counts: Mapping[str, Mapping[str, int]], classes: Optional[Sequence[str]] = None,
                   bar_height: int = 18, bar_width: int = 220,
                   title: str = "examples per class") -> np.ndarray:
    """Horizontal bars, one panel per split ({split: {class: count}}), one row per class.

    Each panel is scaled to its own largest class: splits differ in size by design, and the
    point is to see imbalance between classes within a split. Returns RGB uint8.
    """
    splits = list(counts)
    if classes is None:
        classes = sorted({name for per_class in counts.values() for name in per_class})
    margin, gap, header, row = 10, 16, 26, bar_height + 6
    scale = 0.45
    label_width = min(220, max([_text_width(_ascii(c), scale) for c in classes] + [40])) + 8
    number_width = _text_width("0000000", scale)
    panel_width = bar_width + number_width
    width = 2 * margin + label_width + max(1, len(splits)) * (panel_width + gap)
    top = margin + 34 + header
    height = top + max(1, len(classes)) * row + margin
    canvas = np.full((height, width, 3), _BACKGROUND, np.uint8)
    _put_text(canvas, _fit_text(title, width - 2 * margin, 0.7, 2), margin, margin + 22, 0.7, thickness=2)
    for i, name in enumerate(classes):
        baseline = top + i * row + bar_height // 2 + 5
        _put_text(canvas, _fit_text(name, label_width - 8, scale), margin, baseline, scale)
    for s, split in enumerate(splits):
        per_class = counts[split]
        color = _SPLIT_COLORS[s % len(_SPLIT_COLORS)]
        left = margin + label_width + s * (panel_width + gap)
        total = sum(per_class.get(c, 0) for c in classes)
        _put_text(canvas, _fit_text(f"{split} ({total})", panel_width, 0.55, 1), left, top - 10, 0.55, color, 1)
        cv2.line(canvas, (left, top - 4), (left, height - margin), _MUTED, 1)
        largest = max([per_class.get(c, 0) for c in classes] + [1])
        for i, name in enumerate(classes):
            n = per_class.get(name, 0)
            y = top + i * row
            length = round(bar_width * n / largest) if n else 0
            if length:
                cv2.rectangle(canvas, (left + 1, y), (left + max(length, 2), y + bar_height), color, cv2.FILLED)
            _put_text(canvas, str(n), left + max(length, 1) + 5, y + bar_height // 2 + 5, scale,
                      _TEXT if n else _MUTED)
    if not classes:
        _put_text(canvas, "(no classes)", margin, top + 14, scale, _MUTED)
    return canvas


def to_display_uint8(image: np.ndarray, normalize: str = "none",
                     mean: Sequence[float] = reader.DEFAULT_MEAN,
                     std: Sequence[float] = reader.DEFAULT_STD) -> np.ndarray:
    """Stored pixels → uint8 RGB for drawing, undoing the write-time normalization."""
    image = np.asarray(image)
    if image.dtype == np.uint8:
        return image
    pixels = image.astype(np.float32)
    if normalize == "mean_std":
        pixels = pixels * np.asarray(std, np.float32) + np.asarray(mean, np.float32)
    elif normalize != "unit":  # unknown: stretch whatever range there is
        low, high = float(np.min(pixels)), float(np.max(pixels))
        pixels = (pixels - low) / (high - low) if high > low else np.zeros_like(pixels)
    return np.clip(np.rint(pixels * 255.0), 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------------------------
# Verification


@dataclasses.dataclass(frozen=True)
class Check:
    ok: bool
    name: str
    detail: str = ""

    def line(self) -> str:
        return f"  {'OK' if self.ok else 'FAILED':<7} {self.name}" + (f": {self.detail}" if self.detail else "")


@dataclasses.dataclass
class ShardScan:
    """What reading one shard found."""

    path: str
    records: int = 0
    record_bytes: int = 0
    labels: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    # (label id, label text) pairs, to check the text agrees with label_map.
    label_pairs: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    non_finite: int = 0
    error: Optional[str] = None


def _scan_fn(layout: reader.RecordLayout):
    """record → the few values the checks need; using the pixels keeps the decode from being pruned."""
    text_key = layout.extras.get("label_text")

    def scan(record: tf.Tensor) -> dict:
        parsed = tf.io.parse_single_example(record, layout.parse_spec)
        image = layout.decode_image(parsed[layout.image_key])
        values = {"bytes": tf.strings.length(record, unit="BYTE"),
                  "label": parsed[layout.label_key],
                  "finite": tf.reduce_all(tf.math.is_finite(tf.cast(image, tf.float32)))}
        if text_key:
            values["label_text"] = parsed[text_key]
        return values
    return scan


def _clean(message: str) -> str:
    """TF's error text without the graph-function and op names that eager iteration wraps it in."""
    message = re.sub(r"\{\{function_node [^}]*\}\}", "", message)
    message = re.sub(r"\s*\[Op:[^\]]*\].*$", "", message, flags=re.DOTALL)
    return " ".join(message.split())


def scan_shard(path: str, compression: str, layout: reader.RecordLayout) -> ShardScan:
    """Reads, CRC-checks, parses and decodes every record of one shard."""
    scan = ShardScan(path)
    if not tf.io.gfile.exists(path):
        scan.error = "missing: listed in metadata.json but not found"
        return scan
    records = tf.data.TFRecordDataset(path, compression_type=reader.compression_type(compression))
    batches = records.map(_scan_fn(layout), num_parallel_calls=tf.data.AUTOTUNE).batch(_SCAN_BATCH)
    try:
        for batch in batches.as_numpy_iterator():
            scan.records += len(batch["label"])
            scan.record_bytes += int(batch["bytes"].sum())
            scan.labels.update(batch["label"].tolist())
            scan.non_finite += int((~batch["finite"]).sum())
            if "label_text" in batch:
                scan.label_pairs.update(zip(batch["label"].tolist(),
                                            (t.decode("utf-8", "replace") for t in batch["label_text"])))
    except tf.errors.DataLossError as exc:
        scan.error = f"DataLossError: {_clean(exc.message)} (bad CRC or truncated: the file is damaged)"
    except tf.errors.OpError as exc:
        scan.error = f"{type(exc).__name__}: {_clean(exc.message)}"
    return scan


def _diff(found: Mapping[str, int], expected: Mapping[str, int]) -> str:
    names = sorted(set(found) | set(expected))
    return ", ".join(f"{n} {found.get(n, 0)} (metadata {expected.get(n, 0)})"
                     for n in names if found.get(n, 0) != expected.get(n, 0))


def split_checks(name: str, info: Mapping, scans: Sequence[ShardScan], label_map: Mapping[str, int],
                 float_pixels: bool) -> list[Check]:
    """Checks one split's shards against metadata; pure, given the scans."""
    checks = []
    files, lengths = list(info["files"]), list(info["shard_lengths"])
    consistent = len(files) == len(lengths) == info["num_shards"] and sum(lengths) == info["num_examples"] \
        and sum(info["label_counts"].values()) == info["num_examples"]
    checks.append(Check(consistent, f"{name}: metadata is self-consistent",
                        "" if consistent else f"{len(files)} files, {len(lengths)} shard_lengths, num_shards "
                        f"{info['num_shards']}, sum(shard_lengths) {sum(lengths)}, label_counts sum "
                        f"{sum(info['label_counts'].values())}, num_examples {info['num_examples']}"))
    for scan, file, expected in zip(scans, files, lengths):
        if scan.error:
            checks.append(Check(False, file, scan.error))
        else:
            checks.append(Check(scan.records == expected, file,
                                f"{scan.records} records" + ("" if scan.records == expected
                                                              else f", metadata says {expected}")))
    if any(scan.error for scan in scans):
        bad = sum(1 for scan in scans if scan.error)
        checks.append(Check(False, f"{name}: totals", f"not compared, {bad} shard(s) unreadable"))
        return checks
    total = sum(scan.records for scan in scans)
    checks.append(Check(total == info["num_examples"], f"{name}: {total} records",
                        "" if total == info["num_examples"] else f"metadata num_examples {info['num_examples']}"))
    id_to_name = {i: n for n, i in label_map.items()}
    labels = sum((scan.labels for scan in scans), collections.Counter())
    out_of_range = sum(n for label, n in labels.items() if label not in id_to_name)
    checks.append(Check(out_of_range == 0, f"{name}: label ids in label_map",
                        f"{out_of_range} records with unknown label ids" if out_of_range else ""))
    found = {id_to_name.get(label, f"<id {label}>"): n for label, n in labels.items()}
    expected = dict(info["label_counts"])
    checks.append(Check(found == expected, f"{name}: label counts", _diff(found, expected)))
    pairs = sum((scan.label_pairs for scan in scans), collections.Counter())
    if pairs:
        wrong = sum(n for (label, text), n in pairs.items() if label_map.get(text) != label)
        checks.append(Check(wrong == 0, f"{name}: label text agrees with label ids",
                            f"{wrong} records disagree" if wrong else ""))
    record_bytes = sum(scan.record_bytes for scan in scans)
    if "num_bytes" in info:
        checks.append(Check(record_bytes == info["num_bytes"], f"{name}: record bytes",
                            "" if record_bytes == info["num_bytes"]
                            else f"{record_bytes} read, metadata num_bytes {info['num_bytes']}"))
    if float_pixels:
        non_finite = sum(scan.non_finite for scan in scans)
        checks.append(Check(non_finite == 0, f"{name}: pixels finite",
                            f"{non_finite} images with NaN/inf" if non_finite else ""))
    return checks


def label_map_check(label_map: Mapping[str, int]) -> Check:
    """Ids must be distinct; they need not be 0..n-1 (a manifest may label with its own integers)."""
    ids = sorted(label_map.values())
    ok = len(set(ids)) == len(ids)
    return Check(ok, f"label_map: {len(ids)} classes", "" if ok else f"two classes share an id: {ids}")


def unlisted_shards(output: str, metadata: Mapping) -> list[str]:
    """Shard-like files in the folder that metadata.json does not list (readers that glob would read them)."""
    listed = {f for info in metadata["splits"].values() for f in info["files"]}
    present = {posixpath.basename(p) for p in tf.io.gfile.glob(posixpath.join(output.rstrip("/"), _SHARD_PATTERN))}
    return sorted(present - listed)


# --------------------------------------------------------------------------------------------
# Samples and pictures (I/O)


def read_samples(files: Sequence[str], metadata: Mapping, count: int) -> tuple[list[np.ndarray], list[str]]:
    """Up to `count` display-ready images and label texts from the start of the given shards."""
    if count <= 0 or not files:
        return [], []
    layout = reader.layout_from_metadata(metadata, with_metadata=True)
    dataset = reader.build_dataset(files, layout, compression=metadata.get("compression", "none"),
                                   batch_size=None, with_metadata=True, num_parallel_reads=1).take(count)
    image_config = (metadata.get("config") or {}).get("image") or {}
    normalize = image_config.get("normalize", "unknown")
    mean, std = image_config.get("mean", reader.DEFAULT_MEAN), image_config.get("std", reader.DEFAULT_STD)
    id_to_name = {i: n for n, i in metadata["label_map"].items()}
    images, captions = [], []
    try:
        for image, label, extras in dataset.as_numpy_iterator():
            images.append(to_display_uint8(image, normalize, mean, std))
            text = extras["label_text"].decode("utf-8", "replace") if "label_text" in extras else None
            captions.append(text or id_to_name.get(int(label), f"id {int(label)}"))
    except tf.errors.OpError:
        pass  # already reported by the checks; show what could be read
    return images, captions


def write_png(path: str, rgb: np.ndarray) -> None:
    ok, buffer = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    if not ok:
        raise RuntimeError(f"OpenCV could not encode {path}")
    with tf.io.gfile.GFile(path, "wb") as handle:
        handle.write(buffer.tobytes())


def _counts_table(counts: Mapping[str, Mapping[str, int]], classes: Sequence[str]) -> str:
    splits = list(counts)
    rows = [["class", *splits]] + [[c, *(str(counts[s].get(c, 0)) for s in splits)] for c in classes]
    rows.append(["total", *(str(sum(counts[s].values())) for s in splits)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                                      for i, (cell, w) in enumerate(zip(r, widths))) for r in rows)


# --------------------------------------------------------------------------------------------
# Command line


def inspect_dataset(output: str, samples: int, out_dir: Optional[str], stream: TextIO) -> bool:
    """Runs every check, prints the report, writes the PNGs; True when every check passed."""
    metadata = reader.read_metadata(output)
    layout = reader.layout_from_metadata(metadata, with_metadata=True)
    compression = metadata.get("compression", "none")
    label_map = metadata["label_map"]
    classes = [name for name, _ in sorted(label_map.items(), key=lambda item: item[1])]
    image = metadata.get("image", {})
    print(f"imgrec dataset {output}: format {metadata['format_version']}, {image.get('encoding')} "
          f"{layout.pixel_dtype.name} {'x'.join(map(str, layout.shape))}, compression {compression}, "
          f"{len(classes)} classes", file=stream)
    checks = [label_map_check(label_map)]
    print(checks[0].line(), file=stream)
    counts: dict[str, dict[str, int]] = {}
    sections = []
    id_to_name = {i: n for n, i in label_map.items()}
    for name, info in metadata["splits"].items():
        print(f"\nsplit {name}: {info['num_examples']} examples in {len(info['files'])} shard(s)", file=stream)
        paths = reader.shard_paths(output, metadata, name)
        scans = [scan_shard(path, compression, layout) for path in paths]
        split_result = split_checks(name, info, scans, label_map, layout.pixel_dtype != tf.uint8)
        for check in split_result:
            print(check.line(), file=stream)
        checks.extend(split_result)
        labels = sum((scan.labels for scan in scans), collections.Counter())
        counts[name] = {id_to_name.get(label, f"<id {label}>"): n for label, n in labels.items()}
        good = [path for path, scan in zip(paths, scans) if not scan.error]
        images, captions = read_samples(good, metadata, samples)
        sections.append((f"{name}: {len(images)} of {info['num_examples']} examples", images, captions))
    extra = unlisted_shards(output, metadata)
    if extra:
        print(f"\n  WARNING shard files not listed in metadata.json (ignored by load_dataset, read by globs): "
              f"{', '.join(extra)}", file=stream)
    print("\nclass counts (records read):", file=stream)
    print(_counts_table(counts, classes + sorted(set().union(*counts.values()) - set(classes))), file=stream)
    out_dir = out_dir or output
    tf.io.gfile.makedirs(out_dir)
    written = []
    if samples > 0:
        written.append(posixpath.join(out_dir, CONTACT_SHEET))
        write_png(written[-1], draw_contact_sheet(sections))
    written.append(posixpath.join(out_dir, CLASS_COUNTS))
    write_png(written[-1], draw_bar_chart(counts, classes, title=f"examples per class: {output}"))
    print(f"\nwrote {', '.join(written)}", file=stream)
    failed = [check for check in checks if not check.ok]
    if failed:
        print(f"FAILED: {len(failed)} of {len(checks)} checks failed:", file=stream)
        for check in failed:
            print(check.line(), file=stream)
    else:
        print(f"OK: all {len(checks)} checks passed", file=stream)
    return not failed


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.inspect", description=__doc__.split("\n")[0])
    parser.add_argument("output", help="A finished imgrec dataset folder (any TF filesystem, e.g. gs://).")
    parser.add_argument("--samples", type=int, default=8, help="Sample images per split in the contact sheet (0: none).")
    parser.add_argument("--out", default=None, help="Where to write the PNGs (default: OUTPUT).")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None, stream: Optional[TextIO] = None) -> int:
    """0: every check passed; 1: some check failed; 2: not a readable imgrec dataset."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    stream = stream or sys.stdout
    try:
        ok = inspect_dataset(args.output, args.samples, args.out, stream)
    except (reader.NotAnImgrecDataset, reader.UnsupportedDataset) as exc:
        print(f"FAILED: {exc}", file=stream)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
