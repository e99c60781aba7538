"""pipeline.read.tfds_export: datasets written by the real pipeline load with
`tfds.builder_from_directory` and give the same records as our own reader."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from pipeline.errors import OutputLocked
from pipeline.output.lock import OutputLock
from pipeline.read import tfds_export
from pipeline.read.reader import load_dataset
from tests.helpers import SAMPLE, make_tree, read_metadata, run_pipeline, visible_files, written_datasets
from tests.test_detection_pipeline import DETECTION

pytestmark = pytest.mark.e2e

COMMON = ("--height=40", "--width=56", "--num_shards=2", "--split_method=stratified")
LAYOUTS = {
    "jpeg": ("--encoding=jpeg", "--normalize=none"),
    # float32 raw pixels, and an empty split (ratio 0), which TFDS cannot list and export leaves out.
    "raw_unit": ("--encoding=raw", "--normalize=unit", "--split_ratios=0.8,0.2,0"),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return written_datasets(tmp_path_factory, COMMON, LAYOUTS)


def ours(output: str, split: str) -> dict[str, tuple[int, np.ndarray]]:
    """source path → (label id, image) from pipeline.read.reader: the reference TFDS must match."""
    dataset = load_dataset(output, split, batch_size=None, with_metadata=True)
    return {extras["source_path"].decode(): (int(label), image)
            for image, label, extras in dataset.as_numpy_iterator()}


def theirs(builder, split: str) -> dict[str, tuple[int, np.ndarray]]:
    return {example["image/source_path"].decode(): (int(example["label"]), example["image"])
            for example in tfds.as_numpy(builder.as_dataset(split=split))}


def assert_same_records(output: str, metadata, builder, dtype) -> None:
    info = builder.info
    exported = {name: split for name, split in metadata.splits.items() if split.files}
    assert sorted(info.splits) == sorted(exported)
    for name, split in exported.items():
        assert info.splits[name].num_examples == split.num_examples
        assert info.splits[name].shard_lengths == list(split.shard_lengths)
        expected, got = ours(output, name), theirs(builder, name)
        assert len(got) == split.num_examples
        assert {k: label for k, (label, _) in got.items()} == {k: label for k, (label, _) in expected.items()}
        for key, (_, image) in got.items():
            assert image.dtype == dtype and image.shape == (40, 56, 3)
            np.testing.assert_array_equal(image, expected[key][1])


def test_jpeg_dataset_loads_with_tfds(written, tmp_path, capsys):
    output, metadata = written("jpeg")
    before = set(visible_files(output))

    assert tfds_export.main([output, "--name", "sample_jpeg"]) == 0
    assert "split train" in capsys.readouterr().out

    # Our metadata.json stays ours (TFDS must not replace it) and records what the export added.
    after = read_metadata(output)
    added = set(visible_files(output)) - before
    assert {"dataset_info.json", "features.json"} <= added
    assert set(after.exports) == added
    assert dataclasses.replace(after, exports=()) == metadata
    builder = tfds.builder_from_directory(output)
    assert builder.info.name == "sample_jpeg"
    label = builder.info.features["label"]
    assert isinstance(label, tfds.features.ClassLabel)
    assert label.names == metadata.class_names()
    assert (pathlib.Path(output) / "label.labels.txt").read_text().split() == metadata.class_names()
    assert isinstance(builder.info.features["image"], tfds.features.Image)
    assert_same_records(output, metadata, builder, np.uint8)

    # Every feature of ours comes back under its own key; as_supervised gives (image, label).
    example = next(iter(tfds.as_numpy(builder.as_dataset(split="train"))))
    assert sorted(example) == sorted(metadata.features)
    assert example["image/height"] == 40 and example["label/text"].decode() in metadata.label_map
    image, label = next(iter(tfds.as_numpy(builder.as_dataset(split="train", as_supervised=True))))
    assert image.shape == (40, 56, 3) and 0 <= label < len(metadata.label_map)


def test_raw_float32_dataset_loads_with_tfds(written):
    output, metadata = written("raw_unit")
    summary = tfds_export.export(output)

    assert summary["skipped_empty_splits"] == ["test"]
    builder = tfds.builder_from_directory(output)
    assert isinstance(builder.info.features["image"], tfds.features.Tensor)
    assert_same_records(output, metadata, builder, np.float32)


def test_gzip_shards_are_refused(written, tmp_path):
    output, metadata = written("jpeg")
    gzip_dir = tmp_path / "gz"
    gzip_dir.mkdir()
    (gzip_dir / "metadata.json").write_text(json.dumps({**metadata.to_json(), "compression": "gzip"}))

    with pytest.raises(tfds_export.NotExportable, match="gzip-compressed.*--compression=none"):
        tfds_export.export(str(gzip_dir))
    assert sorted(p.name for p in gzip_dir.iterdir()) == ["metadata.json"]
    assert tfds_export.main([str(gzip_dir)]) == 2


def test_a_split_whose_every_image_was_rejected_is_exported(tmp_path):
    """Stratified 1 + 1: one image in each split; the corrupt one is rejected after planning, so
    its split has a shard of no records. TFDS's check reads the first split's first record: the
    export failed with a ValueError traceback when that split was the empty one."""
    good, bad = make_tree(tmp_path / "in", {"cat": 2})
    bad.write_bytes(bad.read_bytes()[:-40])
    output = str(tmp_path / "out")
    metadata = run_pipeline(tmp_path / "in", output, "--split_method=stratified", "--split_names=val,train",
                            "--split_ratios=0.5,0.5", "--max_error_fraction=0.5", "--height=8", "--width=8")
    assert [split.num_examples for split in metadata.splits.values()] == [0, 1]  # the first is empty

    assert tfds_export.export(output)["splits"] == {"train": 1, "val": 0}
    assert len(tfds.builder_from_directory(output).as_dataset(split="train")) == 1


@pytest.mark.parametrize("what", ["missing", "file"])
def test_a_path_that_holds_no_dataset_is_one_error_line(tmp_path, capsys, what):
    path = tmp_path / "x"
    if what == "file":
        path.write_text("not a folder")
    assert tfds_export.main([str(path)]) == 2
    assert capsys.readouterr().err.startswith("imgrec: error: ")


def test_label_ids_that_classlabel_cannot_hold_stay_plain_int64(written):
    _, metadata = written("jpeg")
    assert tfds_export.class_names({"b": 1, "a": 0}) == ["a", "b"]
    assert tfds_export.class_names({"a": 0, "c": 2}) is None  # ClassLabel ids are positions
    assert tfds_export.class_names({" a": 0, "b": 1}) is None  # labels.txt strips names
    assert tfds_export.class_names({"a\nb": 0}) is None

    features = tfds_export.feature_connectors(dataclasses.replace(metadata, label_map={"cat": 0, "coffee": 5,
                                                                                        "rocket": 7}))
    assert type(features["label"]) is tfds.features.Scalar and features["label"].dtype == np.int64


def test_an_image_shape_that_is_no_shape_is_one_error_line(written, tmp_path, capsys):
    output, metadata = written("jpeg")
    copy = unexported_copy(output, tmp_path / "copy")
    edited = json.loads((copy / "metadata.json").read_text())
    edited["features"]["image"]["shape"] = [40, 56]
    (copy / "metadata.json").write_text(json.dumps(edited))
    assert tfds_export.main([str(copy)]) == 2
    assert capsys.readouterr().err == ("imgrec: error: image feature 'image' has shape [40, 56], "
                                       "not [height, width, channels]\n")


def test_a_file_that_cannot_be_written_is_one_error_line(written, tmp_path, capsys):
    """A full disk or, here, a folder where TFDS writes its labels file: exit 1, one line."""
    output, _ = written("jpeg")
    copy = unexported_copy(output, tmp_path / "copy")
    edited = json.loads((copy / "metadata.json").read_text())
    (copy / "metadata.json").write_text(json.dumps({**edited, "exports": []}))  # never exported
    (copy / "label.labels.txt").mkdir()
    capsys.readouterr()  # the fixture's run
    assert tfds_export.main([str(copy)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"imgrec: error: {copy}: the TFDS export could not be written: ")
    assert tfds_export.written_files(str(copy)) == ["label.labels.txt"]  # the folder was there before: not ours


def test_shard_names_tfds_cannot_derive_are_refused(written, tmp_path):
    output, metadata = written("jpeg")
    renamed = metadata.to_json()
    renamed["splits"]["train"]["files"] = ["train-0-of-2.tfrecord", "train-1-of-2.tfrecord"]
    copy = tmp_path / "renamed"
    shutil.copytree(output, copy)
    (copy / "metadata.json").write_text(json.dumps(renamed))

    with pytest.raises(tfds_export.NotExportable, match="not the names TFDS derives"):
        tfds_export.export(str(copy))


def test_default_name_is_a_tfds_identifier():
    assert tfds_export.default_name("gs://bucket/my-data.v2/") == "my_data_v2"
    assert tfds_export.default_name("/tmp/2024") == "imgrec"


def test_a_new_publish_removes_the_tfds_files(tmp_path):
    """The export's files are listed in metadata.json, so they are imgrec's to replace."""
    output = tmp_path / "out"
    run_pipeline(SAMPLE, output, *COMMON, *LAYOUTS["jpeg"])
    assert tfds_export.main([str(output)]) == 0
    assert (output / "dataset_info.json").exists()
    republished = run_pipeline(SAMPLE, output, *COMMON, *LAYOUTS["jpeg"], "--overwrite")
    assert republished.exports == ()
    assert visible_files(output) == set(republished.owned_files())


def unexported_copy(output: str, copy: pathlib.Path) -> pathlib.Path:
    """A copy of the dataset without the TFDS files an earlier test's export left in it."""
    shutil.copytree(output, copy)
    for name in tfds_export.written_files(str(copy)):
        (copy / name).unlink()
    return copy


