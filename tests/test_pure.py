"""Unit tests of the pure functions behind the pipeline: no Beam pipeline is run here."""
from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import tensorflow as tf

from pipeline.metadata import CountMismatch, TooManyErrors, build_metadata, check_error_fraction
from pipeline.options import ImgrecOptions, beam_args_from_config, build_spec, read_config
from pipeline.publish import DatasetExists, prepare_output, publish, staging_root
from transforms.discover import Candidate, ParseManifestLine, label_from_parent, parse_csv_line, parse_jsonl_line
from transforms.example import RecordFields, build_example, encode_pixels, feature_spec, serialize_example
from transforms.labels import build_label_map
from transforms.normalize import normalize_image
from transforms.rejections import BadManifestLine
from transforms.resize import resize_image
from transforms.specs import ConversionSpec, FeatureKeys, ImageSpec, InputSpec, OutputSpec, SplitSpec
from transforms.split import (assign_split, num_shards_for, order_in_shard, shard_for, split_counts,
                              stable_hash, stratified_splits)

REPO = Path(__file__).resolve().parents[1]
OUT_H, OUT_W = 64, 48
RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)
KEYS = [f"key-{i}" for i in range(10_000)]


def thirds(height: int, width: int, dtype=np.uint8) -> np.ndarray:
    """An image whose first, middle and last thirds along its long side are red, green, blue."""
    img = np.zeros((height, width, 3), dtype)
    long_side = max(height, width)
    for i, color in enumerate((RED, GREEN, BLUE)):
        part = slice(i * long_side // 3, (i + 1) * long_side // 3)
        if width >= height:
            img[:, part] = color
        else:
            img[part, :] = color
    return img


# ----------------------------------------------------------------------------- resize

@pytest.mark.parametrize("in_shape", [(100, 300), (300, 100)], ids=["wide", "tall"])
@pytest.mark.parametrize("mode", ["stretch", "center_crop", "pad"])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_resize_shape_and_dtype(in_shape, mode, dtype):
    out = resize_image(thirds(*in_shape, dtype), ImageSpec(height=OUT_H, width=OUT_W, resize_mode=mode))
    assert out.shape == (OUT_H, OUT_W, 3)
    assert out.dtype == dtype


@pytest.mark.parametrize("in_shape", [(100, 300), (400, 100)], ids=["wide", "tall"])
def test_center_crop_keeps_the_middle(in_shape):
    # The crop keeps the middle 48/192 columns (wide) or 64/192 rows (tall): inside the green third.
    spec = ImageSpec(height=OUT_H, width=OUT_W, resize_mode="center_crop", interpolation="nearest")
    out = resize_image(thirds(*in_shape), spec)
    assert (out == GREEN).all()


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_pad_letterboxes_with_pad_value(dtype):
    # 100x300 (h x w) scales by 48/300 to 16x48, centered vertically in 64x48: rows 24..39.
    spec = ImageSpec(height=OUT_H, width=OUT_W, resize_mode="pad", pad_value=7, interpolation="nearest")
    out = resize_image(np.full((100, 300, 3), 200, dtype), spec)
    assert (out[:24] == 7).all() and (out[40:] == 7).all()
    assert (out[24:40] == 200).all()


def test_pad_tall_image_is_centered_horizontally():
    # 300x100 scales by 64/300 to 64x21 (rounded), centered in 48 columns: 13 left, 14 right.
    spec = ImageSpec(height=OUT_H, width=OUT_W, resize_mode="pad", pad_value=0, interpolation="nearest")
    out = resize_image(np.full((300, 100, 3), 255, np.uint8), spec)
    content = np.flatnonzero(out[OUT_H // 2, :, 0])
    assert (content[0], content[-1]) == (13, 33)
    assert (out[:, :13] == 0).all() and (out[:, 34:] == 0).all()


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_stretch_cubic_equals_opencv(dtype):
    img = (np.random.default_rng(0).random((100, 300, 3)) * 255).astype(dtype)
    out = resize_image(img, ImageSpec(height=OUT_H, width=OUT_W, resize_mode="stretch", interpolation="cubic"))
    np.testing.assert_array_equal(out, cv2.resize(img, (OUT_W, OUT_H), interpolation=cv2.INTER_CUBIC))


# ----------------------------------------------------------------------------- normalize

def random_image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (5, 7, 3), dtype=np.uint8)


def test_normalize_none_returns_uint8_unchanged():
    img = random_image()
    out = normalize_image(img, ImageSpec(normalize="none"))
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, img)


def test_normalize_unit_is_bit_exact():
    img = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=2)
    out = normalize_image(img, ImageSpec(normalize="unit"))
    assert out.dtype == np.float32
    assert out.tobytes() == (img.astype(np.float32) / 255.0).tobytes()
    assert out.min() == 0.0 and out.max() == 1.0


