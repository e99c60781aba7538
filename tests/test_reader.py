"""pipeline.read.reader on datasets written by the real pipeline (in-memory DirectRunner), and on
records in the old seed layout."""
from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf

from pipeline.read import reader
from pipeline.read.reader import NotAnImgrecDataset, UnsupportedDataset, load_dataset, load_seed_layout
from tests.helpers import SAMPLE, make_tree, parse_records, run_pipeline, written_datasets
from transforms.dataset_format import METADATA_FILE, index_file_name, parse_index
from transforms.images.normalize import normalize_image
from transforms.specs import ImageSpec

pytestmark = pytest.mark.e2e

H, W = 40, 56  # small and non-square, so a transposed reshape would show up
COMMON = ("--height=40", "--width=56", "--num_shards=2", "--split_method=stratified", "--resize_mode=center_crop")
LAYOUTS = {
    "jpeg": ("--encoding=jpeg", "--normalize=none", "--quality=95"),
    "raw_none": ("--encoding=raw", "--normalize=none"),
    "raw_unit": ("--encoding=raw", "--normalize=unit"),
    "raw_mean_std": ("--encoding=raw", "--normalize=mean_std"),
    # gzip, and an empty split (ratio 0) that readers must handle.
    "png_gzip": ("--encoding=png", "--normalize=none", "--compression=gzip", "--split_ratios=0.8,0.2,0"),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return written_datasets(tmp_path_factory, COMMON, LAYOUTS)


def examples(dataset: tf.data.Dataset) -> list:
    return list(dataset.as_numpy_iterator())


def by_hash(output: str, split: str, **kwargs) -> dict[str, np.ndarray]:
    """sha256 → image, so datasets written separately can be compared record by record."""
    dataset = load_dataset(output, split, batch_size=None, with_metadata=True, **kwargs)
    return {extras["content_hash"].decode(): image for image, _, extras in examples(dataset)}


@pytest.mark.parametrize("name, dtype", [("jpeg", np.uint8), ("raw_none", np.uint8),
                                         ("raw_unit", np.float32), ("png_gzip", np.uint8)])
def test_every_split_matches_metadata(written, name, dtype):
    output, metadata = written(name)
    id_to_name = {i: n for n, i in metadata.label_map.items()}
    total = 0
    for split, info in metadata.splits.items():
        found = examples(load_dataset(output, split, batch_size=None, with_metadata=True))
        assert len(found) == info.num_examples
        total += len(found)
        counts = collections.Counter(id_to_name[int(label)] for _, label, _ in found)
        assert counts == info.label_counts
        for image, label, extras in found:
            assert image.shape == (H, W, 3) and image.dtype == dtype
            assert 0 <= label < len(metadata.label_map)
            assert metadata.label_map[extras["label_text"].decode()] == label
            assert (SAMPLE / extras["source_path"].decode()).is_file()
            assert (extras["height"], extras["width"], extras["channels"]) == (H, W, 3)
    assert total == 36


def test_empty_split_reads_as_empty(written):
    output, metadata = written("png_gzip")
    assert metadata.splits["test"].files == ()
    assert examples(load_dataset(output, "test")) == []


def test_gzip_shards_are_gzip(written):
    output, metadata = written("png_gzip")
    assert metadata.compression == "gzip"
    for name in metadata.splits["train"].files:
        assert name.endswith(".tfrecord.gz")
        assert (pathlib.Path(output) / name).read_bytes()[:2] == b"\x1f\x8b"


def test_without_metadata_yields_pairs_only(written):
    output, _ = written("jpeg")
    image, label = next(iter(load_dataset(output, "val", batch_size=None)))
    assert image.dtype == tf.uint8 and label.dtype == tf.int64 and label.shape == ()


def test_batching(written):
    output, metadata = written("raw_none")
    total = metadata.splits["train"].num_examples
    batches = examples(load_dataset(output, "train", batch_size=5))
    assert [len(labels) for _, labels in batches] == [5] * (total // 5) + ([total % 5] if total % 5 else [])
    assert all(images.shape[1:] == (H, W, 3) and labels.shape == (len(images),) for images, labels in batches)
    dropped = examples(load_dataset(output, "train", batch_size=5, drop_remainder=True))
    assert [len(labels) for _, labels in dropped] == [5] * (total // 5)
    spec = load_dataset(output, "train", batch_size=5).element_spec
    assert spec[0].shape.as_list() == [None, H, W, 3]
    # Known epoch lengths: Keras counts steps, and does not warn that the input ran out of data.
    assert int(load_dataset(output, "train", batch_size=5).cardinality()) == len(batches)
    shuffled = load_dataset(output, "train", batch_size=5, drop_remainder=True, shuffle=True)
    assert int(shuffled.cardinality()) == total // 5
    assert int(load_dataset(output, "train", batch_size=None, check_replaced=False).cardinality()) == total


def test_shuffle_is_deterministic_per_seed(written):
    output, _ = written("raw_none")

    def order(**kwargs) -> list[bytes]:
        dataset = load_dataset(output, "train", batch_size=None, with_metadata=True, **kwargs)
        return [extras["content_hash"] for _, _, extras in examples(dataset)]

    plain = order()
    first, again, other = order(shuffle=True, seed=1), order(shuffle=True, seed=1), order(shuffle=True, seed=2)
    assert first == again
    assert first != other
    assert sorted(first) == sorted(other) == sorted(plain)
    assert order() == plain  # unshuffled reads are repeatable too


@pytest.mark.parametrize("method, stored", [("unit", "raw_unit"), ("mean_std", "raw_mean_std")])
def test_read_time_normalization_equals_write_time(written, method, stored):
    raw_output, metadata = written("raw_none")
    stored_output, _ = written(stored)
    for split in metadata.splits:
        at_read = by_hash(raw_output, split, normalize=method)
        at_write = by_hash(stored_output, split)
        assert at_read.keys() == at_write.keys() and at_read
        for key, image in at_read.items():
            assert image.dtype == np.float32
            assert np.array_equal(image, at_write[key]), key  # exact, not approximate


@pytest.mark.parametrize("method", ["unit", "mean_std"])
def test_normalize_images_is_bit_identical_to_the_pipeline(method):
    pixels = np.stack(np.meshgrid(np.arange(256), np.arange(256)[::-1], np.arange(256) // 2), -1)[:64]
    pixels = pixels.astype(np.uint8)
    expected = normalize_image(pixels, ImageSpec(normalize=method, encoding="raw"))
    got = reader.normalize_images(tf.constant(pixels), method).numpy()
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("mean, std, message", [((0.5, 0.5, 0.5), (0, 0, 0), "std non-zero"),
                                                 ((float("nan"), 0, 0), (1, 1, 1), "must be finite"),
                                                 ((0.5,), (1, 1, 1), "three means and three stds")])
def test_read_time_mean_std_takes_what_a_config_may_give(written, mean, std, message):
    output, _ = written("jpeg")
    with pytest.raises(ValueError, match=message):
        load_dataset(output, "train", normalize="mean_std", mean=mean, std=std)


def test_png_pixels_equal_raw_and_jpeg_pixels_are_close(written):
    """Lossless PNG must give the raw pixels exactly (so channel order and orientation are right)."""
    raw_output, metadata = written("raw_none")
    raw = {key: image for split in metadata.splits for key, image in by_hash(raw_output, split).items()}
    png = by_hash(written("png_gzip")[0], "val")  # split differently (ratios 0.8/0.2/0)
    jpeg = by_hash(written("jpeg")[0], "val")
    assert png and set(png) <= set(raw)
    for key, image in png.items():
        assert np.array_equal(image, raw[key])
    for key, image in jpeg.items():
        # JPEG loss; a channel swap would be far larger
        assert np.abs(image.astype(int) - raw[key].astype(int)).mean() < 10


def test_refuses_a_folder_without_metadata(tmp_path):
    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"")
    with pytest.raises(NotAnImgrecDataset, match="not a finished imgrec dataset"):
        load_dataset(str(tmp_path), "train")


def test_a_filesystem_tensorflow_lacks_is_named(tmp_path):
    """s3:// is not in TensorFlow (docs/object-stores.md): the reader says so in its own error."""
    with pytest.raises(UnsupportedDataset, match="s3://bucket/ds: .*not implemented"):
        load_dataset("s3://bucket/ds", "train")


def test_unknown_split_names_the_splits(written):
    output, _ = written("jpeg")
    with pytest.raises(ValueError, match="train, val, test"):
        load_dataset(output, "training")


def test_normalize_is_refused_for_already_normalized_pixels(written):
    output, _ = written("raw_unit")
    with pytest.raises(ValueError, match="already normalized"):
        load_dataset(output, "train", normalize="unit")
    with pytest.raises(ValueError, match="normalize must be"):
        load_dataset(written("jpeg")[0], "train", normalize="imagenet")


def test_metadata_problems_are_reported(written, tmp_path):
    _, metadata = written("jpeg")
    no_label = dataclasses.replace(metadata, features={k: v for k, v in metadata.features.items()
                                                       if v["role"] != "label"})
    with pytest.raises(UnsupportedDataset, match="label"):
        reader.layout_from_metadata(no_label)
    (tmp_path / "metadata.json").write_text(json.dumps({**metadata.to_json(), "format_version": 99}))
    with pytest.raises(UnsupportedDataset, match="format_version 99"):
        load_dataset(str(tmp_path), "train")
    for damaged in (b"{not json", b'{"format_version": "\xff"}'):
        (tmp_path / "metadata.json").write_bytes(damaged)
        with pytest.raises(UnsupportedDataset, match="not valid JSON"):
            load_dataset(str(tmp_path), "train")


@pytest.mark.parametrize("shape", [["a", 56, 3], [40, 56], [40, 56, 0], [40, True, 3], "40x56x3"])
def test_an_image_shape_that_is_no_shape_is_refused(written, shape):
    _, metadata = written("jpeg")
    edited = dataclasses.replace(metadata, features={**metadata.features,
                                                     "image": {**metadata.features["image"], "shape": shape}})
    with pytest.raises(UnsupportedDataset, match=r"image feature 'image' has shape .*, not \[height, width"):
        reader.layout_from_metadata(edited)


def test_optional_roles_may_be_absent(written):
    _, metadata = written("jpeg")
    minimal = dataclasses.replace(metadata, features={k: v for k, v in metadata.features.items()
                                                      if v["role"] in ("image", "label")})
    layout = reader.layout_from_metadata(minimal, with_metadata=True)
    assert set(layout.parse_spec) == {"image", "label"} and not layout.extras


def test_wrong_image_shape_fails_loudly(written, tmp_path):
    output, metadata = written("jpeg")
    copy = tmp_path / "copy"
    shutil.copytree(output, copy)
    edited = metadata.to_json()
    edited["features"]["image"]["shape"] = [W, H, 3]
    (copy / "metadata.json").write_text(json.dumps(edited))
    with pytest.raises(tf.errors.InvalidArgumentError):
        examples(load_dataset(str(copy), "val"))


# --- a dataset replaced while it is read -------------------------------------------------

# Three shards of 40 records: a reader a few records in (plus tf.data's read-ahead) is inside the first.
REPLACEABLE = ("--height=40", "--width=56", "--num_shards=3", "--split_names=train", "--split_ratios=1",
               "--encoding=raw", "--normalize=none")


@pytest.fixture(scope="module")
def replaceable(tmp_path_factory) -> tuple[pathlib.Path, reader.DatasetMetadata]:
    """Dataset A (120 photos) in `root/a_out`, and other photos in `root/b` to replace it with."""
    root = tmp_path_factory.mktemp("replaceable")
    make_tree(root / "a", {"ant": 60, "bee": 60})
    make_tree(root / "b", {"ant": 25, "bee": 25}, size=(50, 70))
    return root, run_pipeline(root / "a", root / "a_out", *REPLACEABLE)


@pytest.fixture
def dataset_a(replaceable, tmp_path) -> pathlib.Path:
    """A copy of dataset A to replace."""
    shutil.copytree(replaceable[0] / "a_out", tmp_path / "out")
    return tmp_path / "out"


def content_hashes(elements) -> list[str]:
    return [extras["content_hash"].decode() for _, _, extras in elements]


def indexed_hashes(output: pathlib.Path, metadata) -> set[str]:
    return {entry.sha256 for name in metadata.splits["train"].files
            for entry in parse_index((output / index_file_name(name)).read_text())}


def read_on(iterator, seen: list) -> None:
    """Appends elements one by one, so what came back before an error stays in `seen`."""
    for element in iterator:
        seen.append(element)


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", [{"num_parallel_reads": 1}, {"num_parallel_reads": None},
                                    {"input_context": tf.distribute.InputContext(3, 1)}],
                         ids=["interleave", "sequential", "one_shard_per_pipeline"])
def test_a_dataset_replaced_while_read_fails_loudly(replaceable, dataset_a, kwargs):
    """An --overwrite run publishing into the folder mid-epoch stops the reader instead of mixing datasets;
    with one shard per input pipeline only the check after the shard's last record can see it."""
    root, metadata = replaceable
    dataset = load_dataset(str(dataset_a), "train", batch_size=None, with_metadata=True, **kwargs)
    iterator = dataset.as_numpy_iterator()
    seen = [next(iterator) for _ in range(3)]
    replacement = run_pipeline(root / "b", dataset_a, *REPLACEABLE, "--overwrite")
    with pytest.raises(tf.errors.UnknownError) as caught:
        read_on(iterator, seen)
    assert (f"DatasetChanged: {dataset_a} was replaced by another run while it was being read ({METADATA_FILE} "
            f"now has run {replacement.run['run_id']}, not {metadata.run['run_id']}); re-open the dataset"
            ) in caught.value.message
    assert set(content_hashes(seen)) <= indexed_hashes(root / "a_out", metadata)  # nothing of B came back
    with pytest.raises(tf.errors.UnknownError, match="was replaced by another run"):
        examples(dataset)  # nor does a new epoch of the old dataset
    assert len(examples(load_dataset(str(dataset_a), "train", batch_size=None))) == 50


def test_the_checks_read_metadata_json_once_per_version_not_at_every_shard(dataset_a, monkeypatch):
    """The file grows with the shards, and reading it at both ends of each made a split of 4,000
    shards 25 times as slow to read."""
    opened, real_gfile = [], tf.io.gfile.GFile

    def counting_gfile(path, mode="r"):
        opened.extend([path] if str(path).endswith(METADATA_FILE) else [])
        return real_gfile(path, mode)

    monkeypatch.setattr(tf.io.gfile, "GFile", counting_gfile)
    dataset = load_dataset(str(dataset_a), "train", batch_size=None)
    assert len(examples(dataset)) == len(examples(dataset)) == 120  # two epochs of three shards
    assert len(opened) == 2  # load_dataset's own read, then the first check's


def test_a_publish_under_way_stops_the_reader(replaceable, dataset_a):
    """A publish deletes metadata.json before it touches any shard."""
    _, metadata = replaceable
    iterator = load_dataset(str(dataset_a), "train", batch_size=None, num_parallel_reads=None).as_numpy_iterator()
    seen = [next(iterator)]
    (dataset_a / METADATA_FILE).unlink()
    with pytest.raises(tf.errors.UnknownError,
                       match=f"{METADATA_FILE} of run {metadata.run['run_id']} is gone\\); re-open the dataset"):
        read_on(iterator, seen)
    assert len(seen) <= metadata.splits["train"].shard_lengths[0]


def test_the_replacement_check_can_be_left_out(replaceable, dataset_a):
    """check_replaced=False (for graphs that must be serialized): plain tf.data, no Python function."""
    _, metadata = replaceable
    dataset = load_dataset(str(dataset_a), "train", batch_size=None, num_parallel_reads=None, check_replaced=False)
    iterator = dataset.as_numpy_iterator()
    seen = [next(iterator)]
    (dataset_a / METADATA_FILE).unlink()
    read_on(iterator, seen)
    assert len(seen) == metadata.splits["train"].num_examples


@pytest.mark.parametrize("check_replaced", [True, False])
def test_a_shard_holding_fewer_records_than_metadata_says_fails_loudly(replaceable, dataset_a, check_replaced):
    """A shard cut at a record boundary reads as valid TFRecords: the reader gave 10 of its
    records without a word."""
    _, metadata = replaceable
    shard = dataset_a / metadata.splits["train"].files[0]
    kept = [bytes(r.numpy()) for r in tf.data.TFRecordDataset(str(shard)).take(10)]
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for record in kept:
            writer.write(record)
    expected = metadata.splits["train"].shard_lengths[0]
    dataset = load_dataset(str(dataset_a), "train", batch_size=None, check_replaced=check_replaced)
    message = f"expected to contain {expected} elements but contained only 10"
    with pytest.raises(tf.errors.FailedPreconditionError, match=message):
        examples(dataset)


def plain_tf_data_order(output: pathlib.Path, metadata, num_parallel_reads, seed) -> list[str]:
    """Content hashes in the order the reader gave before it checked for replacement: plain tf.data."""
    names = tf.data.Dataset.from_tensor_slices([str(output / f) for f in metadata.splits["train"].files])
    if seed is not None:
        names = names.shuffle(len(metadata.splits["train"].files), seed=seed)
    records = tf.data.TFRecordDataset(names, num_parallel_reads=num_parallel_reads)
    if seed is not None:
        records = records.shuffle(10_000, seed=seed)
    key = metadata.role_keys()["content_hash"]
    return [r[key].decode() for r in parse_records((bytes(r.numpy()) for r in records), metadata)]


@pytest.mark.parametrize("num_parallel_reads", [None, 1, 2, tf.data.AUTOTUNE])
@pytest.mark.parametrize("seed", [None, 7])
def test_checks_leave_the_order_of_an_unreplaced_dataset_alone(replaceable, num_parallel_reads, seed):
    root, metadata = replaceable
    read = load_dataset(str(root / "a_out"), "train", batch_size=None, with_metadata=True, shuffle=seed is not None,
                        seed=seed, num_parallel_reads=num_parallel_reads)
    expected = plain_tf_data_order(root / "a_out", metadata, num_parallel_reads, seed)
    assert len(expected) == metadata.splits["train"].num_examples == 120
    assert content_hashes(examples(read)) == expected


# --- the old seed layout -------------------------------------------------------------------

def write_seed_records(directory: pathlib.Path, count: int, per_file: int) -> tuple[list[str], list[np.ndarray]]:
    rng = np.random.default_rng(0)
    images = [rng.random((224, 224, 3), dtype=np.float32) for _ in range(count)]
    files = []
    for start in range(0, count, per_file):
        path = str(directory / f"seed-{start // per_file:05d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for label in range(start, min(start + per_file, count)):
                example = tf.train.Example(features=tf.train.Features(feature={
                    "train/image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[images[label].tobytes()])),
                    "train/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                }))
                writer.write(example.SerializeToString())
        files.append(path)
    return files, images


def test_seed_layout(tmp_path):
    files, images = write_seed_records(tmp_path, count=5, per_file=3)
    batches = examples(load_seed_layout(files, batch_size=2, num_parallel_reads=1))
    assert [b[0].shape for b in batches] == [(2, 224, 224, 3), (2, 224, 224, 3), (1, 224, 224, 3)]
    found = {int(label): image for batch_images, labels in batches for image, label in zip(batch_images, labels)}
    assert sorted(found) == list(range(5))
    for label, image in found.items():
        assert image.dtype == np.float32 and np.array_equal(image, images[label])
    shuffled = [int(label) for _, label in examples(load_seed_layout(
        str(tmp_path / "seed-*.tfrecord"), batch_size=None, shuffle=True, seed=3))]
    assert sorted(shuffled) == list(range(5))


def test_seed_layout_refuses_an_empty_glob(tmp_path):
    with pytest.raises(FileNotFoundError, match="no files match"):
        load_seed_layout(str(tmp_path / "nothing-*.tfrecord"))
