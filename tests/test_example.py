"""transforms.write.example: tf.train.Example records built without TensorFlow, parsed back with it."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from transforms.images.normalize import normalize_image
from transforms.specs import FeatureKeys, ImageSpec
from transforms.write.example import (
    EncodedRecord,
    RecordFields,
    build_example,
    encode_pixels,
    feature_spec,
    locates_image,
    serialize_example,
)

pytestmark = pytest.mark.unit


def random_image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (5, 7, 3), dtype=np.uint8)


FIELDS = RecordFields(label=3, label_text="cat", source_path="/data/cat/1.jpg", content_hash="ab" * 32)


DEFAULT_KEYS = FeatureKeys()


def parse(record: bytes, spec: ImageSpec, keys: FeatureKeys = DEFAULT_KEYS) -> dict:
    """Parses with TensorFlow using the parse spec that feature_spec() describes."""
    dtypes = {"string": tf.string, "int64": tf.int64}
    parse_spec = {key: tf.io.FixedLenFeature([], dtypes[d["dtype"]]) for key, d in feature_spec(spec, keys).items()}
    return {k: v.numpy() for k, v in tf.io.parse_single_example(record, parse_spec).items()}


def record_for(image: np.ndarray, spec: ImageSpec, fields: RecordFields = FIELDS,
               keys: FeatureKeys = DEFAULT_KEYS) -> bytes:
    return build_example(encode_pixels(image, spec), fields, spec, keys, size=(image.shape[1], image.shape[0])).data


@pytest.mark.parametrize("spec,dtype", [
    (ImageSpec(height=5, width=7, normalize="none", encoding="raw"), tf.uint8),
    (ImageSpec(height=5, width=7, normalize="unit", encoding="raw"), tf.float32),
], ids=["uint8", "float32"])
def test_raw_records_parse_with_tensorflow(spec, dtype):
    pixels = normalize_image(random_image(), spec)
    parsed = parse(record_for(pixels, spec), spec)
    decoded = tf.reshape(tf.io.decode_raw(parsed["image"], dtype), spec.shape).numpy()
    np.testing.assert_array_equal(decoded, pixels)
    assert parsed["label"] == 3 and parsed["label/text"] == b"cat"
    assert (parsed["image/height"], parsed["image/width"], parsed["image/channels"]) == (5, 7, 3)
    assert parsed["image/source_path"] == b"/data/cat/1.jpg" and parsed["image/sha256"] == b"ab" * 32


def test_jpeg_record_parses_and_decodes_with_tensorflow():
    spec = ImageSpec(height=16, width=24, normalize="none", encoding="jpeg", quality=95)
    pixels = np.full((16, 24, 3), (200, 100, 50), np.uint8)
    parsed = parse(record_for(pixels, spec), spec)
    assert parsed["image"][:2] == b"\xff\xd8"
    decoded = tf.io.decode_jpeg(parsed["image"]).numpy()
    assert decoded.shape == (16, 24, 3)
    np.testing.assert_allclose(decoded, pixels, atol=3)


FIELD_CASES = {
    "plain": FIELDS,
    "negative-unicode": RecordFields(label=-5, label_text="négatif ☃ 猫", source_path="/données/☃.jpg",
                                     content_hash="00" * 32),
    "int64-min-empty": RecordFields(label=-(2**63), label_text="", source_path="", content_hash=""),
    "int64-max": RecordFields(label=2**63 - 1, label_text="x", source_path="y", content_hash="z"),
}
SMALL = ImageSpec(height=5, width=7, normalize="none")


@pytest.mark.parametrize("fields", FIELD_CASES.values(), ids=FIELD_CASES.keys())
def test_example_fields_round_trip(fields):
    example = tf.train.Example.FromString(record_for(random_image(), SMALL, fields))
    feature = example.features.feature
    assert feature["label"].int64_list.value == [fields.label]
    assert feature["label/text"].bytes_list.value[0].decode("utf-8") == fields.label_text
    assert feature["image/source_path"].bytes_list.value[0].decode("utf-8") == fields.source_path
    assert feature["image/sha256"].bytes_list.value[0].decode("ascii") == fields.content_hash


# Loads TensorFlow's generated example_pb2 on protobuf's pure-Python runtime (without importing the
# TensorFlow runtime), whose deterministic serialization sorts map keys with Python's sorted(),
# i.e. bytewise like C++. upb (the default Python runtime) sorts a key that is a prefix of another
# ("image" / "image/height") after it (its map sorter's length tie-break is not reversed along with
# its memcmp order), so SerializeToString(deterministic=True) there disagrees with C++ for our keys.
_PURE_PYTHON_REFERIALIZE = """
import importlib.util, json, pathlib, sys, types
root = pathlib.Path(importlib.util.find_spec("tensorflow").submodule_search_locations[0])
for name in ("tensorflow", "tensorflow.core", "tensorflow.core.example"):
    module = sys.modules[name] = types.ModuleType(name)
    module.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
