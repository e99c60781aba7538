"""Make a finished imgrec dataset loadable with `tfds.builder_from_directory(OUTPUT)`.

TFDS can read TFRecords it did not write if the folder also holds its own metadata
(dataset_info.json, features.json, <label>.labels.txt), which
`tfds.folder_dataset.write_metadata` writes. This module derives that metadata from our
metadata.json; the shards are never rewritten, so the TFDS features must parse our records as
they are:

- image, jpeg/png: `Image(shape, encoding_format)`; it stores the encoded bytes as one bytes
  feature and decodes with `tf.image.decode_image`, the same pixels our reader gets.
- image, raw: `Tensor(shape, dtype, encoding="bytes")`; it stores `ndarray.tobytes()` as one
  bytes feature and decodes with `tf.io.decode_raw` (little-endian) + reshape, which is exactly
  our raw layout (transforms/example.py), for uint8 and float32 alike.
- label: `ClassLabel(names)` when the ids are 0..n-1 and the names survive TFDS's
  labels.txt file (one stripped name per line); otherwise a plain int64 scalar.
- other string features: `Text`; int64/float32 features: scalars.

Keys are our feature keys unchanged. TFDS only splits keys on '/' for nested FeaturesDicts,
so a flat FeaturesDict with 'image' next to 'image/height' parses the records as written.

Refused: detection datasets (COCO, VOC: TFDS's detection features hold each object's box as one
[4] row of a Sequence, not as our four coordinate lists, so TFDS would need the records
rewritten), gzip shards (TFDS opens TFRecords without a compression type), split or file names
that TFDS's filename template cannot reproduce. Splits without shards are left out, because
TFDS requires every split to have files.

The export records the files it wrote in metadata.json (`exports`), so a run that replaces the
dataset removes them with the old shards (imgrec only ever removes files metadata.json lists):
re-run this export after such a run.
"""
from __future__ import annotations

from pipeline.standard_streams import open_closed_standard_streams, quiet_tensorflow, say

if __name__ == "__main__":
    open_closed_standard_streams()  # before the imports open files

quiet_tensorflow()

import dataclasses
import posixpath
import re
import sys
import uuid
from typing import Any, Mapping, Optional, Sequence

from pipeline.errors import CommandLineParser, OutputLocked, UsageError
from pipeline.interrupts import exit_quietly
from pipeline.lock import OutputLock
from pipeline.prepare import not_whole
from pipeline.reader import NotAnImgrecDataset, UnsupportedDataset, read_metadata
from transforms import files
from transforms.dataset_format import METADATA_FILE, DatasetMetadata, join

# `{SPLIT}` in TFDS's templates matches this; `.tfrecord` is literal so errors-*.jsonl and
# other files in OUTPUT are not mistaken for shards of a split named "errors".
_SPLIT_NAME = re.compile(r"(\w|-)+")
_DATASET_NAME = re.compile(r"[a-zA-Z]\w*")
FILENAME_TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.tfrecord"
FILE_SUFFIX = "tfrecord"
# Without these two, builder_from_directory refuses the folder (labels.txt files are harmless).
TFDS_FILES = ("dataset_info.json", "features.json")


class NotExportable(ValueError):
    """metadata.json describes records that TFDS cannot read as they are written."""


class DatasetDamaged(ValueError):
    """The shards are not what metadata.json says, which TFDS would take as it is."""


def damage(output_dir: str, metadata: DatasetMetadata) -> list[str]:
    """What keeps the shards from being what metadata.json says, found without reading records:
    missing files, counts that disagree, shard sizes and record indexes (TFDS takes the shard
    lengths as given). A damaged byte inside a record is left to `imgrec verify`, which reads
    every record, and to TFDS's own checksums."""
    listed = [f for info in metadata.splits.values() for f in (*info.files, *info.index_files)]
    missing = [f for f in listed if not files.exists(join(output_dir, f))]
    if missing:
        return [f"missing {', '.join(missing[:3])}"]
    problems = [f"split {name}: {info.num_examples} examples, but its shard_lengths add up to "
                f"{sum(info.shard_lengths)}" for name, info in metadata.splits.items()
                if sum(info.shard_lengths) != info.num_examples]
    damaged = not_whole(output_dir, metadata.to_json())
    if damaged:
        problems.append(f"not what {METADATA_FILE} says (cut short or appended to): {', '.join(damaged[:3])}")
    return problems


def _tfds() -> Any:
    """Imported lazily: tensorflow-datasets is an optional extra (`pip install .[tfds]`)."""
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise NotExportable("tensorflow-datasets is not installed; pip install 'imgrec[tfds]'") from error
    return tfds


