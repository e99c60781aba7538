"""The real pipeline on the bundled sample (real image files), read back with TensorFlow."""
from __future__ import annotations

import math
import pathlib
import shutil
import subprocess
import sys

import cv2
import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import (
    REPO,
    SAMPLE,
    SAMPLE_IMAGES,
    SAMPLE_MANIFESTS,
    dead_letters,
    parse_records,
    read_split_records,
    records_by_split,
    run_pipeline,
    visible_files,
)
from transforms.dataset_format import IndexEntry
from transforms.plan.split import record_bytes_estimate
from transforms.specs import ImageSpec
from transforms.write import tfrecord

pytestmark = pytest.mark.e2e

# Plain 8-bit RGB files without alpha or EXIF rotation: OpenCV's own imread → RGB is the
# independent reference for their pixels.
PLAIN_SAMPLES = [p for p in SAMPLE_IMAGES if p.suffix in (".jpg", ".png", ".bmp")
                 and not any(tag in p.stem for tag in ("gray", "exif", "cmyk", "rgba", "png16"))]
RAW_FLAGS = ("--encoding=raw", "--normalize=none", "--resize_mode=stretch", "--interpolation=area",
             "--height=48", "--width=64", "--num_shards=2")


@pytest.fixture(scope="module")
def raw_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("raw") / "out"
    return out, run_pipeline(SAMPLE, out, *RAW_FLAGS)


def test_every_sample_is_written_once_with_its_label(raw_run):
    out, metadata = raw_run
    assert len(SAMPLE_IMAGES) == 36
    assert metadata.label_map == {"cat": 0, "coffee": 1, "rocket": 2}
    seen = []
    for split, info in metadata.splits.items():
        rows = parse_records(read_split_records(out, metadata, split), metadata)
        assert len(rows) == info.num_examples == sum(info.shard_lengths)
        assert info.num_shards == 2
        for row in rows:
            path = pathlib.Path(row["image/source_path"].decode())
            assert metadata.label_map[path.parent.name] == row["label"]
            assert row["label/text"].decode() == path.parent.name
            assert (row["image/height"], row["image/width"], row["image/channels"]) == (48, 64, 3)
            seen.append(str(path))
    assert sorted(seen) == [str(p.relative_to(SAMPLE)) for p in SAMPLE_IMAGES]  # below the input folder


def test_the_same_folder_spelled_two_ways_gives_the_same_bytes(tmp_path, monkeypatch):
    """Records name their image below the input folder: the dataset's bytes do not depend on how
    the folder was spelled or where it lies."""
    shutil.copytree(SAMPLE / "cat", tmp_path / "photos" / "cat")
    monkeypatch.chdir(tmp_path)
    run_pipeline("photos", tmp_path / "relative", *RAW_FLAGS)
    run_pipeline(f"{tmp_path}//photos/./", tmp_path / "absolute", *RAW_FLAGS)
    shutil.move(tmp_path / "photos", tmp_path / "moved")
    run_pipeline(tmp_path / "moved", tmp_path / "elsewhere", *RAW_FLAGS)
    shards = [sorted((p.relative_to(out), p.read_bytes()) for p in out.glob("*.tfrecord"))
              for out in (tmp_path / "relative", tmp_path / "absolute", tmp_path / "elsewhere")]
    assert shards[0] and shards[0] == shards[1] == shards[2]


def test_the_manifests_at_the_sample_root_are_skipped_and_counted(raw_run):
    """Class-folder discovery accounts for every path: the two manifests are not inside a class
    folder, so they are reported (not errors), and 38 inputs = 36 written + 2 rejected."""
    out, metadata = raw_run
    inputs = metadata.inputs
    assert (inputs.total, inputs.written, inputs.rejected, inputs.errors) == (38, 36, 2, 0)
    assert dict(inputs.rejected_by_error) == {"SkippedFile": 2} and dict(inputs.rejected_by_stage) == {"discover": 2}
    rows = dead_letters(out)
    assert sorted(pathlib.Path(r["path"]).name for r in rows) == sorted(SAMPLE_MANIFESTS)
    assert {(r["stage"], r["error"], r["message"], r["split"]) for r in rows} == {
        ("discover", "SkippedFile", "not inside a class folder", None)}
    assert all(info.rejected == 0 for info in metadata.splits.values())