from google.protobuf.internal import api_implementation
from tensorflow.core.example import example_pb2
assert api_implementation.Type() == "python"
records = [bytes.fromhex(r) for r in json.load(sys.stdin)]
print(json.dumps([example_pb2.Example.FromString(r).SerializeToString(deterministic=True).hex() for r in records]))
"""


def pure_python_deterministic(records: list[bytes]) -> list[bytes]:
    result = subprocess.run([sys.executable, "-c", _PURE_PYTHON_REFERIALIZE],
                            input=json.dumps([r.hex() for r in records]),
                            capture_output=True, text=True, check=True,
                            env={"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"})
    return [bytes.fromhex(r) for r in json.loads(result.stdout)]


def test_records_are_protobuf_deterministic_serializations():
    records = [record_for(random_image(), SMALL, fields) for fields in FIELD_CASES.values()]
    records.append(build_example(b"px", FIELDS, SMALL, FeatureKeys(label_text="", source_path=""), size=(7, 5)).data)
    assert pure_python_deterministic(records) == records


def test_serialize_example_value_types_match_tensorflow():
    values = {"b": b"\x00\xff", "i": -1, "f": 0.5, "n": np.int64(7), "g": np.float32(-2.25), "u": 2**40}
    ours = serialize_example(values)
    example = tf.train.Example.FromString(ours)
    feature = example.features.feature
    assert feature["b"].bytes_list.value == [b"\x00\xff"]
    assert feature["i"].int64_list.value == [-1] and feature["n"].int64_list.value == [7]
    assert feature["u"].int64_list.value == [2**40]
    assert feature["f"].float_list.value == [0.5] and feature["g"].float_list.value == [-2.25]
    assert ours == example.SerializeToString(deterministic=True)  # no key is a prefix of another (see above)
    assert ours == serialize_example(dict(reversed(list(values.items()))))


@pytest.mark.parametrize("value", [True, np.bool_(False), "text", None, [1, 2]])
def test_serialize_example_rejects_unsupported_types(value):
    with pytest.raises(TypeError):
        serialize_example({"x": value})


def test_empty_feature_keys_are_omitted():
    keys = FeatureKeys(label_text="", source_path="", content_hash="", channels="", image="pixels")
    spec = ImageSpec(height=5, width=7, normalize="none")
    record = record_for(random_image(), spec, keys=keys)
    written = set(tf.train.Example.FromString(record).features.feature)
    assert written == {"pixels", "label", "image/height", "image/width"}
    assert set(feature_spec(spec, keys)) == written
    assert parse(record, spec, keys)["label"] == 3


@pytest.mark.parametrize("spec", [ImageSpec(normalize="none"), ImageSpec(normalize="unit", encoding="raw"),
                                  ImageSpec(normalize="none", encoding="png")], ids=["uint8", "float32", "png"])
def test_feature_spec_matches_what_build_example_writes(spec):
    record = build_example(b"pixels", FIELDS, spec, FeatureKeys(), size=(224, 224)).data
    feature = tf.train.Example.FromString(record).features.feature
    described = feature_spec(spec, FeatureKeys())
    assert set(described) == set(feature)
    kinds = {"string": "bytes_list", "int64": "int64_list"}
    assert {k: kinds[d["dtype"]] for k, d in described.items()} == {k: f.WhichOneof("kind") for k, f in feature.items()}
    image = described["image"]
    assert (image["encoding"], image["pixel_dtype"], image["shape"]) == (spec.encoding, spec.dtype, [224, 224, 3])


def test_the_image_size_is_required_whether_the_spec_resizes_or_not():
    """resize_mode=none records store the image's size; a call without it failed only with such a
    spec, unpacking None, and went unnoticed with the others."""
    for spec in (SMALL, ImageSpec(resize_mode="none", encoding="png")):
        with pytest.raises(TypeError, match="size"):
            build_example(b"px", FIELDS, spec, FeatureKeys())
    record = build_example(b"px", FIELDS, ImageSpec(resize_mode="none", encoding="png"), FeatureKeys(), size=(9, 4))
    feature = tf.train.Example.FromString(record.data).features.feature
    assert (feature["image/width"].int64_list.value, feature["image/height"].int64_list.value) == ([9], [4])


# ----------------------------------------------------------------------------- image location

KEY_LAYOUTS = {
    "default": FeatureKeys(),
    "image-sorts-last": FeatureKeys(image="z/pixels"),
    "image-sorts-first": FeatureKeys(image="a", label="b"),
    "seed": FeatureKeys(image="train/image", label="train/label", label_text="", height="", width="", channels="",
                        source_path="", content_hash=""),
}


@pytest.mark.parametrize("keys", KEY_LAYOUTS.values(), ids=KEY_LAYOUTS.keys())
@pytest.mark.parametrize("fields", FIELD_CASES.values(), ids=FIELD_CASES.keys())
def test_image_offset_and_length_locate_the_pixels(keys, fields):
    """The record index stores where the image bytes sit, so an incremental run can copy them."""
    spec = ImageSpec(height=5, width=7, normalize="unit", encoding="raw")
    pixels = encode_pixels(normalize_image(random_image(), spec), spec)
    record = build_example(pixels, fields, spec, keys, size=(7, 5))
    assert isinstance(record, EncodedRecord)
    assert record.image_length == len(pixels) == 5 * 7 * 3 * 4
    assert record.data[record.image_offset:record.image_offset + record.image_length] == pixels
    parsed = tf.train.Example.FromString(record.data).features.feature[keys.image].bytes_list.value[0]
    assert parsed == pixels
    # Rebuilding the record around the located bytes gives the same record (what reuse does).
    located = record.data[record.image_offset:record.image_offset + record.image_length]
    assert build_example(located, fields, spec, keys, size=(7, 5)) == record


@pytest.mark.parametrize("keys", KEY_LAYOUTS.values(), ids=KEY_LAYOUTS.keys())
def test_a_record_index_entry_is_checked_against_the_record(keys):
    """What an incremental run and `verify` check before trusting an index line."""
    spec = ImageSpec(height=5, width=7, normalize="none")
    record = build_example(encode_pixels(random_image(), spec), FIELDS, spec, keys, size=(7, 5))
    offset, length, digest = record.image_offset, record.image_length, FIELDS.content_hash
    image_key = keys.image
    if not keys.content_hash:  # no hash stored: nothing can be checked, so reuse refuses such datasets
        assert not locates_image(record.data, offset, length, digest, image_key)
        return
    assert locates_image(record.data, offset, length, digest, image_key)
    assert not locates_image(record.data, offset, length, "cd" * 32, image_key)  # another image's record
    for shift in (-8, -1, 1, 8):  # a window that is not the image value
        assert not locates_image(record.data, offset + shift, length, digest, image_key), shift
    assert not locates_image(record.data, offset, length - 1, digest, image_key)
    assert not locates_image(record.data, offset, len(record.data), digest, image_key)  # beyond the record
    assert not locates_image(record.data, offset, length, digest, "other/key")
    if keys.label_text:  # another bytes feature's value, framed like the image's, is not the image
        text = FIELDS.label_text.encode()
        at = record.data.index(bytes([0x0A, len(text)]) + text) + 2
        assert not locates_image(record.data, at, len(text), digest, image_key)


def test_image_location_with_a_large_image():
    """Length prefixes of 1-3 varint bytes shift the offset; 224x224 float32 needs 3."""
    spec = ImageSpec(normalize="unit", encoding="raw")
    pixels = np.random.default_rng(2).random(spec.shape, dtype=np.float32).tobytes()
    record = build_example(memoryview(pixels), FIELDS, spec, FeatureKeys(), size=(224, 224))
    assert record.data[record.image_offset:record.image_offset + record.image_length] == pixels


def test_encode_pixels():
    image = random_image()
    raw = ImageSpec(height=5, width=7, normalize="none", encoding="raw")
    assert encode_pixels(image, raw) == image.tobytes()
    unit = ImageSpec(height=5, width=7, normalize="unit", encoding="raw")
    as_float = normalize_image(image, unit)
    assert encode_pixels(as_float, unit) == as_float.astype("<f4").tobytes()
    big_endian = as_float.astype(">f4")
    assert encode_pixels(big_endian, unit) == as_float.astype("<f4").tobytes()  # always little-endian
    png = ImageSpec(height=5, width=7, normalize="none", encoding="png")
    np.testing.assert_array_equal(tf.io.decode_png(encode_pixels(image, png)).numpy(), image)  # lossless, RGB
