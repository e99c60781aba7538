"""Read an imgrec dataset back as a `tf.data.Dataset` of (image, label).

Everything a reader needs is taken from `metadata.json`, never guessed: the shard files (listed,
not globbed, so stale or half-written files can never leak into training), the compression, and
the parse spec with the image encoding, pixel dtype and shape. Datasets written by the old seed
script, which have no metadata, go through the same parsing, decoding and batching code: both
entry points reduce to a `RecordLayout` and call `build_dataset`.

A run with `--overwrite` may replace a dataset while a training job reads it. `load_dataset`
remembers the run that published what it read, and refuses to go on (`DatasetChanged`) once
metadata.json names another run, rather than mix shards of two datasets.

This module imports TensorFlow but not Beam or OpenCV, so training jobs can use it without the
pipeline's dependencies; `tf.io.gfile` makes `gs://` and other TF filesystems work.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import posixpath
from typing import Callable, Mapping, Optional, Sequence, Union

import tensorflow as tf

from pipeline.tables import counted
from transforms.dataset_format import (
    METADATA_FILE,
    DatasetMetadata,
    FormatError,
    run_id_of,
    split_files,
    tf_compression_type,
)
from transforms.specs import ImageSpec

# Read-time normalization: the same formulas (and float32 arithmetic) as transforms/images/normalize.py.
READ_NORMALIZATIONS = ("unit", "mean_std")
DEFAULT_MEAN: tuple[float, ...] = ImageSpec().mean
DEFAULT_STD: tuple[float, ...] = ImageSpec().std

_FEATURE_DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32, "float": tf.float32}
_PIXEL_DTYPES = {"uint8": tf.uint8, "float32": tf.float32}
_ENCODINGS = ("raw", "jpeg", "png")

# A detection record's box lists, in the order its boxes are read: (ymin, xmin, ymax, xmax) in
# [0, 1], as TFDS's BBoxFeature and KerasCV's `rel_yxyx` format hold them.
BOX_ROLES = ("bbox/ymin", "bbox/xmin", "bbox/ymax", "bbox/xmax")
OBJECT_LABEL_ROLE = "object_label"
MASK_ROLE = "mask"  # a detection record's instance masks, one PNG per object (--masks)

ImageDecoder = Callable[[tf.Tensor], tf.Tensor]
Files = Union[str, Sequence[str]]
Shape = tuple[Optional[int], ...]


class NotAnImgrecDataset(FileNotFoundError):
    """The folder has no metadata.json: not written by imgrec, or the run never finished."""


class UnsupportedDataset(ValueError):
    """metadata.json describes something this reader cannot parse (other format version, bad JSON,
    unknown dtype), or TensorFlow has no filesystem for the dataset's path (s3://) or cannot reach it."""


class DatasetChanged(RuntimeError):
    """Another run replaced the dataset while it was being read; reading on would mix two datasets.

    Raised inside tf.data as shards are opened and finished, so iterating reports it as a
    `tf.errors.UnknownError` whose message holds `DatasetChanged: <why>`.
    """


@dataclasses.dataclass(frozen=True)
class RecordLayout:
    """How one serialized record becomes (image, label[, extras]).

    Both the metadata layout and the seed layout reduce to this, so they share one parser.
    `extras` maps a role (label_text, source_path, ...) to its feature key; roles are used as
    the names a caller sees because feature keys are configurable per dataset. A detection
    layout has `box_keys` (the BOX_ROLES' keys): its label is {"boxes", "classes"} (and
    "masks" with a `mask_key`), and `label_key` is the objects' class list.
    """

    parse_spec: Mapping[str, Union[tf.io.FixedLenFeature, tf.io.VarLenFeature]]
    image_key: str
    label_key: str
    decode_image: ImageDecoder
    pixel_dtype: tf.DType
    shape: Shape  # None where each record has its own size (resize_mode none)
    extras: Mapping[str, str] = dataclasses.field(default_factory=dict)
    box_keys: tuple[str, ...] = ()
    mask_key: Optional[str] = None

    @property
    def label_lists(self) -> bool:
        """Whether a record holds a list of labels: a detection record's objects, a multi-label image's."""
        return isinstance(self.parse_spec[self.label_key], tf.io.VarLenFeature)

    def parse(self, record: tf.Tensor) -> dict[str, tf.Tensor]:
        """One serialized record → {feature key: tensor}; per-object lists as dense 1-D tensors."""
        parsed = tf.io.parse_single_example(record, self.parse_spec)
        return {key: tf.sparse.to_dense(value) if isinstance(value, tf.SparseTensor) else value
                for key, value in parsed.items()}

    def label(self, parsed: Mapping[str, tf.Tensor],
              image: Optional[tf.Tensor] = None) -> Union[tf.Tensor, dict[str, tf.Tensor]]:
        """The class id, or a detection record's {"boxes": float32 [N, 4] (ymin, xmin, ymax, xmax),
        "classes": int64 [N]}: the dict KerasCV's bounding-box utilities take; given the decoded
        `image`, a record with masks adds "masks": uint8 [N, height, width] of 0/1."""
        if not self.box_keys:
            return parsed[self.label_key]
        target = {"boxes": tf.stack([parsed[key] for key in self.box_keys], axis=-1), "classes": parsed[self.label_key]}
        if self.mask_key and image is not None:
            target["masks"] = decode_masks(parsed[self.mask_key], tf.shape(image)[:2])
        return target