def test_the_output_holds_the_dataset_and_nothing_else(raw_run):
    out, metadata = raw_run
    assert visible_files(out) == set(metadata.owned_files())  # no staging, no lock, no temporaries
    assert metadata.format_version == 2 and metadata.run["runner"] == "DirectRunner"


def test_the_record_index_locates_every_record_and_its_pixels(raw_run):
    out, metadata = raw_run
    for split, info in metadata.splits.items():
        records = iter(read_split_records(out, metadata, split))
        for shard, index in zip(info.files, info.index_files):
            entries = [IndexEntry.from_line(line) for line in (out / index).read_text().splitlines()]
            with open(out / shard, "rb") as handle:
                for entry in entries:
                    record = tfrecord.read_record_at(handle, entry.offset, entry.length)
                    assert record == next(records)
                    feature = tf.train.Example.FromString(record).features.feature
                    assert feature["image/sha256"].bytes_list.value[0].decode() == entry.sha256
                    assert record[entry.image_offset:entry.image_offset + entry.image_length] == \
                        feature["image"].bytes_list.value[0]
            assert sum(e.length for e in entries) == (out / shard).stat().st_size
        assert next(records, None) is None


def test_pixels_match_opencv_reference(raw_run):
    out, metadata = raw_run
    rows = [row for split in metadata.splits for row in parse_records(read_split_records(out, metadata, split),
                                                                       metadata)]
    by_path = {row["image/source_path"].decode(): row for row in rows}
    assert len(PLAIN_SAMPLES) >= 10
    for path in PLAIN_SAMPLES:
        expected = cv2.resize(cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB), (64, 48),
                              interpolation=cv2.INTER_AREA)
        pixels = tf.io.decode_raw(by_path[str(path.relative_to(SAMPLE))]["image"], tf.uint8).numpy().reshape(48, 64, 3)
        np.testing.assert_array_equal(pixels, expected, err_msg=str(path))


def test_jpeg_records_decode_to_configured_shape(tmp_path):
    metadata = run_pipeline(SAMPLE, tmp_path, "--encoding=jpeg", "--normalize=none", "--resize_mode=center_crop",
                            "--height=32", "--width=40", "--compression=gzip", "--split_method=stratified")
    assert all(name.endswith(".tfrecord.gz") for name in metadata.shard_files)
    assert all((tmp_path / name).read_bytes()[:2] == b"\x1f\x8b" for name in metadata.shard_files)
    counts = {split: len(read_split_records(tmp_path, metadata, split)) for split in metadata.splits}
    for row in parse_records(read_split_records(tmp_path, metadata, "val"), metadata):
        assert tf.io.decode_jpeg(row["image"]).shape == (32, 40, 3)
    for label in ("cat", "coffee", "rocket"):  # stratified: each split gets its share of 12, within one image
        per_split = {split: dict(info.label_counts).get(label, 0) for split, info in metadata.splits.items()}
        assert sum(per_split.values()) == 12
        assert all(abs(per_split[split] - 12 * ratio) < 1 for split, ratio in (("train", 0.7), ("val", 0.2),
                                                                               ("test", 0.1))), per_split
    assert counts == {split: info.num_examples for split, info in metadata.splits.items()}


