"""Make a finished imgrec dataset loadable with `tfds.builder_from_directory(OUTPUT)`.

TFDS reads TFRecords it did not write once the folder holds its metadata (dataset_info.json,
features.json, <label>.labels.txt), which `tfds.folder_dataset.write_metadata` writes from
features derived here from our metadata.json. The shards are never rewritten, so each feature
must parse our records as they are: jpeg/png images are `Image` (one bytes feature, decoded
with `tf.image.decode_image`), raw ones `Tensor(encoding="bytes")` (`tf.io.decode_raw` +
reshape, our raw layout for uint8 and float32 alike); the label is a `ClassLabel` when its ids
are 0..n-1 and its names survive TFDS's labels.txt (one stripped name a line), else an int64
scalar; other features are `Text` or scalars. Lists (detection objects, multi-label labels) are
1-D features: detection boxes stay four coordinate lists as TF's detection decoders read them,
not TFDS's BBoxFeature (one [4] row per object, which would need the records rewritten), and
masks a Sequence of PNG `Image`s. Keys stay ours: a flat FeaturesDict splits nothing on '/'.

Refused: gzip shards (TFDS opens TFRecords without a compression type), and split or file names
TFDS's filename template cannot reproduce. Splits without shards are left out: TFDS requires
files for every split. The export lists its files in metadata.json (`exports`), so a run that
replaces the dataset removes them with the old shards: export again after such a run.
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
from pipeline.output.lock import OutputLock
from pipeline.prepare import not_whole
from pipeline.read.reader import NotAnImgrecDataset, UnsupportedDataset, image_shape, read_metadata
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

    exit_code = 1


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
    """Names ordered by id if `ClassLabel` keeps them as they are (its ids are positions, its
    names one stripped line each), else None."""
    names = sorted(label_map, key=label_map.__getitem__)
    kept = all(name and name == name.strip() and len(name.splitlines()) == 1 for name in names)
    return names if kept and sorted(label_map.values()) == list(range(len(names))) else None


def feature_connectors(metadata: DatasetMetadata) -> dict[str, Any]:
    """{our feature key: TFDS feature} for every feature metadata.json lists. Per-object and
    multi-label lists (`kind: var_len`) are 1-D features under their own keys, so detection
    records load as written: four box coordinate lists (as TF's detection decoders read them),
    classes, and masks as a Sequence of PNG images."""
    tfds = _tfds()
    roles = {described.get("role") for described in metadata.features.values()}
    if "image" not in roles or not roles & {"label", "object_label"}:
        raise NotExportable(f"metadata features need an image and a label role; found {sorted(roles - {None})}")
    return {key: _connector(tfds, key, described, metadata.label_map) for key, described in metadata.features.items()}


def _connector(tfds: Any, key: str, described: Mapping[str, Any], label_map: Mapping[str, int]) -> Any:
    import numpy as np

    role, dtype, listed = described.get("role"), described.get("dtype"), described.get("kind") == "var_len"
    if role == "image":
        shape = image_shape(key, described)
        encoding, pixel_dtype = described.get("encoding", "raw"), described.get("pixel_dtype")
        if encoding in ("jpeg", "png"):
            return tfds.features.Image(shape=shape, encoding_format=encoding)
        if encoding == "raw" and pixel_dtype in ("uint8", "float32") and None not in shape:
            return tfds.features.Tensor(shape=shape, dtype=np.dtype(pixel_dtype), encoding="bytes")
        raise NotExportable(f"image feature {key!r}: encoding {encoding!r} with pixels {pixel_dtype!r} "
                            "has no TFDS feature that reads it as written")
    if role == "mask" and listed:
        return tfds.features.Sequence(tfds.features.Image(shape=(None, None, 1), encoding_format="png"))
    if role in ("label", "object_label") and dtype == "int64":
        names = class_names(label_map)
        if names is not None:
            label = tfds.features.ClassLabel(names=names)
            return tfds.features.Sequence(label) if listed else label
    if dtype == "string":
        return tfds.features.Sequence(tfds.features.Text()) if listed else tfds.features.Text()
    if dtype in ("int64", "float32", "float"):
        numpy_dtype = np.int64 if dtype == "int64" else np.float32
        return (tfds.features.Tensor(shape=(None,), dtype=numpy_dtype) if listed
                else tfds.features.Scalar(dtype=numpy_dtype))
    raise NotExportable(f"feature {key!r} has dtype {dtype!r}, which TFDS export does not map")


def split_infos(metadata: DatasetMetadata, template: Any) -> tuple[list[Any], list[str]]:
    """TFDS SplitInfos from our shard lengths and sizes, plus the names of splits left out (no
    shards). TFDS derives shard paths from the template: file names it does not reproduce are refused."""
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
    if not any(info.num_examples for info in infos):
        raise NotExportable("no split has any record; TFDS needs at least one")
    # TFDS's check reads the first split's first record: not one whose every image was rejected
    return sorted(infos, key=lambda info: not info.num_examples), empty


def written_files(output_dir: str) -> list[str]:
    """What TFDS's write_metadata left in the folder: its two JSON files and the label files."""
    return [n for n in files.list_names(output_dir) if n in TFDS_FILES or n.endswith(".labels.txt")]


def default_name(output_dir: str) -> str:
    """A TFDS dataset name from the folder name (TFDS names are identifiers), else 'imgrec'."""
    candidate = re.sub(r"\W", "_", posixpath.basename(output_dir.rstrip("/")))
    return candidate if _DATASET_NAME.fullmatch(candidate) else "imgrec"


def export(output_dir: str, name: Optional[str] = None) -> dict[str, Any]:
    """Writes TFDS metadata into `output_dir` next to our shards, everything checked first (TFDS
    reads a record back, so a wrong mapping fails here, not in training); returns a summary. The
    output's lock is held: a run replacing the dataset meanwhile would have its metadata.json
    overwritten by this export's copy of the old one."""
    read_metadata(output_dir)  # not a dataset (a missing folder, a file): refused before the lock is taken
    with OutputLock(output_dir, f"export-{uuid.uuid4().hex}"):
        return _export(output_dir, name)


def _export(output_dir: str, name: Optional[str]) -> dict[str, Any]:
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
    foreign = set(written_files(output_dir)) - set(metadata.exports)  # the user's, not an earlier export's
    try:
        # Never pass `metadata=` here: TFDS would write it to OUTPUT/metadata.json, replacing ours.
        tfds.folder_dataset.write_metadata(
            data_dir=output_dir, features=tfds.features.FeaturesDict(features), split_infos=infos,
            filename_template=template, check_data=True,
            supervised_keys=(by_role["image"], by_role["label"]) if "label" in by_role else None,
            description=f"Written by imgrec; see metadata.json (input fingerprint {metadata.fingerprint}).")
    except Exception as exc:
        # TFDS writes its files before check_data reads a record back; without them a failed
        # export cannot be loaded by mistake.
        files.delete(join(output_dir, name) for name in written_files(output_dir) if name not in foreign)
        if type(exc).__module__.startswith("tensorflow"):  # check_data could not parse a record
            message = re.sub(r"^\{\{.*?\}\}\s*", "", (str(exc).strip().splitlines() or [type(exc).__name__])[0])
            raise NotExportable(f"TFDS cannot read the records as metadata.json describes them: {message}") from None
        raise
    # metadata.json lists the export's files, so a run replacing the dataset removes them
    exports = tuple(sorted(set(metadata.exports) | set(written_files(output_dir))))
    updated = dataclasses.replace(metadata, exports=exports)
    files.write_atomically(join(output_dir, METADATA_FILE), updated.dumps().encode("utf-8"))
    return {"name": name, "features": {key: repr(feature) for key, feature in features.items()},
            "splits": {info.name: info.num_examples for info in infos}, "skipped_empty_splits": empty}


def main(argv: Optional[Sequence[str]] = None, prog: str = "python -m pipeline.read.tfds_export") -> int:
    parser = CommandLineParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("output", help="A finished imgrec dataset folder (with metadata.json).")
    parser.add_argument("--name", help="TFDS dataset name; defaults to the folder name.")
    try:
        args = parser.parse_args(argv)
        summary = export(args.output, name=args.name)
    except (UsageError, OutputLocked, NotExportable, NotAnImgrecDataset, UnsupportedDataset, DatasetDamaged) as error:
        say(f"imgrec: error: {error}")
        return getattr(error, "exit_code", 2)  # 2: not a dataset TFDS can read as written; 1: damaged
    except OSError as error:  # a full disk, a folder in the way: TFDS's files are not left behind
        say(f"imgrec: error: {args.output}: the TFDS export could not be written: {error}")
        return 1
    empty = summary["skipped_empty_splits"]
    say("\n".join([f"TFDS metadata written to {args.output} as {summary['name']!r}:",
                   *(f"  {key}: {feature}" for key, feature in summary["features"].items()),
                   *(f"  split {split}: {count} examples" for split, count in summary["splits"].items()),
                   *([f"  left out (no shards): {', '.join(empty)}"] if empty else []),
                   f"Load with: tfds.builder_from_directory({args.output!r}).as_dataset(split=...)"]), sys.stdout)
    return 0


if __name__ == "__main__":
    exit_quietly(main())