def test_normalize_mean_std_by_hand():
    spec = ImageSpec(normalize="mean_std", mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 2.0))
    img = np.array([[[255, 0, 51]]], np.uint8)
    # ((255/255 - .5) / .5, (0 - .25) / .25, (51/255 - 0) / 2)
    np.testing.assert_allclose(normalize_image(img, spec), [[[1.0, -1.0, 0.1]]], rtol=1e-6)
    assert normalize_image(img, spec).dtype == np.float32


# ----------------------------------------------------------------------------- split

def test_stable_hash_is_the_same_in_another_process():
    code = "from transforms.split import stable_hash; print(stable_hash('salt', 'some/key.jpg'))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            check=True, env={"PYTHONHASHSEED": "random"})
    assert int(result.stdout) == stable_hash("salt", "some/key.jpg")
    assert stable_hash("salt", "some/key.jpg") == stable_hash("salt", "some/key.jpg")
    assert stable_hash("a", "b") != stable_hash("ab")


def test_assign_split_is_deterministic():
    spec = SplitSpec()
    assert [assign_split(k, spec) for k in KEYS[:500]] == [assign_split(k, spec) for k in KEYS[:500]]


def test_assign_split_ratios_on_10000_keys():
    spec = SplitSpec(ratios=(0.7, 0.2, 0.1))
    counts = collections.Counter(assign_split(k, spec) for k in KEYS)
    for name, ratio in zip(spec.names, spec.ratios):
        assert abs(counts[name] / len(KEYS) - ratio) <= 0.015, counts


def test_salt_changes_assignments():
    a, b = SplitSpec(salt="one"), SplitSpec(salt="two")
    changed = sum(assign_split(k, a) != assign_split(k, b) for k in KEYS[:1000])
    assert changed > 300  # independent draws differ with probability 1 - (.49 + .04 + .01)


@pytest.mark.parametrize("total,expected", [
    (0, [0, 0, 0]), (1, [1, 0, 0]), (3, [2, 1, 0]), (7, [5, 1, 1]), (10, [7, 2, 1]), (100, [70, 20, 10]),
])
def test_split_counts_largest_remainder(total, expected):
    assert split_counts(total, (0.7, 0.2, 0.1)) == expected


@pytest.mark.parametrize("ratios", [(0.7, 0.2, 0.1), (1 / 3, 1 / 3, 1 / 3), (0.5, 0.5), (1.0,), (0.9, 0.0, 0.1)])
def test_split_counts_sum_to_total(ratios):
    for total in range(300):
        assert sum(split_counts(total, ratios)) == total


@pytest.mark.parametrize("ratios", [(0.5, 0.4999991), (0.5, 0.5000009)], ids=["under", "over"])
def test_split_counts_sum_to_total_with_tolerated_ratio_error(ratios):
    SplitSpec(names=("a", "b"), ratios=ratios)  # accepted as summing to 1
    assert sum(split_counts(10_000_000, ratios)) == 10_000_000


def test_stratified_splits_exact_counts():
    spec = SplitSpec(ratios=(0.7, 0.2, 0.1))
    for n in (1, 7, 10, 33, 100):
        assignment = stratified_splits(KEYS[:n], spec)
        assert set(assignment) == set(KEYS[:n])
        counts = collections.Counter(assignment.values())
        assert [counts[name] for name in spec.names] == split_counts(n, spec.ratios)
    assert stratified_splits(KEYS[:50], spec) == stratified_splits(reversed(KEYS[:50]), spec)