def decode_masks(pngs: tf.Tensor, size: tf.Tensor) -> tf.Tensor:
    """[N] PNG masks → uint8 [N, height, width]; a mask of another size than the image's
    (`size`: height, width) fails the read, as a misplaced mask must not pass for a right one."""
    def decode(png: tf.Tensor) -> tf.Tensor:
        mask = tf.io.decode_png(png, channels=1)[..., 0]
        with tf.control_dependencies([tf.debugging.assert_equal(
                tf.shape(mask), size, message="an instance mask is not the size of its image")]):
            return tf.identity(mask)
    return tf.cond(tf.size(pngs) > 0,
                   lambda: tf.map_fn(decode, pngs, fn_output_signature=tf.TensorSpec([None, None], tf.uint8)),
                   lambda: tf.zeros(tf.concat([[0], size], axis=0), tf.uint8))


# --------------------------------------------------------------------------------------------
# metadata.json


def metadata_path(output_dir: str) -> str:
    return posixpath.join(output_dir.rstrip("/"), METADATA_FILE)


def read_metadata(output_dir: str) -> DatasetMetadata:
    """The dataset's metadata.json; its absence means the dataset is unfinished or not imgrec's.

    The pipeline writes metadata.json last, so shards without it may be partial or stale.
    """
    path = metadata_path(output_dir)
    try:
        found = tf.io.gfile.exists(path)
    except tf.errors.UnimplementedError as exc:  # s3://: not in TensorFlow since 2.6
        raise UnsupportedDataset(f"{output_dir}: TensorFlow cannot read it ({exc.message}); copy the dataset to a "
                                 "local disk or gs:// to read it") from None
    except tf.errors.OpError as exc:  # gs:// with no network or refused credentials (TensorFlow's retries spent)
        raise UnsupportedDataset(f"{output_dir}: TensorFlow cannot read it ({exc.message.splitlines()[0]})") from None
    if not found:
        if not tf.io.gfile.exists(output_dir):
            raise NotAnImgrecDataset(f"{output_dir}: no such folder")
        raise NotAnImgrecDataset(
            f"{output_dir} is not a finished imgrec dataset: {METADATA_FILE} is missing (was it written "
            "by imgrec, and did the run finish?)")
    with tf.io.gfile.GFile(path, "rb") as handle:
        text = handle.read()
    try:
        return DatasetMetadata.loads(text)
    except FormatError as exc:
        raise UnsupportedDataset(f"{path}: {exc}") from None


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """The dataset a reader was built for: its folder and the run that published it.

    A run replacing the dataset deletes metadata.json before it touches any shard and writes its
    own last, so a shard read while metadata.json still names this run is this run's shard.
    """

    output_dir: str
    run_id: Optional[str]

    def check(self) -> None:
        """Raises `DatasetChanged` unless metadata.json still names this run."""
        path = metadata_path(self.output_dir)
        try:
            found = tf.io.gfile.stat(path)
            now = _named_run(path, found.length, found.mtime_nsec)
        except tf.errors.NotFoundError:
            raise DatasetChanged(self._replaced(f"{METADATA_FILE} of run {self.run_id} is gone")) from None
        if now != self.run_id:
            raise DatasetChanged(self._replaced(f"{METADATA_FILE} now has run {now}, not {self.run_id}"))

    def _replaced(self, why: str) -> str:
        return (f"{self.output_dir} was replaced by another run while it was being read ({why}); "
                "re-open the dataset")