def test_records_that_do_not_match_metadata_are_one_error_and_leave_no_tfds_files(written, tmp_path, capsys):
    """TFDS's check_data fails on an edited shape: a TensorFlow traceback used to end the export,
    and `label.labels.txt` stayed behind, listed nowhere."""
    output, metadata = written("jpeg")
    copy = unexported_copy(output, tmp_path / "edited")
    edited = metadata.to_json()
    edited["features"]["image"]["shape"] = [8, 8, 3]
    (copy / "metadata.json").write_text(json.dumps(edited))
    before = sorted(p.name for p in copy.iterdir())
    assert tfds_export.main([str(copy)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("imgrec: error: TFDS cannot read the records as metadata.json describes them: "), error
    assert sorted(p.name for p in copy.iterdir()) == before


@pytest.mark.parametrize("damage, found", [
    ("cut", "cut short or appended to"), ("appended", "cut short or appended to"),
    ("shard_lengths", "index/train-00000-of-00002.tfrecord.idx"), ("num_examples", "add up to"),
    ("index", "missing index/train-00000-of-00002.tfrecord.idx"),
])
def test_a_damaged_dataset_is_not_exported(written, tmp_path, capsys, damage, found):
    """TFDS takes metadata.json's shard lengths as they are: the export said "TFDS metadata
    written" (exit 0) for cut or extended shards, a lost index and edited counts, and TFDS then
    read wrong shard lengths without a word."""
    output, metadata = written("jpeg")
    copy = unexported_copy(output, tmp_path / damage)
    shard, edited = copy / metadata.splits["train"].files[0], metadata.to_json()
    train = edited["splits"]["train"]
    if damage == "cut":
        shard.write_bytes(shard.read_bytes()[:-10])
    elif damage == "appended":
        shard.write_bytes(shard.read_bytes() * 2)
    elif damage == "shard_lengths":
        train["shard_lengths"] = [train["shard_lengths"][0] - 1, train["shard_lengths"][1] + 1]
    elif damage == "num_examples":
        train["num_examples"] += 1
    else:
        (copy / "index" / f"{shard.name}.idx").unlink()
    (copy / "metadata.json").write_text(json.dumps(edited))
    before = sorted(p.name for p in copy.iterdir())
    assert tfds_export.main([str(copy)]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"imgrec: error: {copy} is damaged: ") and found in error, error
    assert sorted(p.name for p in copy.iterdir()) == before


def test_an_export_holds_the_output_lock(written, tmp_path):
    """A run replacing the dataset while TFDS writes would have its metadata.json overwritten by
    the export's copy of the old one; so each refuses while the other holds the output."""
    output, _ = written("jpeg")
    copy = unexported_copy(output, tmp_path / "locked")
    with OutputLock(str(copy), "a-running-conversion"):
        assert tfds_export.main([str(copy)]) == OutputLocked.exit_code
    assert not (copy / "dataset_info.json").exists()


def test_a_coco_dataset_with_masks_loads_with_tfds_as_load_dataset_reads_it(tmp_path):
    """Detection records load as written: TFDS's four box lists, classes and decoded masks are
    load_dataset's, image by image, in every split."""
    output = str(tmp_path / "coco")
    metadata = run_pipeline(DETECTION / "coco" / "instances.json", output, "--masks")
    assert tfds_export.main([output]) == 0
    builder = tfds.builder_from_directory(output)
    assert builder.info.supervised_keys is None  # no (image, label) pair for a list of objects
    compared = 0
    for split in (name for name, info in metadata.splits.items() if info.files):
        theirs = {example["image/source_id"].decode(): example
                  for example in tfds.as_numpy(builder.as_dataset(split=split))}
        for image, target, extras in load_dataset(output, split, batch_size=None, with_metadata=True):
            exported = theirs.pop(extras["source_id"].numpy().decode())
            np.testing.assert_array_equal(exported["image/encoded"], image.numpy())
            boxes = np.stack([exported[f"image/object/bbox/{side}"] for side in ("ymin", "xmin", "ymax", "xmax")], -1)
            np.testing.assert_array_equal(boxes.reshape(-1, 4), target["boxes"].numpy())
            np.testing.assert_array_equal(exported["image/object/class/label"], target["classes"].numpy())
            masks = target["masks"].numpy()
            np.testing.assert_array_equal(exported["image/object/mask"].reshape(masks.shape + (1,))[..., 0], masks)
            compared += len(masks)
        assert theirs == {}
    assert compared == sum(metadata.objects.written.values())


def test_a_multi_label_dataset_loads_with_tfds_as_label_lists(tmp_path):
    from tests.test_multilabel import LABELS, jsonl_manifest

    output = str(tmp_path / "out")
    metadata = run_pipeline(jsonl_manifest(tmp_path / "in"), output, "--multi_label", "--height=16", "--width=16")
    assert tfds_export.main([output]) == 0
    builder = tfds.builder_from_directory(output)
    keys = metadata.role_keys()
    label = builder.info.features[keys["label"]]
    assert isinstance(label, tfds.features.Sequence) and label.feature.names == metadata.class_names()
    found = {}
    for split in builder.info.splits:
        for example in tfds.as_numpy(builder.as_dataset(split=split)):
            names = [label.feature.int2str(i) for i in example[keys["label"]]]
            assert names == [text.decode() for text in example[keys["label_text"]]]
            found[pathlib.Path(example[keys["source_path"]].decode()).name] = sorted(names)
    assert found == {name: sorted(set(labels)) for name, labels in LABELS.items()}
