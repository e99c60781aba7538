"""Build serialized `tf.train.Example` records, and describe them for readers.

Workers serialize Examples without importing TensorFlow: importing it costs each Beam worker
process ~5 s and ~400 MB of RSS before it has decoded one image, and the worker image would need
it. The wire format of `Example` is small and frozen (tensorflow/core/example/example.proto and
feature.proto), so it is encoded here directly, with map entries in sorted key order so that the
same inputs always give the same bytes. Tests parse every layout back with TensorFlow.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Union

import cv2
import numpy as np

from transforms.inputs.labels import label_list
from transforms.specs import FeatureKeys, ImageSpec


@dataclasses.dataclass(frozen=True)
class ListFeature:
    """A list-valued feature (a box coordinate per object, several labels): `kind` is bytes,
    int64 or float, stated, since an empty list has no values to tell it by."""

    kind: str
    values: tuple

    def __post_init__(self) -> None:
        if self.kind not in _LIST_KINDS:
            raise ValueError(f"list feature kind must be one of {', '.join(_LIST_KINDS)}; got {self.kind!r}")


FeatureValue = Union[bytes, int, float, ListFeature]

# Field numbers and wire types from example.proto / feature.proto.
_LENGTH_DELIMITED = 2
_EXAMPLE_FEATURES = 1
_FEATURES_MAP = 1
_MAP_KEY, _MAP_VALUE = 1, 2
_FEATURE_BYTES, _FEATURE_FLOAT, _FEATURE_INT64 = 1, 2, 3
_LIST_VALUE = 1
_LIST_KINDS = ("bytes", "int64", "float")


def _varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # negative int64s are encoded as 10-byte two's complement
    out = bytearray()
    while value > 0x7F:  # 7 bits a byte, low first; the high bit says more follow
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(number: int, length: int) -> bytes:
    """Key and length prefix of a length-delimited field whose payload is `length` bytes."""
    return _varint(number << 3 | _LENGTH_DELIMITED) + _varint(length)


def _field(number: int, payload: bytes) -> bytes:
    return _tag(number, len(payload)) + payload


def _list_feature(feature: ListFeature) -> bytes:
    """Int64List and FloatList are packed (one length-delimited run), BytesList one field per
    value, as protobuf serializes them; an empty list is an empty list message."""
    if feature.kind == "bytes":
        return _field(_FEATURE_BYTES, b"".join(_field(_LIST_VALUE, bytes(value)) for value in feature.values))
    if any(isinstance(value, (bool, np.bool_)) for value in feature.values):
        raise TypeError("booleans are not a tf.train.Example feature type")
    if feature.kind == "int64":
        number, packed = _FEATURE_INT64, b"".join(_varint(int(value)) for value in feature.values)
    else:
        number, packed = _FEATURE_FLOAT, np.asarray(feature.values, "<f4").tobytes()
    return _field(number, _field(_LIST_VALUE, packed) if packed else b"")


@functools.lru_cache(maxsize=None)
def _key_field(key: str) -> bytes:
    return _field(_MAP_KEY, key.encode("utf-8"))


def _map_entry(key: str, feature: bytes) -> bytes:
    return _field(_FEATURES_MAP, _key_field(key) + _field(_MAP_VALUE, feature))


@functools.lru_cache(maxsize=16384)
def _scalar_entry(key: str, kind: type, value: Union[int, float]) -> bytes:
    """A scalar's map entry, cached: records repeat the same few (height, width, label ids). Its
    value is a one-value list, which is what protobuf writes for a scalar too."""
    if isinstance(value, (int, np.integer, np.bool_)):  # booleans: refused by _list_feature
        return _map_entry(key, _list_feature(ListFeature("int64", (value,))))
    if isinstance(value, (float, np.floating)):
        return _map_entry(key, _list_feature(ListFeature("float", (value,))))
    raise TypeError(f"unsupported feature value type {type(value).__name__}")


def _bytes_head(key: str, length: int) -> bytes:
    """The map entry of a bytes value of `length` bytes, up to the value itself: the value stays
    a chunk of its own, so a record is assembled with one copy of it (raw float32 224x224 pixels
    are 600 KB)."""
    head = _tag(_LIST_VALUE, length)
    head = _tag(_FEATURE_BYTES, len(head) + length) + head
    head = _key_field(key) + _tag(_MAP_VALUE, len(head) + length) + head
    return _tag(_FEATURES_MAP, len(head) + length) + head


def serialize_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serializes `{key: value}` as a `tf.train.Example`, deterministically (keys sorted)."""
    return b"".join(_example_chunks(features)[0])


def _example_chunks(features: Mapping[str, FeatureValue], locate: str = "") -> tuple[list, int]:
    """The record as a flat list of chunks (lengths are known up front, so it is joined once),
    and the offset of `locate`'s bytes value in it (-1 if absent)."""
    chunks: list = []
    size = 0
    located = -1
    for key, value in sorted(features.items()):
        if isinstance(value, (bytes, bytearray, memoryview)):
            head = _bytes_head(key, memoryview(value).nbytes)
            if key == locate:
                located = size + len(head)
            chunks += (head, value)
            size += len(head) + memoryview(value).nbytes
        else:
            entry = (_map_entry(key, _list_feature(value)) if isinstance(value, ListFeature)
                     else _scalar_entry(key, type(value), value))
            chunks.append(entry)
            size += len(entry)
    head = _tag(_EXAMPLE_FEATURES, size)
    return [head, *chunks], located + len(head) if located >= 0 else -1