@pytest.mark.parametrize("image,output,num_examples,expected", [
    (ImageSpec(), OutputSpec("o", num_shards=5), 10**6, 5),
    (ImageSpec(), OutputSpec("o", num_shards=5), 0, 5),
    (ImageSpec(), OutputSpec("o"), 0, 1),
    # uint8 raw 224x224: 150528 + 512 bytes per record; 1000 records = 151.04 MB
    (ImageSpec(normalize="none"), OutputSpec("o"), 1000, 1),
    (ImageSpec(normalize="none"), OutputSpec("o", target_shard_bytes=10 * 2**20), 1000, 15),
    # float32: 602112 + 512 bytes per record
    (ImageSpec(normalize="unit"), OutputSpec("o", target_shard_bytes=10 * 2**20), 1000, 58),
], ids=["explicit", "explicit-empty", "auto-empty", "auto-one", "auto-uint8", "auto-float32"])
def test_num_shards_for(image, output, num_examples, expected):
    assert num_shards_for(num_examples, image, output) == expected


def test_shard_for_in_range_and_roughly_uniform():
    counts = collections.Counter(shard_for(k, 0, 8) for k in KEYS)
    assert set(counts) == set(range(8))
    assert all(abs(n - len(KEYS) / 8) < 0.1 * len(KEYS) / 8 for n in counts.values()), counts
    assert [shard_for(k, 0, 8) for k in KEYS[:100]] != [shard_for(k, 1, 8) for k in KEYS[:100]]


def test_order_in_shard_depends_on_seed():
    def order(seed):
        return sorted(KEYS[:100], key=lambda k: order_in_shard(k, seed))

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert order(0) != KEYS[:100]


# ----------------------------------------------------------------------------- labels

@pytest.mark.parametrize("labels,class_names,expected", [
    (["dog", "cat", "Zebra", "apple", "cat"], None, {"Zebra": 0, "apple": 1, "cat": 2, "dog": 3}),
    (["10", "2", "0", "2"], None, {"0": 0, "2": 2, "10": 10}),
    (["-1", "5"], None, {"-1": -1, "5": 5}),
    (["1", "01"], None, {"01": 0, "1": 1}),
    (["1", "cat"], None, {"1": 0, "cat": 1}),
    (["cat", "dog", "bird"], ("dog", "cat"), {"dog": 0, "cat": 1}),
    ([], None, {}),
], ids=["names", "ints", "negative-int", "non-canonical-int", "mixed", "class-names", "empty"])
def test_build_label_map(labels, class_names, expected):
    assert build_label_map(labels, class_names) == expected


def test_label_map_order_is_python_sorted_like_keras():
    names = ["b", "B", "a_1", "a-1", "a", "Ä", "10", "9x"]
    assert list(build_label_map(names)) == sorted(names)


# ----------------------------------------------------------------------------- example

FIELDS = RecordFields(label=3, label_text="cat", source_path="/data/cat/1.jpg", content_hash="ab" * 32)


def parse(record: bytes, spec: ImageSpec, keys: FeatureKeys = FeatureKeys()) -> dict:
    """Parses with TensorFlow using the parse spec that feature_spec() describes."""
    dtypes = {"string": tf.string, "int64": tf.int64}
    parse_spec = {key: tf.io.FixedLenFeature([], dtypes[d["dtype"]]) for key, d in feature_spec(spec, keys).items()}
    return {k: v.numpy() for k, v in tf.io.parse_single_example(record, parse_spec).items()}


def record_for(image: np.ndarray, spec: ImageSpec, fields: RecordFields = FIELDS,
               keys: FeatureKeys = FeatureKeys()) -> bytes:
    return build_example(encode_pixels(image, spec), fields, spec, keys)