@functools.lru_cache(maxsize=8)
def _named_run(path: str, length: int, mtime_nsec: int) -> Optional[str]:
    """The run the metadata.json at `path` names, or None (being rewritten, or not JSON any more).
    Read once per version of the file (a replacing run writes a new one, with a new time): a
    reader checks it at both ends of every shard, and reading it each time made a split of 4,000
    shards 25 times as slow to read (metadata.json grows with the shards)."""
    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            return run_id_of(json.loads(handle.read()))
    except ValueError:
        return None


def shard_paths(output_dir: str, metadata: DatasetMetadata, split: str) -> list[str]:
    """Full paths of the split's shards, in the order metadata lists them."""
    return [posixpath.join(output_dir.rstrip("/"), name) for name in split_files(metadata, split)]


def shard_for_input_pipeline(files: Sequence[str], num_shards: int, index: int, split: str) -> list[str]:
    """The files one of `num_shards` input pipelines reads (every num_shards-th, from `index`),
    as TFDS shards by file; fewer files than pipelines would leave some without data (an empty
    split, which has none, leaves every pipeline without)."""
    if not 0 <= index < num_shards:
        raise ValueError(f"input pipeline index {index} is not in 0..{num_shards - 1}")
    if 0 < len(files) < num_shards:
        raise ValueError(f"split {split!r} has {counted(len(files), 'shard file')} with records, fewer than the "
                         f"{num_shards} input pipelines reading it; write the dataset with --num_shards at least "
                         "that large (and fewer shards than images)")
    return list(files[index::num_shards])


# --------------------------------------------------------------------------------------------
# Layouts: parse spec + image decoder


def image_decoder(encoding: str, pixel_dtype: tf.DType, shape: Shape) -> ImageDecoder:
    """Encoded image bytes → an image tensor with a static, checked shape.

    Raw pixels are stored little-endian (transforms/write/example.py); JPEG/PNG are decoded to RGB
    with channels=3, matching how the pipeline encoded them.
    """
    if encoding == "raw":
        def decode(data: tf.Tensor) -> tf.Tensor:
            return tf.reshape(tf.io.decode_raw(data, pixel_dtype, little_endian=True), shape)
    elif encoding in ("jpeg", "png"):
        if pixel_dtype != tf.uint8:
            raise UnsupportedDataset(f"{encoding} images hold uint8 pixels, not {pixel_dtype.name}")
        decode_fn = tf.io.decode_jpeg if encoding == "jpeg" else tf.io.decode_png

        def decode(data: tf.Tensor) -> tf.Tensor:
            # ensure_shape (not set_shape) so an image of the wrong size fails loudly at read time.
            return tf.ensure_shape(decode_fn(data, channels=3), shape)
    else:
        raise UnsupportedDataset(f"unknown image encoding {encoding!r}; expected one of {', '.join(_ENCODINGS)}")
    return decode


def _parsed_feature(key: str, described: Mapping) -> Union[tf.io.FixedLenFeature, tf.io.VarLenFeature]:
    """One value per record, or a list per record (`kind: var_len`: a detection record's objects)."""
    dtype = _FEATURE_DTYPES.get(described.get("dtype"))
    if dtype is None:
        raise UnsupportedDataset(f"feature {key!r} has unsupported dtype {described.get('dtype')!r}")
    return tf.io.VarLenFeature(dtype) if described.get("kind") == "var_len" else tf.io.FixedLenFeature([], dtype)


def image_shape(key: str, described: Mapping) -> Shape:
    """The image feature's [height, width, channels]: positive sizes, None where each record has its own."""
    shape = described.get("shape")
    if not (isinstance(shape, (list, tuple)) and len(shape) == 3
            and all(d is None or type(d) is int and d > 0 for d in shape)):  # `type`: true is no size
        raise UnsupportedDataset(f"image feature {key!r} has shape {shape!r}, not [height, width, channels]")
    return tuple(shape)