def locates_image(data: bytes, image_offset: int, image_length: int, content_hash: str, image_key: str) -> bool:
    """Whether one record's `data` holds the value of its `image_key` feature, exactly
    `image_length` bytes, at `image_offset` (what a record index line claims) and the content
    hash as a bytes value elsewhere (the content_hash feature, which a dataset must have to be
    reused): a damaged or edited index must never give an image another image's pixels, shifted
    ones, or another feature's bytes (its label text)."""
    head = _bytes_head(image_key, image_length)
    end = image_offset + image_length
    if image_offset < len(head) or end > len(data) or data[image_offset - len(head):image_offset] != head:
        return False
    if end < len(data) and data[end] != _tag(_FEATURES_MAP, 0)[0]:  # the next map entry, or the end
        return False
    digest = content_hash.encode("ascii")
    stored = _tag(_LIST_VALUE, len(digest)) + digest
    return stored in data[:image_offset - len(head)] or stored in data[end:]


def encode_pixels(image: np.ndarray, spec: ImageSpec) -> bytes:
    """The stored image bytes: the array itself for `raw`, else a re-encoded JPEG/PNG."""
    if spec.encoding == "raw":
        return np.ascontiguousarray(image, dtype=image.dtype.newbyteorder("<")).tobytes()
    bgr = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    if spec.encoding == "jpeg":
        ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, spec.quality])
    else:
        ok, buf = cv2.imencode(".png", bgr, [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:
        raise RuntimeError(f"OpenCV could not encode a {image.shape} image as {spec.encoding}")
    return buf.tobytes()


@dataclasses.dataclass(frozen=True)
class RecordFields:
    """What one record says about its image besides the pixels."""

    label: Union[int, tuple[int, ...]]  # a multi-label image's: one id per label of `label_text`
    label_text: str
    source_path: str
    content_hash: str


@dataclasses.dataclass(frozen=True)
class EncodedRecord:
    """A serialized Example and where its image bytes sit inside it (for the record index)."""

    data: bytes
    image_offset: int
    image_length: int


def build_example(pixels: bytes, fields: RecordFields, spec: ImageSpec, keys: FeatureKeys, *,
                  size: tuple[int, int]) -> EncodedRecord:
    """The serialized record for one image; features whose key is empty are left out. `size`
    (width, height) is the image's own, which resize_mode=none records store in place of the spec's."""
    height, width, channels = spec.shape
    if not spec.resizes:
        width, height = size
    # surrogateescape: a file or folder name that is not UTF-8 keeps its original bytes
    label: FeatureValue = fields.label
    text: FeatureValue = fields.label_text.encode("utf-8", "surrogateescape")
    if isinstance(fields.label, tuple):  # multi-label: a list of ids and the list of their texts
        label = ListFeature("int64", fields.label)
        text = ListFeature("bytes", tuple(t.encode("utf-8", "surrogateescape") for t in label_list(fields.label_text)))
    values: dict[str, FeatureValue] = {
        keys.image: pixels,
        keys.label: label,
        keys.label_text: text,
        keys.height: height,
        keys.width: width,
        keys.channels: channels,
        keys.source_path: fields.source_path.encode("utf-8", "surrogateescape"),
        keys.content_hash: fields.content_hash.encode("ascii"),
    }
    return encode_record({key: value for key, value in values.items() if key}, keys.image)


def encode_record(features: Mapping[str, FeatureValue], image_key: str) -> EncodedRecord:
    """The serialized Example and where the bytes value of `image_key` sits in it."""
    chunks, image_offset = _example_chunks(features, image_key)
    return EncodedRecord(b"".join(chunks), image_offset, memoryview(features[image_key]).nbytes)


def image_description(spec: ImageSpec) -> dict:
    """metadata.json's `image` section: the stored image at a glance."""
    height, width, channels = spec.shape
    return {"height": height, "width": width, "channels": channels, "dtype": spec.dtype, "encoding": spec.encoding}


def feature_spec(spec: ImageSpec, keys: FeatureKeys, multi_label: bool = False) -> dict[str, dict]:
    """The parse spec a reader needs, as JSON: {key: {"kind", "dtype", ...}} for metadata.json;
    a multi-label dataset's labels and label texts are lists (`kind: var_len`)."""
    lists = {"kind": "var_len"} if multi_label else {}
    described = {
        keys.image: {"role": "image", "dtype": "string", "encoding": spec.encoding,
                     "pixel_dtype": spec.dtype, "shape": list(spec.shape), "normalize": spec.normalize,
                     **({"mean": list(spec.mean), "std": list(spec.std)} if spec.normalize == "mean_std" else {})},
        keys.label: {"role": "label", "dtype": "int64", **lists},
        keys.label_text: {"role": "label_text", "dtype": "string", **lists},
        keys.height: {"role": "height", "dtype": "int64"},
        keys.width: {"role": "width", "dtype": "int64"},
        keys.channels: {"role": "channels", "dtype": "int64"},
        keys.source_path: {"role": "source_path", "dtype": "string"},
        keys.content_hash: {"role": "content_hash", "dtype": "string"},
    }
    return {key: value for key, value in described.items() if key}
