"""Frozen specs that describe one conversion; every transform reads its settings from these.

They are plain, picklable values so that Beam ships them to workers unchanged and tests can build
them without any configuration machinery.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import posixpath
import re
from typing import Optional

from transforms import dataset_format, files

# `none` keeps the decoded size, as the detection scripts (create_coco_tf_record.py) do: the
# records' images differ in size, so they are stored as JPEG or PNG.
RESIZE_MODES = ("stretch", "center_crop", "pad", "none")
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32
INTERPOLATIONS = ("nearest", "linear", "area", "cubic", "lanczos")
# JPEG DCT scaling (libjpeg decodes at 1/2, 1/4 or 1/8 size) is invisible (PSNR >= 50 dB) after a
# final INTER_AREA resize from at least twice the output size; interpolations that do not average
# alias on a large downscale, so a reduced decode would change what they compute.
REDUCING_INTERPOLATIONS = ("area",)
NORMALIZATIONS = ("none", "unit", "mean_std")
ENCODINGS = ("raw", "jpeg", "png")
ALPHA_MODES = ("composite", "drop")
DECODERS = ("imgrec", "imread")
REDUCED_DECODE = ("auto", "off")
SPLIT_METHODS = ("hash", "stratified")
SPLIT_KEYS = ("content", "path")
INPUT_KINDS = ("folders", "glob", "csv", "jsonl", "coco", "voc")
DETECTION_KINDS = ("coco", "voc")  # annotation files: objects with boxes per image
SOURCE_PATHS = ("relative", "absolute")
COMPRESSIONS = tuple(dataset_format.COMPRESSIONS)
SPLIT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")  # part of the shard file names: no path in it
MAX_SHARDS = 100_000  # per split; every shard is a file, even an empty one


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """How every image is decoded, checked, resized, normalized and encoded."""

    # The defaults are the recommended settings: JPEG records of uint8 pixels (normalize when
    # reading), aspect kept by a center crop; configs/seed.yaml keeps the seed script's format.
    height: int = 224
    width: int = 224
    resize_mode: str = "center_crop"
    interpolation: str = "area"
    normalize: str = "none"
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    encoding: str = "jpeg"
    quality: int = 90
    alpha: str = "composite"
    background: tuple[int, int, int] = (255, 255, 255)
    pad_value: int = 0
    min_side: int = 1
    max_pixels: int = 178_956_970  # Pillow's decompression-bomb limit, a widely used default.
    # Memory one decode may take: the decoded array (width x height x channels x bytes per
    # sample) plus the working copies decode makes; checked from the header before decoding.
    max_decoded_bytes: int = 2**30
    # "imgrec": alpha composited or dropped as `alpha` says, 16 bits rounded exactly (x / 257),
    # EXIF orientation applied. "imread": exactly what `cv2.imread(path)` gives (BGR → RGB), to
    # reproduce scripts built on it bit for bit (it drops alpha, takes the high byte of 16-bit
    # PNGs, premultiplies some TIFF alpha).
    decoder: str = "imgrec"
    # JPEGs decoded at 1/2, 1/4 or 1/8 size by the decoder itself (DCT scaling) when the image is
    # large enough that this is invisible after the resize; see transforms/images/decode.py.
    reduced_decode: str = "auto"

    def __post_init__(self) -> None:
        for name, choices in (("resize_mode", RESIZE_MODES), ("interpolation", INTERPOLATIONS),
                              ("normalize", NORMALIZATIONS), ("encoding", ENCODINGS), ("alpha", ALPHA_MODES),
                              ("decoder", DECODERS), ("reduced_decode", REDUCED_DECODE)):
            _check_choice(name, getattr(self, name), choices)
        if self.max_decoded_bytes <= 0 or self.max_pixels <= 0 or self.min_side < 1:
            raise ValueError("max_decoded_bytes and max_pixels must be positive and min_side at least 1")
        if self.height <= 0 or self.width <= 0:
            raise ValueError(f"height and width must be positive; got {self.height}x{self.width}")
        if self.encoding != "raw" and self.normalize != "none":
            raise ValueError(f"{self.encoding} records store uint8 pixels, so normalize={self.normalize} needs "
                             "encoding=raw (float32 records); or keep normalize=none and normalize when reading "
                             "(load_dataset(normalize=...))")
        if self.normalize == "mean_std" and (len(self.mean) != 3 or len(self.std) != 3):
            raise ValueError("mean_std needs three means and three stds (R, G, B)")
        if not all(math.isfinite(v) for v in (*self.mean, *self.std)) or not all(self.std):
            raise ValueError(f"mean and std must be finite and std non-zero; got mean={self.mean} std={self.std}")
        # mean_std normalization, done in float32, must stay finite for every pixel (0..1 after /255): a
        # std of 1e-46 is 0 in float32, and 1 / 1e-300 or a mean of 1e39 overflow it.
        if not all(abs(m) <= FLOAT32_MAX and abs(s) >= FLOAT32_TINY and (1 + abs(m)) / abs(s) <= FLOAT32_MAX
                   for m, s in zip(self.mean, self.std)):
            raise ValueError(f"mean and std must keep (x/255 - mean) / std finite in float32, the pixels' type; "
                             f"got mean={self.mean} std={self.std}")
        if self.resize_mode == "none" and self.encoding == "raw":
            raise ValueError("resize_mode=none keeps each image's own size, which raw records do not store: use "
                             "encoding=jpeg or png")
        if self.output_bytes > self.max_decoded_bytes:
            raise ValueError(f"a {self.height}x{self.width} {self.dtype} output image takes {self.output_bytes} bytes, "
                             f"more than max_decoded_bytes={self.max_decoded_bytes}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be in 1..100; got {self.quality}")
        if len(self.background) != 3 or not all(0 <= v <= 255 for v in self.background):
            raise ValueError(f"background must be three values in 0..255 (R, G, B); got {list(self.background)}")
        if not 0 <= self.pad_value <= 255:
            raise ValueError(f"pad_value must be in 0..255; got {self.pad_value}")

    @property
    def reduces_jpegs(self) -> bool:
        """Whether large JPEGs may be decoded at a reduced size (transforms/images/decode.py jpeg_scale);
        never when the decoded size is kept."""
        return self.reduced_decode != "off" and self.interpolation in REDUCING_INTERPOLATIONS and self.resizes

    @property
    def resizes(self) -> bool:
        """False for resize_mode=none: every record keeps its image's decoded size."""
        return self.resize_mode != "none"

    @property
    def dtype(self) -> str:
        """Pixel dtype stored in the record (and read back with decode_raw for raw encoding)."""
        return "uint8" if self.normalize == "none" else "float32"

    @property
    def shape(self) -> tuple[Optional[int], Optional[int], int]:
        """The stored image's shape; height and width are None when each image keeps its own."""
        return (self.height, self.width, 3) if self.resizes else (None, None, 3)

    @property
    def pixel_bytes(self) -> int:
        return 3 * (1 if self.dtype == "uint8" else 4)

    @property
    def output_bytes(self) -> int:
        """Bytes of one converted image's pixels."""
        return self.height * self.width * self.pixel_bytes

    def pixel_settings(self) -> dict:
        """The fields that decide an accepted image's stored bytes (limits only decide which
        images are accepted): what an incremental run must match to reuse a record's image."""
        limits = ("min_side", "max_pixels", "max_decoded_bytes")
        return {name: value for name, value in self.used_settings().items() if name not in limits}

    def used_settings(self) -> dict:
        """The fields, without those the other fields make irrelevant (mean and std unless
        normalize is mean_std, quality unless encoding is jpeg, ...): what metadata.json records."""
        unused = {"quality": self.encoding != "jpeg", "mean": self.normalize != "mean_std",
                  "std": self.normalize != "mean_std", "pad_value": self.resize_mode != "pad",
                  "background": self.alpha != "composite", "reduced_decode": not self.reduces_jpegs,
                  "height": not self.resizes, "width": not self.resizes, "interpolation": not self.resizes}
        return {name: value for name, value in dataclasses.asdict(self).items() if not unused.get(name)}