@pytest.mark.parametrize("spec,dtype", [
    (ImageSpec(height=5, width=7, normalize="none"), tf.uint8),
    (ImageSpec(height=5, width=7, normalize="unit"), tf.float32),
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
    result = subprocess.run([sys.executable, "-c", _PURE_PYTHON_REFERIALIZE], input=json.dumps([r.hex() for r in records]),
                            capture_output=True, text=True, check=True,
                            env={"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"})
    return [bytes.fromhex(r) for r in json.loads(result.stdout)]


def test_records_are_protobuf_deterministic_serializations():
    records = [record_for(random_image(), SMALL, fields) for fields in FIELD_CASES.values()]
    records.append(build_example(b"px", FIELDS, SMALL, FeatureKeys(label_text="", source_path="")))
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


@pytest.mark.parametrize("spec", [ImageSpec(normalize="none"), ImageSpec(normalize="unit"),
                                  ImageSpec(normalize="none", encoding="png")], ids=["uint8", "float32", "png"])
def test_feature_spec_matches_what_build_example_writes(spec):
    record = build_example(b"pixels", FIELDS, spec, FeatureKeys())
    feature = tf.train.Example.FromString(record).features.feature
    described = feature_spec(spec, FeatureKeys())
    assert set(described) == set(feature)
    kinds = {"string": "bytes_list", "int64": "int64_list"}
    assert {k: kinds[d["dtype"]] for k, d in described.items()} == {k: f.WhichOneof("kind") for k, f in feature.items()}
    image = described["image"]
    assert (image["encoding"], image["pixel_dtype"], image["shape"]) == (spec.encoding, spec.dtype, [224, 224, 3])


# ----------------------------------------------------------------------------- discover

MANIFEST = "/data/manifests/train.csv"


@pytest.mark.parametrize("parse_line,line,expected", [
    (parse_csv_line, "cat/1.jpg,cat", Candidate("/data/manifests/cat/1.jpg", "cat")),
    (parse_csv_line, "../img/1.jpg, dog ", Candidate("/data/manifests/../img/1.jpg", "dog")),
    (parse_csv_line, "/abs/1.jpg,cat", Candidate("/abs/1.jpg", "cat")),
    (parse_csv_line, "gs://bucket/a/1.jpg,cat", Candidate("gs://bucket/a/1.jpg", "cat")),
    (parse_csv_line, '"my dir/a,b.jpg",cat', Candidate("/data/manifests/my dir/a,b.jpg", "cat")),
    (parse_csv_line, '"q.jpg","lab,el"', Candidate("/data/manifests/q.jpg", "lab,el")),
    (parse_jsonl_line, '{"path": "cat/1.jpg", "label": "cat"}', Candidate("/data/manifests/cat/1.jpg", "cat")),
    (parse_jsonl_line, '{"path": "/abs/1.jpg", "label": 0}', Candidate("/abs/1.jpg", "0")),
    (parse_jsonl_line, '{"path": "gs://b/1.jpg", "label": 12, "x": 1}', Candidate("gs://b/1.jpg", "12")),
    (parse_jsonl_line, '{"path": "a,b.jpg", "label": "猫"}', Candidate("/data/manifests/a,b.jpg", "猫")),
])
def test_parse_manifest_line(parse_line, line, expected):
    assert parse_line(line, MANIFEST) == expected


@pytest.mark.parametrize("parse_line,line", [
    (parse_csv_line, "only_a_path.jpg"),
    (parse_csv_line, "a.jpg,cat,extra"),
    (parse_csv_line, ",cat"),
    (parse_csv_line, "a.jpg,  "),
    (parse_jsonl_line, "not json"),
    (parse_jsonl_line, '["a.jpg", "cat"]'),
    (parse_jsonl_line, '{"path": "a.jpg"}'),
    (parse_jsonl_line, '{"label": "cat"}'),
    (parse_jsonl_line, '{"path": "", "label": "cat"}'),
    (parse_jsonl_line, '{"path": "a.jpg", "label": ""}'),
])
def test_bad_manifest_lines(parse_line, line):
    with pytest.raises(BadManifestLine):
        parse_line(line, MANIFEST)


@pytest.mark.parametrize("kind,line", [("jsonl", '\ufeff{"path": "a.jpg", "label": "cat"}'),
                                       ("csv", "\ufeffa.jpg,cat")])
def test_manifest_line_with_utf8_bom(kind, line):
    assert list(ParseManifestLine(MANIFEST, kind).process(line)) == [Candidate("/data/manifests/a.jpg", "cat")]


def test_csv_header_is_not_an_input():
    assert list(ParseManifestLine(MANIFEST, "csv").process("path,label")) == []
    assert list(ParseManifestLine(MANIFEST, "csv").process("a.jpg,cat")) == [Candidate("/data/manifests/a.jpg", "cat")]


@pytest.mark.parametrize("path,label", [
    ("/data/cat/1.jpg", "cat"), ("gs://b/root/dog/x.png", "dog"), ("C:\\data\\bird\\1.jpg", "bird"),
    ("rel/fish/2.jpg", "fish"),
])
def test_label_from_parent(path, label):
    assert label_from_parent(path) == label


# ----------------------------------------------------------------------------- options

def spec_from(config: dict, *flags: str) -> ConversionSpec:
    return build_spec(config, ImgrecOptions(list(flags)))


def test_build_spec_merges_config_and_flags():
    config = {"input": {"path": "from/yaml"}, "output": {"path": "out", "num_shards": 3},
              "image": {"height": 32, "width": 16, "mean": [0.1, 0.2, 0.3]},
              "splits": {"names": ["a", "b"], "ratios": [0.5, 0.5]}}
    spec = spec_from(config, "--input=from/flag", "--height=8", "--class_names=cat, dog,",
                     "--target_shard_mb=0.5", "--overwrite")
    assert spec.input.path == "from/flag" and spec.output.path == "out"
    assert (spec.image.height, spec.image.width, spec.output.num_shards) == (8, 16, 3)
    assert spec.input.class_names == ("cat", "dog")
    assert spec.image.mean == (0.1, 0.2, 0.3)
    assert spec.splits.names == ("a", "b") and spec.splits.ratios == (0.5, 0.5)
    assert spec.output.target_shard_bytes == 2**19 and spec.output.overwrite is True


def test_split_flags_are_comma_separated_tuples():
    spec = spec_from({}, "--input=i", "--output=o", "--split_names=tr,te", "--split_ratios=0.75,0.25")
    assert spec.splits.names == ("tr", "te") and spec.splits.ratios == (0.75, 0.25)


@pytest.mark.parametrize("config,flags,message", [
    ({}, ["--output=o"], "--input"),
    ({"input": {"path": "i"}}, [], "--output"),
    ({"image": {"colour": "red"}}, ["--input=i", "--output=o"], "colour"),
    ({}, ["--input=i", "--output=o", "--resize_mode=squash"], "resize_mode"),
])
def test_build_spec_errors(config, flags, message):
    with pytest.raises(ValueError, match=message):
        spec_from(config, *flags)


def test_read_config_rejects_unknown_sections(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("input: {path: x}\nimages: {height: 3}\n")
    with pytest.raises(ValueError, match="images"):
        read_config(str(path))
    path.write_text("beam: {runner: DirectRunner}\nimage: {height: 3}\n")
    assert read_config(str(path)) == {"beam": {"runner": "DirectRunner"}, "image": {"height": 3}}
    assert read_config(None) == {}


def test_repo_config_builds():
    spec = spec_from(read_config(str(REPO / "configs" / "local.yaml")), "--output=elsewhere")
    assert spec.output.path == "elsewhere" and spec.splits.method == "stratified"
    assert spec.splits.names == ("train", "val", "test")


@pytest.mark.parametrize("section,field,value", [("splits", "salt", 2024), ("input", "class_names", [0, 1])])
def test_yaml_values_get_the_field_type(section, field, value):
    try:
        spec = spec_from({section: {field: value}}, "--input=i", "--output=o")
    except ValueError:
        return  # refusing the value is fine too
    typed = getattr(getattr(spec, section), field)
    assert all(isinstance(v, str) for v in (typed if isinstance(typed, tuple) else (typed,)))


def test_beam_args_from_config():
    config = {"beam": {"runner": "DirectRunner", "direct_num_workers": 2, "save_main_session": True,
                       "use_public_ips": False}}
    assert beam_args_from_config(config) == ["--runner=DirectRunner", "--direct_num_workers=2",
                                             "--save_main_session", "--no_use_public_ips"]
    assert beam_args_from_config({}) == [] and beam_args_from_config({"beam": None}) == []


# ----------------------------------------------------------------------------- metadata

SPEC = ConversionSpec(InputSpec("in"), OutputSpec("out"), splits=SplitSpec(names=("train", "val"), ratios=(0.5, 0.5)))
SHARDS = [
    {"split": "train", "file": "train-00001-of-00002.tfrecord", "num_examples": 1, "num_bytes": 10,
     "label_counts": (("dog", 1),)},
    {"split": "train", "file": "train-00000-of-00002.tfrecord", "num_examples": 2, "num_bytes": 20,
     "label_counts": (("cat", 1), ("dog", 1))},
    {"split": "val", "file": "val-00000-of-00001.tfrecord", "num_examples": 1, "num_bytes": 5,
     "label_counts": (("cat", 1),)},
]
REJECTIONS = [
    (("train", "decode", "CorruptImage", True), 1),
    ((None, "read", "EmptyFile", True), 1),
    ((None, "discover", "SkippedFile", False), 2),
    ((None, "dedup", "DuplicateImage", False), 1),
]


def metadata(**overrides) -> dict:
    """3 + 1 written, 5 rejected (2 of them errors): 9 inputs."""
    kwargs = dict(label_map={"dog": 1, "cat": 0}, shards=SHARDS, planned_counts={"train": 4, "val": 1},
                  rejection_counts=REJECTIONS, num_inputs=9, duplicates={"groups": 1}, error_files=["errors.jsonl"],
                  run={"run_id": "x"}, fingerprint="f" * 64)
    return build_metadata(SPEC, **{**kwargs, **overrides})


def test_build_metadata_counts():
    meta = metadata()
    train = meta["splits"]["train"]
    assert train["files"] == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    assert train["shard_lengths"] == [2, 1] and train["num_bytes"] == 30 and train["rejected"] == 1
    assert train["label_counts"] == {"cat": 1, "dog": 2}
    assert meta["splits"]["val"]["num_examples"] == 1
    inputs = meta["inputs"]
    assert (inputs["total"], inputs["written"], inputs["rejected"], inputs["errors"]) == (9, 4, 5, 2)
    assert inputs["error_fraction"] == pytest.approx(2 / 9)
    assert inputs["rejected_by_error"] == {"CorruptImage": 1, "DuplicateImage": 1, "EmptyFile": 1, "SkippedFile": 2}
    assert list(meta["label_map"]) == ["cat", "dog"]
    json.dumps(meta)  # all of it is JSON


@pytest.mark.parametrize("overrides,message", [
    ({"planned_counts": {"train": 5, "val": 1}}, "split train: 5 planned"),
    ({"planned_counts": {"train": 4}}, "split val: 0 planned"),
    ({"num_inputs": 10}, "10 inputs"),
    ({"rejection_counts": REJECTIONS[1:], "planned_counts": {"train": 3, "val": 1}}, "9 inputs"),
])
def test_build_metadata_count_mismatch(overrides, message):
    with pytest.raises(CountMismatch, match=message):
        metadata(**overrides)


def test_too_many_errors_names_counts_and_dead_letters():
    with pytest.raises(TooManyErrors) as info:
        check_error_fraction(metadata(), 0.2, "out.imgrec-staging/x/errors-*.jsonl")
    message = str(info.value)
    assert "2 of 9 inputs" in message and "CorruptImage: 1" in message
    assert "out.imgrec-staging/x/errors-*.jsonl" in message
    check_error_fraction(metadata(), 0.25, "unused")


def test_skipped_files_and_duplicates_are_not_errors():
    only_intended = [((None, "discover", "SkippedFile", False), 4), ((None, "dedup", "DuplicateImage", False), 1)]
    meta = metadata(rejection_counts=only_intended, planned_counts={"train": 3, "val": 1}, num_inputs=9)
    assert meta["inputs"]["errors"] == 0 and meta["inputs"]["rejected"] == 5
    check_error_fraction(meta, 0.0, "unused")


# ----------------------------------------------------------------------------- publish

@pytest.mark.parametrize("output", ["/", "", "gs://bucket", "gs://bucket/", "s3://b"])
def test_staging_root_rejects_roots(output):
    with pytest.raises(ValueError, match="--output"):
        staging_root(output)


@pytest.mark.parametrize("output,expected", [
    ("gs://bucket/out", "gs://bucket/out.imgrec-staging"),
    ("gs://bucket/out/", "gs://bucket/out.imgrec-staging"),
    ("out", "out.imgrec-staging"),
    ("/data/out/", "/data/out.imgrec-staging"),
])
def test_staging_root_beside_output(output, expected):
    assert staging_root(output) == expected


def write_files(folder: Path, names) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text(f"content of {name}")


def test_prepare_output(tmp_path):
    out = tmp_path / "out"
    staging = tmp_path / "out.imgrec-staging"
    write_files(staging / "dead-run", ["train-00000-of-00001.tfrecord"])
    assert prepare_output(str(out), overwrite=False, skip_unchanged=False) is None  # no dataset yet
    assert not staging.exists()
    write_files(out, ["metadata.json"])
    write_files(staging / "dead-run", ["x"])
    with pytest.raises(DatasetExists, match="--overwrite"):
        prepare_output(str(out), overwrite=False, skip_unchanged=False)
    assert staging.exists()
    assert prepare_output(str(out), overwrite=True, skip_unchanged=False) is None
    assert not staging.exists() and (out / "metadata.json").exists()


def test_prepare_output_returns_the_published_fingerprint_for_skip_unchanged(tmp_path):
    (tmp_path / "metadata.json").write_text(json.dumps({"fingerprint": "abc"}))
    assert prepare_output(str(tmp_path), overwrite=False, skip_unchanged=True) == "abc"
    assert prepare_output(str(tmp_path), overwrite=True, skip_unchanged=False) is None


@pytest.mark.parametrize("existing", [True, False], ids=["replaces-dataset", "new-folder"])
def test_publish(tmp_path, existing):
    out = tmp_path / "out"
    staging = tmp_path / "out.imgrec-staging"
    staged = ["train-00000-of-00001.tfrecord.gz", "errors-00000-of-00001.jsonl"]
    write_files(staging / "run", staged)
    if existing:
        write_files(out, ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord", "val-00000-of-00001.tfrecord.gz",
                          "errors-00000-of-00003.jsonl", "metadata.json", "notes.txt", "train-1-of-2.tfrecord"])
    publish({str(staging / "run" / name): name for name in staged}, str(out), {"format_version": 1})
    kept = {"notes.txt", "train-1-of-2.tfrecord"} if existing else set()
    assert {p.name for p in out.iterdir()} == {*staged, "metadata.json", *kept}
    for name in staged:
        assert (out / name).read_text() == f"content of {name}"
    assert json.loads((out / "metadata.json").read_text()) == {"format_version": 1}
    assert not staging.exists()


def _summary_metadata(classes: list[str]) -> dict:
    split = {"num_examples": 2 * len(classes), "label_counts": {c: 2 for c in classes}, "num_shards": 1,
             "num_bytes": 2048, "rejected": 0, "files": ["train-00000-of-00001.tfrecord"]}
    return {"splits": {"train": split}, "label_map": {c: i for i, c in enumerate(classes)},
            "inputs": {"total": split["num_examples"], "written": split["num_examples"], "rejected": 0,
                       "rejected_by_error": {}},
            "duplicates": {"groups": 0}, "error_files": []}


def test_summary_has_a_column_per_class_when_there_are_few():
    from pipeline.summary import format_summary

    table = format_summary(_summary_metadata(["cat", "dog"]), "out")
    assert table.splitlines()[0].split() == ["split", "examples", "cat", "dog", "shards", "bytes", "rejected"]
    assert "inputs: 4 = 4 written + 0 rejected" in table


def test_summary_shows_the_class_spread_when_there_are_many():
    from pipeline.summary import format_summary

    table = format_summary(_summary_metadata([f"n{i:08d}" for i in range(1000)]), "out")
    header, _, train, *_ = table.splitlines()
    assert header.split() == ["split", "examples", "classes", "min/class", "max/class", "shards", "bytes", "rejected"]
    assert train.split()[:5] == ["train", "2000", "1000", "2", "2"]
    assert max(len(line) for line in table.splitlines()) < 120