def layout_from_metadata(metadata: DatasetMetadata, with_metadata: bool = False) -> RecordLayout:
    """The layout metadata.features describes; only the image and label roles are required (a
    detection dataset's: image, object_label and the four box roles).

    Without `with_metadata` only image and label are parsed: parsing fewer features is cheaper.
    """
    features, by_role = metadata.features, metadata.role_keys()
    detection = OBJECT_LABEL_ROLE in by_role
    label_role = OBJECT_LABEL_ROLE if detection else "label"
    box_roles = BOX_ROLES if detection else ()
    missing = [role for role in ("image", label_role, *box_roles) if role not in by_role]
    if missing:
        raise UnsupportedDataset(f"metadata features have no {' or '.join(missing)} role: {sorted(features)}")
    image_key, label_key = by_role["image"], by_role[label_role]
    box_keys = tuple(by_role[role] for role in box_roles)
    mask_key = by_role.get(MASK_ROLE) if detection else None
    image = features[image_key]
    pixel_dtype_name = image.get("pixel_dtype")
    if pixel_dtype_name not in _PIXEL_DTYPES:
        raise UnsupportedDataset(f"image pixel_dtype {pixel_dtype_name!r} is not one of {sorted(_PIXEL_DTYPES)}")
    pixel_dtype = _PIXEL_DTYPES[pixel_dtype_name]
    shape = image_shape(image_key, image)
    read = ("image", label_role, *box_roles, MASK_ROLE)
    extras = {role: key for role, key in by_role.items() if role not in read} if with_metadata else {}
    keys = [image_key, label_key, *box_keys, *([mask_key] if mask_key else []), *extras.values()]
    return RecordLayout(
        parse_spec={key: _parsed_feature(key, features[key]) for key in keys},
        image_key=image_key, label_key=label_key,
        decode_image=image_decoder(image.get("encoding", "raw"), pixel_dtype, shape),
        pixel_dtype=pixel_dtype, shape=shape, extras=extras, box_keys=box_keys, mask_key=mask_key)


# --------------------------------------------------------------------------------------------
# Normalization


def normalize_images(images: tf.Tensor, method: str, mean: Sequence[float] = DEFAULT_MEAN,
                     std: Sequence[float] = DEFAULT_STD) -> tf.Tensor:
    """uint8 RGB (channels last, any batch shape) → float32, bit-identical to transforms/images/normalize.py.

    Both sides do the same float32 operations in the same order (`x / 255`, then `(u - mean) / std`
    with float32 mean/std), and IEEE division/subtraction are exactly rounded, so normalizing
    when reading gives the same values as normalizing when writing.
    """
    if method not in READ_NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {', '.join(READ_NORMALIZATIONS)} or None; got {method!r}")
    unit = tf.cast(images, tf.float32) / tf.constant(255.0, tf.float32)
    if method == "unit":
        return unit
    return (unit - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)


def _check_normalize(normalize: Optional[str], layout: RecordLayout, mean: Sequence[float],
                     std: Sequence[float]) -> Optional[str]:
    """Validates the request up front, so mistakes fail before any file is read."""
    if normalize in (None, "none"):
        return None
    if normalize not in READ_NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {', '.join(READ_NORMALIZATIONS)} or None; got {normalize!r}")
    if layout.pixel_dtype != tf.uint8:
        raise ValueError(f"images are stored as {layout.pixel_dtype.name}, i.e. already normalized when "
                         "written; read them with normalize=None")
    if normalize == "mean_std":  # three of each, finite in float32, no zero std: what a run's config must give
        ImageSpec(encoding="raw", normalize=normalize, mean=tuple(mean), std=tuple(std))
    return normalize


# --------------------------------------------------------------------------------------------
# The one pipeline builder


def _checked(path: tf.Tensor, published: PublishedRun) -> tf.data.Dataset:
    """`path` as a one-element dataset that runs `published.check` when the element is read."""
    def check(name: bytes) -> bytes:
        published.check()
        return name
    return tf.data.Dataset.from_tensors(path).map(
        lambda p: tf.ensure_shape(tf.numpy_function(check, [p], tf.string, stateful=True), []))


def _read_checked(shards: tf.data.Dataset, compression_type: str, published: Optional[PublishedRun],
                  counted: bool, num_parallel_reads: Optional[int]) -> tf.data.Dataset:
    """Records of the (path, length) shards, in exactly the order `tf.data.TFRecordDataset(paths,
    num_parallel_reads=...)` gives them (it interleaves the same way). When `counted`, a shard with
    more or fewer records (cut at a record boundary, swapped) fails the iteration
    (`FailedPreconditionError: Input dataset was expected to contain N elements`). With
    `published`, each shard is checked against metadata.json just before it is opened (so a
    replacement is normally caught before any of its records is read) and again after its last
    record (closing the gap between that check and the open, and covering filesystems such as GCS,
    where an open file does not keep its old content): one check per shard at each end, not one
    per record."""
    def records(path: tf.Tensor, length: tf.Tensor) -> tf.data.Dataset:
        found = tf.data.TFRecordDataset(path, compression_type=compression_type)
        return found.apply(tf.data.experimental.assert_cardinality(length)) if counted else found

    def read(path: tf.Tensor, length: tf.Tensor) -> tf.data.Dataset:
        if published is None:
            return records(path, length)
        opened = _checked(path, published).flat_map(lambda p: records(p, length))
        return opened.concatenate(_checked(path, published).filter(lambda _: tf.constant(False)))

    if num_parallel_reads is None:
        return shards.flat_map(read)
    if num_parallel_reads == tf.data.AUTOTUNE:
        return shards.interleave(read, num_parallel_calls=tf.data.AUTOTUNE)
    return shards.interleave(read, cycle_length=num_parallel_reads, block_length=1,
                             num_parallel_calls=num_parallel_reads, deterministic=True)