@dataclasses.dataclass(frozen=True)
class FeatureKeys:
    """`tf.train.Example` feature keys; an empty key leaves that feature out of the record."""

    image: str = "image"
    label: str = "label"
    label_text: str = "label/text"
    height: str = "image/height"
    width: str = "image/width"
    channels: str = "image/channels"
    source_path: str = "image/source_path"
    content_hash: str = "image/sha256"

    def __post_init__(self) -> None:
        if not self.image or not self.label:
            raise ValueError("feature keys for image and label are required")
        keys = [k for k in dataclasses.astuple(self) if k]
        if len(keys) != len(set(keys)):
            raise ValueError(f"feature keys must be distinct; got {keys}")


# Detection records' keys, as TF's detection decoders read them (transforms/write/detection_example.py);
# imgrec's own source path and content hash beside them.
DETECTION_KEYS = FeatureKeys(image="image/encoded", label="image/object/class/label",
                             label_text="image/object/class/text", channels="")
# Multi-label records' label lists under the OD API's image-level class keys (image/class/label).
MULTI_LABEL_KEYS = FeatureKeys(label="image/class/label", label_text="image/class/text")


@dataclasses.dataclass(frozen=True)
class SplitSpec:
    """Deterministic train/val/test assignment."""

    names: tuple[str, ...] = ("train", "val", "test")
    ratios: tuple[float, ...] = (0.7, 0.2, 0.1)
    method: str = "hash"
    key: str = "content"
    salt: str = "imgrec"

    def __post_init__(self) -> None:
        _check_choice("split method", self.method, SPLIT_METHODS)
        _check_choice("split key", self.key, SPLIT_KEYS)
        if len(self.names) != len(self.ratios) or not self.names:
            raise ValueError("splits need one ratio per name")
        if len({n.lower() for n in self.names}) != len(self.names):  # TRAIN-… and train-… are one file on macOS
            raise ValueError(f"split names must be distinct, ignoring case; got {list(self.names)}")
        bad = [n for n in self.names if not SPLIT_NAME.fullmatch(n)]
        if bad:
            raise ValueError(f"split names are part of file names: letters, digits, _ and - only; got {bad[0]!r}")
        if not all(math.isfinite(r) and r >= 0 for r in self.ratios) or abs(sum(self.ratios) - 1.0) > 1e-6:
            raise ValueError(f"split ratios must be >= 0 and sum to 1; got {self.ratios}")


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """Where and how shards are written."""

    path: str
    num_shards: int = 0  # 0: chosen from target_shard_bytes
    target_shard_bytes: int = 256 * 2**20
    compression: str = "none"
    shuffle_seed: int = 0
    overwrite: bool = False
    skip_unchanged: bool = False
    max_error_fraction: float = 0.01
    drop_duplicates: bool = False
    allow_empty: bool = False  # publish a dataset with no examples instead of failing
    compare_to: Optional[str] = None  # skip_unchanged: compare with this dataset ("latest": newest sibling)
    reuse_from: Optional[str] = None  # take unchanged images' bytes from this dataset ("latest": newest sibling)
    keep_last: int = 0  # a dated output: after a successful run, keep this many datasets of the template (0: all)

    def __post_init__(self) -> None:
        _check_choice("compression", self.compression, COMPRESSIONS)
        if self.keep_last < 0:
            raise ValueError(f"keep_last must be 0 (keep every dataset) or more; got {self.keep_last}")
        if not 0 <= self.num_shards <= MAX_SHARDS or self.target_shard_bytes <= 0:
            raise ValueError(f"num_shards must be in 0..{MAX_SHARDS} and target_shard_bytes > 0")
        if not 0 <= self.max_error_fraction <= 1:
            raise ValueError(f"max_error_fraction must be in [0, 1]; got {self.max_error_fraction}")
        if self.compare_to and not self.skip_unchanged:
            raise ValueError("compare_to only matters with skip_unchanged: add --skip_unchanged, or drop compare_to")