def test_resize_mode_none_keeps_each_images_own_size_in_new_and_reused_records(tmp_path):
    flags = ("--encoding=png", "--resize_mode=none", "--split_method=hash", "--target_shard_mb=0.1")
    first = run_pipeline(SAMPLE, tmp_path / "first", *flags)
    train = parse_records(read_split_records(tmp_path / "first", first, "train"), first)
    estimate = sum(record_bytes_estimate(ImageSpec(resize_mode="none", encoding="png"), row["image/width"],
                                         row["image/height"]) for row in train)
    assert first.splits["train"].num_shards == math.ceil(estimate / 0.1 / 2**20) != math.ceil(
        len(train) * record_bytes_estimate(ImageSpec(encoding="png"), 0, 0) / 0.1 / 2**20)  # by its own size
    again = run_pipeline(SAMPLE, tmp_path / "again", *flags, f"--reuse_from={tmp_path / 'first'}")
    assert again.reuse.reused == sum(info.num_examples for info in first.splits.values())
    for output, metadata in ((tmp_path / "first", first), (tmp_path / "again", again)):
        rows = [row for split in metadata.splits for row in parse_records(read_split_records(output, metadata, split),
                                                                            metadata)]
        plain = [row for row in rows if SAMPLE / row["image/source_path"].decode() in PLAIN_SAMPLES]
        assert len(plain) == len(PLAIN_SAMPLES)
        for row in plain:
            stored = cv2.imread(str(SAMPLE / row["image/source_path"].decode())).shape
            assert tf.io.decode_png(row["image"]).shape == stored
            assert (row["image/height"], row["image/width"], row["image/channels"]) == stored


def seed_script_records(tmp_path: pathlib.Path) -> list[bytes]:
    """What benchmarks/seed_script.py, the users' old script, writes for the sample, as it is run."""
    output = tmp_path / "seed.tfrecord"
    subprocess.run([sys.executable, "-m", "benchmarks.seed_script", str(SAMPLE), str(output)], cwd=REPO, check=True,
                   capture_output=True, timeout=240)
    return [bytes(r.numpy()) for r in tf.data.TFRecordDataset(str(output))]


def test_seed_config_reproduces_the_seed_script_for_every_sample(tmp_path):
    """configs/seed.yaml gives the seed script's records bit for bit, for all 36 samples: gray, CMYK,
    EXIF-rotated, RGBA, 16-bit, WebP, TIFF and GIF included (decoder: imread)."""
    seed = seed_script_records(tmp_path)
    metadata = run_pipeline(SAMPLE, tmp_path / "out", f"--config={REPO / 'configs' / 'seed.yaml'}")
    ours = [r for split in metadata.splits for r in read_split_records(tmp_path / "out", metadata, split)]
    assert len(seed) == len(ours) == 36
    assert metadata.label_map == {"cat": 0, "coffee": 1, "rocket": 2}  # the seed's sorted class folders
    assert set(metadata.features) == {"train/image", "train/label"}
    # The seed serialized with protobuf; the wire bytes of a two-feature Example are canonical.
    canonical = sorted(tf.train.Example.FromString(r).SerializeToString(deterministic=True) for r in seed)
    assert sorted(ours) == canonical
    seed_spec = {"train/image": tf.io.FixedLenFeature((), tf.string),
                 "train/label": tf.io.FixedLenFeature((), tf.int64)}
    for record in ours:  # read the seed's way
        parsed = tf.io.parse_single_example(record, seed_spec)
        image = tf.reshape(tf.io.decode_raw(parsed["train/image"], tf.float32), (224, 224, 3))
        assert 0.0 <= float(tf.reduce_min(image)) <= float(tf.reduce_max(image)) <= 1.0


def test_manifests_give_the_same_dataset_as_folders(raw_run, tmp_path):
    out, metadata = raw_run
    for manifest in SAMPLE_MANIFESTS:
        from_manifest = run_pipeline(SAMPLE / manifest, tmp_path / manifest, *RAW_FLAGS)
        assert from_manifest.label_map == metadata.label_map
        assert (from_manifest.inputs.total, from_manifest.inputs.rejected) == (36, 0)
        assert records_by_split(tmp_path / manifest, from_manifest) == records_by_split(out, metadata)