def class_names(label_map: Mapping[str, int]) -> Optional[list[str]]:
    """Names ordered by id if `ClassLabel` can represent them faithfully, else None.

    ClassLabel maps names to ids by position, so the ids must be exactly 0..n-1; its names are
    stored one per line and read back stripped, so names with line breaks or surrounding
    blanks would come back different.
    """
    by_id = sorted(label_map.items(), key=lambda item: item[1])
    if [label_id for _, label_id in by_id] != list(range(len(by_id))):
        return None
    names = [name for name, _ in by_id]
    if any(not name or name != name.strip() or len(name.splitlines()) != 1 for name in names):
        return None
    return names


def feature_connectors(metadata: DatasetMetadata) -> dict[str, Any]:
    """{our feature key: TFDS feature} for every feature metadata.json lists."""
    import numpy as np

    if metadata.objects is not None:
        raise NotExportable("detection datasets (COCO, VOC) are not exportable to TFDS: its detection features "
                            "(Sequence of BBoxFeature) store one [ymin, xmin, ymax, xmax] row per object, the records "
                            "hold four coordinate lists, and export never rewrites records; read them with "
                            "imgrec.load_dataset")
    if (metadata.config.get("input") or {}).get("multi_label"):
        raise NotExportable("multi-label datasets are not exportable to TFDS (their labels are lists); read them "
                            "with imgrec.load_dataset")
    tfds = _tfds()
    connectors: dict[str, Any] = {}
    for key, described in metadata.features.items():
        role, dtype = described.get("role"), described.get("dtype")
        if role == "image":
            shape = tuple(int(d) for d in described["shape"])
            encoding, pixel_dtype = described.get("encoding", "raw"), described.get("pixel_dtype")
            if encoding in ("jpeg", "png"):
                connectors[key] = tfds.features.Image(shape=shape, encoding_format=encoding)
            elif encoding == "raw" and pixel_dtype in ("uint8", "float32"):
                connectors[key] = tfds.features.Tensor(shape=shape, dtype=np.dtype(pixel_dtype), encoding="bytes")
            else:
                raise NotExportable(f"image feature {key!r}: encoding {encoding!r} with pixels {pixel_dtype!r} "
                                    "has no TFDS feature that reads it as written")
        elif role == "label" and dtype == "int64":
            names = class_names(metadata.label_map)
            connectors[key] = (tfds.features.ClassLabel(names=names) if names is not None
                               else tfds.features.Scalar(dtype=np.int64))
        elif dtype == "string":
            connectors[key] = tfds.features.Text()
        elif dtype == "int64":
            connectors[key] = tfds.features.Scalar(dtype=np.int64)
        elif dtype in ("float32", "float"):
            connectors[key] = tfds.features.Scalar(dtype=np.float32)
        else:
            raise NotExportable(f"feature {key!r} has dtype {dtype!r}, which TFDS export does not map")
    roles = {described.get("role") for described in metadata.features.values()}
    if not {"image", "label"} <= roles:
        raise NotExportable(f"metadata features need image and label roles; found {sorted(roles - {None})}")
    return connectors


def split_infos(metadata: DatasetMetadata, template: Any) -> tuple[list[Any], list[str]]:
    """TFDS SplitInfos from our shard lengths and sizes, plus the names of splits left out (no shards).

    TFDS computes shard paths from the template, so each split's file list must be exactly what
    the template produces; otherwise TFDS would read other files, and we refuse.
    """
    tfds = _tfds()
    infos, empty = [], []
    for name, split in metadata.splits.items():
        if not split.files:
            empty.append(name)
            continue
        if not _SPLIT_NAME.fullmatch(name):
            raise NotExportable(f"split name {name!r} does not fit TFDS file names (letters, digits, _ and - only)")
        split_template = template.replace(split=name)
        expected = split_template.sharded_filenames(len(split.files))
        if list(split.files) != expected:
            raise NotExportable(f"split {name!r}: files {list(split.files)} are not the names TFDS derives "
                                f"({expected})")
        infos.append(tfds.core.SplitInfo(name=name, shard_lengths=list(split.shard_lengths),
                                         num_bytes=split.num_bytes, filename_template=split_template))
    if not infos:
        raise NotExportable("no split has any shard; TFDS needs at least one")
    return infos, empty


def _remove_tfds_files(output_dir: str) -> None:
    import tensorflow as tf

    for filename in written_files(output_dir):
        tf.io.gfile.remove(posixpath.join(output_dir.rstrip("/"), filename))


def written_files(output_dir: str) -> list[str]:
    """What TFDS's write_metadata left in the folder: its two JSON files and the label files."""
    import tensorflow as tf

    names = {name.rstrip("/") for name in tf.io.gfile.listdir(output_dir)}
    return sorted(n for n in names if n in TFDS_FILES or n.endswith(".labels.txt"))


def record_exports(output_dir: str, metadata: DatasetMetadata, names: Sequence[str]) -> None:
    """Adds the export's files to metadata.json, via a temporary name, so imgrec knows they are
    its own (a later run that replaces the dataset removes them, and nothing else)."""
    import tensorflow as tf

    updated = dataclasses.replace(metadata, exports=tuple(sorted(set(metadata.exports) | set(names))))
    path = posixpath.join(output_dir.rstrip("/"), METADATA_FILE)
    temporary = f"{path}.tmp-export"
    with tf.io.gfile.GFile(temporary, "w") as handle:
        handle.write(updated.dumps())
    tf.io.gfile.rename(temporary, path, overwrite=True)


