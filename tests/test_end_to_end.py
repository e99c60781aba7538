"""The real pipeline on real image files, read back with TensorFlow."""
from __future__ import annotations

import pathlib

import cv2
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.seed_script import seed_example
from tests.conftest import MULTI_PROCESSING, SAMPLE, read_split_records, records_by_split, run_pipeline

# Plain 8-bit RGB files without alpha or EXIF rotation: OpenCV's own imread → RGB is the
# independent reference for their pixels.
PLAIN_SAMPLES = sorted(p for p in SAMPLE.glob("*/*") if p.suffix in (".jpg", ".png", ".bmp")
                       and not any(tag in p.stem for tag in ("gray", "exif", "cmyk", "rgba", "png16")))
RAW_FLAGS = ("--encoding=raw", "--normalize=none", "--resize_mode=stretch", "--interpolation=area",
             "--height=48", "--width=64", "--num_shards=2")


def parse_all(records: list[bytes], metadata: dict) -> list[dict]:
    spec = {key: tf.io.FixedLenFeature((), tf.string if f["dtype"] == "string" else tf.int64)
            for key, f in metadata["features"].items()}
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()} for r in records]


@pytest.fixture(scope="module")
def raw_run(tmp_path_factory) -> tuple[pathlib.Path, dict]:
    out = tmp_path_factory.mktemp("raw") / "out"
    return out, run_pipeline(SAMPLE, out, *RAW_FLAGS)


def test_every_sample_is_written_once_with_its_label(raw_run):
    out, metadata = raw_run
    label_map = metadata["label_map"]
    assert label_map == {"cat": 0, "coffee": 1, "rocket": 2}
    seen = []
    for split, info in metadata["splits"].items():
        rows = parse_all(read_split_records(out, metadata, split), metadata)
        assert len(rows) == info["num_examples"] == sum(info["shard_lengths"])
        assert info["num_shards"] == 2 and len(info["files"]) == 2
        for row in rows:
            path = row["image/source_path"].decode()
            assert label_map[pathlib.Path(path).parent.name] == row["label"]
            assert row["label/text"].decode() == pathlib.Path(path).parent.name
            assert (row["image/height"], row["image/width"], row["image/channels"]) == (48, 64, 3)
            seen.append(path)
    assert sorted(seen) == sorted(str(p) for p in SAMPLE.glob("*/*") if p.suffix != ".csv" and p.suffix != ".jsonl")
    assert metadata["inputs"] == {**metadata["inputs"], "total": 36, "written": 36, "rejected": 0}


def test_pixels_match_opencv_reference(raw_run):
    out, metadata = raw_run
    rows = [row for split in metadata["splits"] for row in parse_all(read_split_records(out, metadata, split), metadata)]
    by_path = {row["image/source_path"].decode(): row for row in rows}
    assert len(PLAIN_SAMPLES) >= 10
    for path in PLAIN_SAMPLES:
        expected = cv2.resize(cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB), (64, 48),
                              interpolation=cv2.INTER_AREA)
        pixels = tf.io.decode_raw(by_path[str(path)]["image"], tf.uint8).numpy().reshape(48, 64, 3)
        np.testing.assert_array_equal(pixels, expected, err_msg=str(path))


def test_multi_processing_writes_identical_shards(raw_run, tmp_path):
    out, metadata = raw_run
    multi = run_pipeline(SAMPLE, tmp_path / "multi", *RAW_FLAGS, runner=MULTI_PROCESSING)
    for split, info in metadata["splits"].items():
        assert multi["splits"][split]["files"] == info["files"]
        for name in info["files"]:
            assert (tmp_path / "multi" / name).read_bytes() == (out / name).read_bytes(), name


def test_jpeg_records_decode_to_configured_shape(tmp_path):
    metadata = run_pipeline(SAMPLE, tmp_path, "--encoding=jpeg", "--normalize=none", "--resize_mode=center_crop",
                            "--height=32", "--width=40", "--compression=gzip", "--split_method=stratified")
    assert all(name.endswith(".tfrecord.gz") for s in metadata["splits"].values() for name in s["files"])
    counts = {split: len(read_split_records(tmp_path, metadata, split)) for split in metadata["splits"]}
    assert counts == {"train": 24, "val": 9, "test": 3}  # stratified: exact shares of 12 per class
    for row in parse_all(read_split_records(tmp_path, metadata, "val"), metadata):
        assert tf.io.decode_jpeg(row["image"]).shape == (32, 40, 3)
    for info in metadata["splits"].values():
        assert info["label_counts"] == {c: info["num_examples"] // 3 for c in ("cat", "coffee", "rocket")}


def test_seed_layout_is_reproduced_exactly(tmp_path):
    """Our records equal the seed script's records for the same images, parsed the seed's way."""
    inputs = tmp_path / "plain"
    for path in PLAIN_SAMPLES:
        (inputs / path.parent.name).mkdir(parents=True, exist_ok=True)
        (inputs / path.parent.name / path.name).write_bytes(path.read_bytes())
    metadata = run_pipeline(inputs, tmp_path / "out", "--config=configs/seed.yaml")
    ours = [r for split in metadata["splits"] for r in read_split_records(tmp_path / "out", metadata, split)]
    seed_spec = {"train/image": tf.io.FixedLenFeature((), tf.string),
                 "train/label": tf.io.FixedLenFeature((), tf.int64)}
    classes = sorted(p.name for p in inputs.iterdir())
    expected = {}
    for path in sorted(inputs.glob("*/*")):
        record = seed_example(str(path), classes.index(path.parent.name))
        expected[tf.train.Example.FromString(record).features.feature["train/image"].bytes_list.value[0]] = record
    assert len(ours) == len(expected) == len(PLAIN_SAMPLES)
    for record in ours:
        parsed = tf.io.parse_single_example(record, seed_spec)
        image = tf.reshape(tf.io.decode_raw(parsed["train/image"], tf.float32), (224, 224, 3))
        assert image.dtype == tf.float32 and 0.0 <= float(tf.reduce_min(image)) <= float(tf.reduce_max(image)) <= 1.0
        seed_record = expected[parsed["train/image"].numpy()]  # KeyError unless pixels are bit-identical
        assert tf.train.Example.FromString(record) == tf.train.Example.FromString(seed_record)
        assert record == tf.train.Example.FromString(seed_record).SerializeToString(deterministic=True)


def test_manifests_give_the_same_dataset_as_folders(raw_run, tmp_path):
    out, metadata = raw_run
    for manifest in ("manifest.csv", "manifest.jsonl"):
        from_manifest = run_pipeline(SAMPLE / manifest, tmp_path / manifest, *RAW_FLAGS)
        assert from_manifest["label_map"] == metadata["label_map"]
        assert records_by_split(tmp_path / manifest, from_manifest) == records_by_split(out, metadata)