def glob_root(pattern: str) -> str:
    """The folder a glob's wildcards start below: `/data/*/*.jpg` → `/data`."""
    segments = pattern.split("/")
    literal = next(i for i, segment in enumerate(segments + ["*"]) if any(ch in segment for ch in "*?["))
    return "/".join(segments[:literal])


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """What to discover: a folder of class folders, a glob, or a CSV/JSONL manifest."""

    path: str
    kind: str = "auto"  # auto | folders | glob | csv | jsonl | coco | voc
    extensions: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")
    class_names: Optional[tuple[str, ...]] = None  # fixed label map; other labels are rejected
    max_file_bytes: int = 256 * 2**20  # larger files are rejected without being read
    # Manifest column (CSV) or key (JSONL) names of the path and the label; None: recognise them.
    manifest_columns: Optional[tuple[str, str]] = None
    # What the records' source_path holds: the path below the input root (`root`), so a dataset's
    # bytes do not depend on where its input lies; or the path as found.
    source_paths: str = "relative"
    images_root: Optional[str] = None  # COCO: where file_names resolve (default: the annotation file's folder)
    keep_empty_images: bool = True  # COCO/VOC: images without objects are written (negative examples)
    multi_label: bool = False  # CSV/JSONL: a list of labels per image (transforms/inputs/manifests.py)

    def __post_init__(self) -> None:
        if self.kind != "auto":
            _check_choice("input kind", self.kind, INPUT_KINDS)
        _check_choice("source_paths", self.source_paths, SOURCE_PATHS)
        if self.max_file_bytes <= 0:
            raise ValueError(f"max_file_bytes must be positive; got {self.max_file_bytes}")
        names = self.class_names
        if names is not None and (not names or len(set(names)) != len(names) or not all(names)):
            raise ValueError(f"class_names must name distinct, non-empty classes (their order gives the label ids); "
                             f"got {list(self.class_names)}")
        if self.manifest_columns is not None and (len(self.manifest_columns) != 2 or not all(self.manifest_columns)):
            raise ValueError("manifest_columns must be two names, PATH_COLUMN,LABEL_COLUMN; "
                             f"got {self.manifest_columns}")
        kind = self.resolved_kind
        if self.images_root is not None and kind != "coco":
            unseen = self.kind == "auto" and files.local_path(self.path) is None  # resolved_kind: COCO is local only
            raise ValueError(f"images_root is where a COCO file's images are; the input is {kind}"
                             + (" (a COCO file on an object store needs --input_kind=coco)" if unseen else ""))
        if not self.keep_empty_images and kind not in DETECTION_KINDS:  # a flag that would do nothing
            raise ValueError(f"keep_empty_images=false skips COCO and VOC images without objects; the input is {kind}")
        if self.multi_label and kind not in ("csv", "jsonl"):
            raise ValueError(f"multi_label reads a list of labels per line of a CSV or JSONL manifest; the input "
                             f"is {kind}")

    def root(self) -> str:
        """The folder the input's files are named from: the input folder, a glob's folder above its
        first wildcard, a COCO file's images_root, else the (manifest or COCO) file's folder."""
        kind = self.resolved_kind
        if kind in ("folders", "voc"):
            return self.path.rstrip("/")
        if kind == "coco" and self.images_root is not None:
            return self.images_root.rstrip("/")
        return glob_root(self.path) if kind == "glob" else posixpath.dirname(self.path)

    @functools.cached_property
    def resolved_kind(self) -> str:
        """`auto` picks by the path: manifests by extension (a `.json` whose top level starts with
        a COCO key is COCO), globs by wildcard, a folder holding Annotations/ and JPEGImages/
        is Pascal VOC, else folders. COCO and VOC are recognised on local disks only. Looked at
        once, by the driver's first question: the answer travels with the spec to the workers."""
        if self.kind != "auto":
            return self.kind
        lower, local = self.path.lower(), files.local_path(self.path)
        if lower.endswith(".csv"):
            return "csv"
        if lower.endswith(".json") and local is not None:
            from transforms.inputs.coco import looks_like_coco  # coco.py imports this module (via manifests)

            if looks_like_coco(self.path):
                return "coco"
        if lower.endswith((".jsonl", ".json")):
            return "jsonl"
        # An existing local folder whose name has glob characters (`photos[2024]`) is a folder. On
        # object stores `auto` looks for no VOC layout (settling a spec must not wait on a store).
        if any(ch in self.path for ch in "*?[") and not (local is not None and os.path.isdir(local)):
            return "glob"
        if local is not None and all(os.path.isdir(os.path.join(local, sub)) for sub in ("Annotations", "JPEGImages")):
            return "voc"
        return "folders"

    @property
    def detection(self) -> bool:
        """Annotation files (COCO, VOC): records of objects with boxes."""
        return self.resolved_kind in DETECTION_KINDS

    def default_features(self) -> FeatureKeys:
        """The feature keys a run of this input gets when its config leaves `features` alone: TF's
        detection keys for COCO/VOC, image-level class keys for label lists, else imgrec's own."""
        if self.detection:
            return DETECTION_KEYS
        return MULTI_LABEL_KEYS if self.multi_label else FeatureKeys()