def build_dataset(files: Sequence[str], layout: RecordLayout, *, compression: Optional[str] = "none",
                  batch_size: Optional[int] = 32, shuffle: bool = False, seed: Optional[int] = None,
                  shuffle_buffer: int = 10_000, normalize: Optional[str] = None,
                  mean: Sequence[float] = DEFAULT_MEAN, std: Sequence[float] = DEFAULT_STD,
                  with_metadata: bool = False, num_parallel_reads: Optional[int] = tf.data.AUTOTUNE,
                  drop_remainder: bool = False, published: Optional[PublishedRun] = None,
                  lengths: Optional[Sequence[int]] = None) -> tf.data.Dataset:
    """files → records → (shuffle) → parse + decode (+ normalize) → batch → prefetch.

    Shuffling happens on serialized records, before decoding, so the buffer holds compact JPEG/PNG
    bytes rather than decoded pixels (for raw records both are the same size: a 10 000-record
    buffer of 224x224x3 float32 images is ~6 GB). Each pass over the dataset (epoch) is shuffled
    anew. With a seed the sequence of orders is reproducible, but parallel reads interleave
    `num_parallel_reads` files at once and AUTOTUNE picks that from the CPU count: pass an int
    for the same order on every machine. With `published`, each shard is read only while that run's
    metadata.json is in place (see `PublishedRun`), else `DatasetChanged` stops the iteration.
    With `lengths` (records per file), a file holding another number of records stops it too, and
    the dataset's cardinality is known.
    """
    normalize = _check_normalize(normalize, layout, mean, std)
    if batch_size is not None and batch_size <= 0:
        raise ValueError(f"batch_size must be positive or None; got {batch_size}")
    compression_type = tf_compression_type(compression or "none")
    counts = tf.constant(list(lengths) if lengths is not None else [-1] * len(files), dtype=tf.int64)
    shards = tf.data.Dataset.from_tensor_slices((tf.constant(list(files), dtype=tf.string), counts))
    if shuffle:
        shards = shards.shuffle(max(len(files), 1), seed=seed)
    if published is None and lengths is None:  # nothing to check: TFRecordDataset's own interleave, cheaper
        records = tf.data.TFRecordDataset(shards.map(lambda path, _: path), compression_type=compression_type,
                                          num_parallel_reads=num_parallel_reads)
    else:
        records = _read_checked(shards, compression_type, published, lengths is not None, num_parallel_reads)
    if lengths is not None:  # a known epoch length: Keras counts its steps, no "ran out of data"
        records = records.apply(tf.data.experimental.assert_cardinality(sum(lengths)))
    if shuffle:
        records = records.shuffle(shuffle_buffer, seed=seed)

    def parse(record: tf.Tensor) -> tuple:
        parsed = layout.parse(record)
        image = layout.decode_image(parsed[layout.image_key])
        if normalize:
            image = normalize_images(image, normalize, mean, std)
        label = layout.label(parsed, image)
        if with_metadata:
            return image, label, {role: parsed[key] for role, key in layout.extras.items()}
        return image, label
    dataset = records.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    if batch_size is not None:  # ragged: per-object lists and per-record image sizes, as KerasCV batches them
        ragged = layout.label_lists or None in layout.shape
        dataset = (dataset.ragged_batch if ragged else dataset.batch)(batch_size, drop_remainder=drop_remainder)
    return dataset.prefetch(tf.data.AUTOTUNE)


# --------------------------------------------------------------------------------------------
# Public entry points