def default_name(output_dir: str) -> str:
    """A TFDS dataset name from the folder name (TFDS names are identifiers), else 'imgrec'."""
    candidate = re.sub(r"\W", "_", posixpath.basename(output_dir.rstrip("/")))
    return candidate if _DATASET_NAME.fullmatch(candidate) else "imgrec"


def export(output_dir: str, name: Optional[str] = None, check_data: bool = True) -> dict[str, Any]:
    """Writes TFDS metadata into `output_dir` next to our shards; returns a summary.

    Everything is validated before anything is written. `check_data` makes TFDS read one
    record back, so a mapping that does not match the records fails here, not in training.
    The output's lock is held throughout: a run replacing the dataset meanwhile would have its
    metadata.json overwritten by this export's copy of the old one.
    """
    read_metadata(output_dir)  # not a dataset (a missing folder, a file): refused before the lock is taken
    with OutputLock(output_dir, f"export-{uuid.uuid4().hex}"):
        return _export(output_dir, name, check_data)


def _export(output_dir: str, name: Optional[str], check_data: bool) -> dict[str, Any]:
    metadata = read_metadata(output_dir)
    if metadata.compression != "none":
        raise NotExportable(f"shards are {metadata.compression}-compressed; TFDS reads TFRecords without a "
                            "compression type, so export needs a dataset written with --compression=none")
    name = name or default_name(output_dir)
    if not _DATASET_NAME.fullmatch(name):
        raise NotExportable(f"dataset name {name!r} must be an identifier starting with a letter")
    tfds = _tfds()
    features = feature_connectors(metadata)
    template = tfds.core.ShardedFileTemplate(data_dir=output_dir, template=FILENAME_TEMPLATE,
                                             dataset_name=name, filetype_suffix=FILE_SUFFIX)
    infos, empty = split_infos(metadata, template)
    problems = damage(output_dir, metadata)
    if problems:
        raise DatasetDamaged(f"{output_dir} is damaged: {'; '.join(problems)}; run imgrec verify for a full "
                             "report, and the run that wrote it again")
    by_role = metadata.role_keys()
    try:
        # Never pass `metadata=` here: TFDS would write it to OUTPUT/metadata.json, replacing ours.
        tfds.folder_dataset.write_metadata(
            data_dir=output_dir, features=tfds.features.FeaturesDict(features), split_infos=infos,
            filename_template=template, check_data=check_data,
            supervised_keys=(by_role["image"], by_role["label"]),
            description=f"Written by imgrec; see metadata.json (input fingerprint {metadata.fingerprint}).")
    except Exception as exc:
        # TFDS writes its files before check_data reads a record back; without them a failed
        # export cannot be loaded by mistake.
        _remove_tfds_files(output_dir)
        if type(exc).__module__.startswith("tensorflow"):  # check_data could not parse a record
            message = re.sub(r"^\{\{.*?\}\}\s*", "", (str(exc).strip().splitlines() or [type(exc).__name__])[0])
            raise NotExportable(f"TFDS cannot read the records as metadata.json describes them: {message}") from None
        raise
    record_exports(output_dir, metadata, written_files(output_dir))
    return {"name": name, "features": {key: repr(feature) for key, feature in features.items()},
            "splits": {info.name: info.num_examples for info in infos}, "skipped_empty_splits": empty}


def main(argv: Optional[Sequence[str]] = None, prog: str = "python -m pipeline.tfds_export") -> int:
    parser = CommandLineParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("output", help="A finished imgrec dataset folder (with metadata.json).")
    parser.add_argument("--name", help="TFDS dataset name; defaults to the folder name.")
    try:
        args = parser.parse_args(argv)
        summary = export(args.output, name=args.name)
    except (UsageError, OutputLocked) as error:
        say(f"imgrec: error: {error}")
        return error.exit_code
    except (NotExportable, NotAnImgrecDataset, UnsupportedDataset) as error:
        say(f"imgrec: error: {error}")
        return 2
    except DatasetDamaged as error:
        say(f"imgrec: error: {error}")
        return 1
    say(f"TFDS metadata written to {args.output} as {summary['name']!r}:", sys.stdout)
    for key, feature in summary["features"].items():
        say(f"  {key}: {feature}", sys.stdout)
    for split, count in summary["splits"].items():
        say(f"  split {split}: {count} examples", sys.stdout)
    if summary["skipped_empty_splits"]:
        say(f"  left out (no shards): {', '.join(summary['skipped_empty_splits'])}", sys.stdout)
    say(f"Load with: tfds.builder_from_directory({args.output!r}).as_dataset(split=...)", sys.stdout)
    return 0


if __name__ == "__main__":
    exit_quietly(main())