@dataclasses.dataclass(frozen=True)
class AnnotationSpec:
    """What detection records hold beyond boxes and classes (COCO and VOC inputs)."""

    masks: bool = False  # image/object/mask: a PNG per object, from COCO polygons or RLE
    # center_crop: a box left with less than this fraction of its area is dropped (counted).
    min_visible: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.min_visible <= 1:
            raise ValueError(f"min_visible must be in [0, 1]; got {self.min_visible}")


@dataclasses.dataclass(frozen=True)
class ConversionSpec:
    """Everything a run needs; stored verbatim in metadata.json as the effective config."""

    input: InputSpec
    output: OutputSpec
    image: ImageSpec = ImageSpec()
    features: FeatureKeys = FeatureKeys()
    splits: SplitSpec = SplitSpec()
    annotations: AnnotationSpec = AnnotationSpec()

    def __post_init__(self) -> None:
        kind = self.input.resolved_kind
        objects = self.input.detection
        if (objects or self.input.multi_label) and self.splits.method == "stratified":
            what = "have several labels" if self.input.multi_label else "have objects"
            raise ValueError(f"split_method=stratified needs one label per image; {kind} images {what}, so "
                             "they are split by hash (split_method=hash)")
        if objects and self.image.encoding == "raw":
            raise ValueError("detection records hold JPEG or PNG images, which TF's detection decoders read; "
                             "use encoding=jpeg or png")
        if self.annotations.masks and kind != "coco":
            raise ValueError(f"masks are made from COCO segmentations; the input is {kind}")
        if self.annotations.min_visible != AnnotationSpec.min_visible and not (
                objects and self.image.resize_mode == "center_crop"):  # given where it does nothing: a mistake
            raise ValueError("min_visible is the part of a COCO or VOC box a center crop must leave; " + (
                f"resize_mode={self.image.resize_mode} keeps every box whole" if objects else f"the input is {kind}"))
        if objects and self.features not in (FeatureKeys(), DETECTION_KEYS):
            raise ValueError("detection records have the feature keys TF's detection decoders read; features "
                             "cannot be renamed for them")

    def to_dict(self) -> dict:
        """The settings that apply (`annotations` for COCO and VOC inputs only); a COCO or VOC
        input's kind as resolved, since which it was decides the records' features (VOC's
        difficult and truncated) and the input may be gone when the dataset is verified."""
        settings = {**dataclasses.asdict(self), "image": self.image.used_settings()}
        if self.input.detection:
            settings["input"]["kind"] = self.input.resolved_kind
        else:
            del settings["annotations"]
        return settings