def load_dataset(output_dir: str, split: str, batch_size: Optional[int] = 32, shuffle: bool = False,
                 seed: Optional[int] = None, shuffle_buffer: int = 10_000, normalize: Optional[str] = None,
                 mean: Sequence[float] = DEFAULT_MEAN, std: Sequence[float] = DEFAULT_STD,
                 with_metadata: bool = False, num_parallel_reads: Optional[int] = tf.data.AUTOTUNE,
                 drop_remainder: bool = False,
                 input_context: Optional[tf.distribute.InputContext] = None,
                 check_replaced: bool = True) -> tf.data.Dataset:
    """One split of a finished imgrec dataset as (image, label) or, with `with_metadata`,
    (image, label, {role: value}) for the other features (label_text, source_path, ...).

    Images are uint8 for normalize=none datasets and jpeg/png, float32 when normalized (at write
    time, or here with normalize='unit' | 'mean_std'); labels are int64 ids of metadata.label_map
    (a multi-label dataset's: an int64 [k] list per image, ragged when batched).
    A detection dataset's label is {"boxes": float32 [N, 4] as (ymin, xmin, ymax, xmax) in [0, 1],
    "classes": int64 [N]} (and "masks": uint8 [N, height, width] of 0/1 when written with
    --masks), and its batches are ragged (docs/detection.md).
    `batch_size=None` yields single examples. With an `input_context` (from
    `strategy.distribute_datasets_from_function`) each input pipeline reads its own shard files,
    and `batch_size` is the per-replica batch. If another run replaces the dataset while it is
    read, iterating fails with `DatasetChanged` (as a `tf.errors.UnknownError`) instead of mixing
    the two datasets; that check is a Python function in the graph, so pass `check_replaced=False`
    where the graph must be serialized (the tf.data service).
    """
    metadata = read_metadata(output_dir)
    shards = list(zip(shard_paths(output_dir, metadata, split), metadata.splits[split].shard_lengths))
    if input_context is not None:  # shard files without records (more shards than images) feed no pipeline
        shards = shard_for_input_pipeline([shard for shard in shards if shard[1]], input_context.num_input_pipelines,
                                          input_context.input_pipeline_id, split)
    return build_dataset(
        [path for path, _ in shards], layout_from_metadata(metadata, with_metadata),
        lengths=[length for _, length in shards],
        compression=metadata.compression, batch_size=batch_size, shuffle=shuffle,
        seed=seed, shuffle_buffer=shuffle_buffer, normalize=normalize, mean=mean, std=std,
        with_metadata=with_metadata, num_parallel_reads=num_parallel_reads, drop_remainder=drop_remainder,
        published=PublishedRun(output_dir, metadata.run.get("run_id")) if check_replaced else None)


def load_seed_layout(files: Files, image_key: str = "train/image", label_key: str = "train/label",
                     shape: Sequence[int] = (224, 224, 3), dtype: tf.DType = tf.float32,
                     compression: Optional[str] = "none", batch_size: Optional[int] = 32,
                     shuffle: bool = False, seed: Optional[int] = None, shuffle_buffer: int = 10_000,
                     normalize: Optional[str] = None, mean: Sequence[float] = DEFAULT_MEAN,
                     std: Sequence[float] = DEFAULT_STD,
                     num_parallel_reads: Optional[int] = tf.data.AUTOTUNE,
                     drop_remainder: bool = False) -> tf.data.Dataset:
    """Records in the old seed script's layout (no metadata.json) as (image, label).

    Nothing describes these files, so the caller states the keys, shape and pixel dtype; `files`
    is a list of paths or a glob pattern (expanded sorted). Uses the same builder as `load_dataset`:
    the records hold raw pixel bytes under `image_key` and an int64 `label_key`.
    """
    if isinstance(files, str):
        pattern, files = files, sorted(tf.io.gfile.glob(files))
        if not files:
            raise FileNotFoundError(f"no files match {pattern!r}")
    shape = tuple(int(d) for d in shape)
    dtype = tf.as_dtype(dtype)
    layout = RecordLayout(
        parse_spec={image_key: tf.io.FixedLenFeature([], tf.string),
                    label_key: tf.io.FixedLenFeature([], tf.int64)},
        image_key=image_key, label_key=label_key, decode_image=image_decoder("raw", dtype, shape),
        pixel_dtype=dtype, shape=shape)
    return build_dataset(
        list(files), layout, compression=compression,
        batch_size=batch_size, shuffle=shuffle, seed=seed, shuffle_buffer=shuffle_buffer,
        normalize=normalize, mean=mean, std=std, num_parallel_reads=num_parallel_reads,
        drop_remainder=drop_remainder)
