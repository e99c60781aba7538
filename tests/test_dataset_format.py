"""transforms.dataset_format: file names, the record index, metadata.json as typed values."""
from __future__ import annotations

import json
import posixpath

import pytest

from transforms import dataset_format as fmt
from transforms.dataset_format import (
    DatasetMetadata,
    DuplicateSummary,
    FormatError,
    IndexEntry,
    InputAccounting,
    ReuseSummary,
    SplitInfo,
)

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------------------- file names

@pytest.mark.parametrize("split,index,count,compression,name", [
    ("train", 0, 2, "none", "train-00000-of-00002.tfrecord"),
    ("val", 13, 100, "gzip", "val-00013-of-00100.tfrecord.gz"),
    ("my-split_2", 99999, 99999, "none", "my-split_2-99999-of-99999.tfrecord"),
])
def test_shard_file_names_round_trip(split, index, count, compression, name):
    assert fmt.shard_file_name(split, index, count, compression) == name
    assert fmt.parse_shard_file_name(name) == (split, index, count)


@pytest.mark.parametrize("name", [
    "train-1-of-2.tfrecord", "train-00000-of-00002.tfrecords", "train-00000-of-00002.tfrecord.idx",
    "errors-00000-of-00001.jsonl", "metadata.json", "index/train-00000-of-00002.tfrecord.idx",
    "train-00000-of-00002", "train-00000-of-00002.tfrecord.gz.tmp-1",
])
def test_other_names_are_not_shards(name):
    assert fmt.parse_shard_file_name(name) is None


def test_compression_names():
    assert (fmt.shard_suffix("none"), fmt.shard_suffix("gzip")) == (".tfrecord", ".tfrecord.gz")
    assert (fmt.tf_compression_type("none"), fmt.tf_compression_type("gzip")) == ("", "GZIP")
    for bad in ("zstd", "GZIP", ""):
        with pytest.raises(FormatError, match="none, gzip"):
            fmt.tf_compression_type(bad)
        with pytest.raises(FormatError):
            fmt.shard_file_name("train", 0, 1, bad)


def test_index_files_live_in_their_own_folder():
    assert fmt.index_file_name("train-00000-of-00002.tfrecord") == "index/train-00000-of-00002.tfrecord.idx"
    assert fmt.index_file_name("val-00001-of-00002.tfrecord.gz") == "index/val-00001-of-00002.tfrecord.gz.idx"


@pytest.mark.parametrize("output", ["/data/out", "/data/out/", "gs://bucket/out", "gs://bucket/out/"])
def test_staging_is_hidden_inside_the_output(output):
    base = output.rstrip("/")
    assert fmt.join(output, "x") == f"{base}/x"
    assert fmt.staging_dir(output) == f"{base}/.imgrec-staging"
    assert fmt.parts_dir(output) == f"{base}/.imgrec-staging/parts"
    assert fmt.run_dir(output, "abc") == f"{base}/.imgrec-staging/run-abc"


def test_index_entry_line_round_trip():
    entry = IndexEntry(offset=1024, length=616, sha256="ab" * 32, image_offset=40, image_length=560)
    line = entry.to_line()
    assert line == f"1024 616 {'ab' * 32} 40 560\n"
    assert line.split()[:2] == ["1024", "616"]  # DALI's index format: offset, framed length
    assert IndexEntry.from_line(line) == entry
    assert entry.shifted(100) == IndexEntry(1124, 616, "ab" * 32, 40, 560)


@pytest.mark.parametrize("line", ["1 2 abc 3", "1 2 abc 3 4 5", ""])
def test_index_line_with_wrong_field_count(line):
    with pytest.raises(FormatError, match="expected 5"):
        IndexEntry.from_line(line)


# ----------------------------------------------------------------------------- metadata.json

def split_info(name: str, counts: tuple[int, ...], labels: dict) -> SplitInfo:
    files = tuple(fmt.shard_file_name(name, i, len(counts), "none") for i in range(len(counts)))
    return SplitInfo(num_examples=sum(counts), num_bytes=100 * sum(counts), files=files, shard_lengths=counts,
                     label_counts=labels, rejected=1)


def make_metadata(**overrides) -> DatasetMetadata:
    values = dict(
        splits={"train": split_info("train", (2, 1), {"cat": 2, "dog": 1}),
                "val": split_info("val", (1,), {"dog": 1}),
                "test": split_info("test", (), {})},
        features={"image": {"role": "image", "dtype": "string"}, "label": {"role": "label", "dtype": "int64"},
                  "label/text": {"role": "label_text", "dtype": "string"}},
        image={"height": 8, "width": 8, "channels": 3, "dtype": "uint8", "encoding": "raw"},
        compression="none",
        label_map={"dog": 1, "cat": 0},
        inputs=InputAccounting(total=9, written=4, rejected=5, errors=2,
                               rejected_by_error={"SkippedFile": 3, "CorruptImage": 2},
                               rejected_by_stage={"discover": 3, "decode": 2}),
        duplicates=DuplicateSummary(1, 1, False, ({"sha256": "00" * 32, "paths": ["a", "b"], "labels": ["x", "y"]},)),
        error_files=("errors-00000-of-00001.jsonl",),
        fingerprint="f" * 64,
        pixel_fingerprint="p" * 64,
        config={"output": {"path": "out"}},
        run={"run_id": "r1", "runner": "DirectRunner"},
        versions={"imgrec": "0.1.0"},
    )
    return DatasetMetadata(**{**values, **overrides})


@pytest.mark.parametrize("overrides", [
    {}, {"reuse": ReuseSummary("/old/dataset", reused=3, converted=1)},
    {"exports": ("dataset_info.json", "features.json")}, {"compression": "gzip"},
], ids=["plain", "reuse", "exports", "gzip"])
def test_metadata_round_trips_through_json(overrides):
    metadata = make_metadata(**overrides)
    text = metadata.dumps()
    assert DatasetMetadata.loads(text) == metadata
    assert DatasetMetadata.from_json(json.loads(text)) == metadata
    value = json.loads(text)
    assert value["format_version"] == fmt.FORMAT_VERSION == 2
    assert list(value["label_map"]) == ["cat", "dog"]  # ordered by id
    assert value["splits"]["train"]["num_shards"] == 2 and value["splits"]["test"]["num_shards"] == 0
    assert value["inputs"]["error_fraction"] == pytest.approx(2 / (4 + 2))  # errors among the images


def test_metadata_derived_views():
    metadata = make_metadata(exports=("dataset_info.json",))
    assert metadata.shard_files == ("train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord",
                                    "val-00000-of-00001.tfrecord")
    assert metadata.index_files == tuple(f"index/{name}.idx" for name in metadata.shard_files)
    assert set(metadata.owned_files()) == {*metadata.shard_files, *metadata.index_files,
                                           "errors-00000-of-00001.jsonl", "dataset_info.json", "metadata.json"}
    assert metadata.role_keys() == {"image": "image", "label": "label", "label_text": "label/text"}
    assert metadata.class_names() == ["cat", "dog"]
    assert metadata.splits["train"].num_shards == 2
    assert InputAccounting(0, 0, 0, 0, {}, {}).error_fraction == 0.0


REQUIRED = ("splits", "features", "image", "compression", "label_map", "inputs", "error_files", "fingerprint",
            "pixel_fingerprint", "config", "run")


@pytest.mark.parametrize("key", REQUIRED)
def test_missing_field_is_a_format_error(key):
    value = make_metadata().to_json()
    del value[key]
    with pytest.raises(FormatError, match=repr(key)):
        DatasetMetadata.from_json(value)


@pytest.mark.parametrize("path", [("splits", "train", "num_examples"), ("splits", "val", "files"),
                                  ("inputs", "total"), ("inputs", "rejected_by_error")])
def test_missing_nested_field_is_a_format_error(path):
    value = make_metadata().to_json()
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    with pytest.raises(FormatError, match=repr(path[-1])):
        DatasetMetadata.from_json(value)


@pytest.mark.parametrize("version", [1, 3, None, "2"])
def test_other_format_versions_are_refused(version):
    value = make_metadata().to_json()
    value["format_version"] = version
    with pytest.raises(FormatError, match=f"format_version {version!r} is not supported"):
        DatasetMetadata.from_json(value)
    del value["format_version"]
    with pytest.raises(FormatError, match="format_version None"):
        DatasetMetadata.from_json(value)


@pytest.mark.parametrize("edit,message", [
    (lambda v: v["splits"]["train"].update(num_examples="3"), "num_examples must be int"),
    (lambda v: v["splits"]["train"].update(num_examples=True), "num_examples must be int"),
    (lambda v: v["splits"]["train"].update(shard_lengths=[3]), "2 files but 1 shard_lengths"),
    (lambda v: v["splits"]["train"].update(num_shards=3), "num_shards 3 but 2 files"),
    (lambda v: v["splits"]["train"].update(shard_lengths=["1", "x"]), r"shard_lengths\[0\] must be a count, got '1'"),
    (lambda v: v["splits"]["train"].update(shard_lengths=[1, -1]), r"shard_lengths\[1\] must be a count"),
    (lambda v: v["splits"]["train"].update(files=[None, "x"]), r"files\[0\] must be str, got None"),
    (lambda v: v["splits"]["train"]["label_counts"].update(cat=-1), "must be a count"),
    (lambda v: v["label_map"].update(cat="0"), "must be a count"),
    (lambda v: v.update(compression="zstd"), "unknown compression 'zstd'"),
    (lambda v: v.update(fingerprint=None), "fingerprint must be str"),
    (lambda v: v.update(splits=[]), "splits must be dict"),
    (lambda v: v["features"].update(label="int64"), r"features\['label'\] must be an object with a role"),
    (lambda v: v["features"]["label"].pop("role"), r"features\['label'\] must be an object with a role"),
])
def test_wrong_types_are_format_errors(edit, message):
    value = make_metadata().to_json()
    edit(value)
    with pytest.raises(FormatError, match=message):
        DatasetMetadata.from_json(value)


@pytest.mark.parametrize("text,message", [("{not json", "not valid JSON"), ("[1, 2]", "JSON object, not list"),
                                          ('"text"', "JSON object, not str"),
                                          (b'{"name": "\xff"}', "not valid JSON: 'utf-8' codec")])
def test_unreadable_metadata_text(text, message):
    with pytest.raises(FormatError, match=message):
        DatasetMetadata.loads(text)


def test_format_error_is_a_value_error():
    assert issubclass(FormatError, ValueError)


def test_parse_index():
    entries = [IndexEntry(0, 40, "ab" * 32, 10, 5), IndexEntry(40, 50, "cd" * 32, 12, 7)]
    assert fmt.parse_index("".join(e.to_line() for e in entries)) == entries
    assert fmt.parse_index("") == []


def test_only_imgrecs_metadata_is_a_dataset():
    assert fmt.is_dataset_metadata(make_metadata().to_json())
    assert fmt.is_dataset_metadata({"format_version": 1, "splits": {}, "versions": {"imgrec": "0.1.0"}})
    for other in ({"name": "my project"}, [], "x", {"format_version": "2", "splits": {}, "versions": {"imgrec": 1}},
                  {"format_version": 2, "splits": {}, "versions": {"tfds": "4"}}):
        assert not fmt.is_dataset_metadata(other), other


# ----------------------------------------------------------------------------- listed_files

def test_listed_files_of_the_current_version():
    value = make_metadata(exports=("dataset_info.json",)).to_json()
    assert sorted(fmt.listed_files(value)) == sorted(
        f for f in make_metadata(exports=("dataset_info.json",)).owned_files() if f != "metadata.json")


def test_listed_files_of_a_version_1_dataset_have_no_index():
    value = {"format_version": 1, "splits": {"train": {"files": ["train-00000-of-00001.tfrecord"]},
                                             "val": {"files": []}},
             "error_files": ["errors-00000-of-00003.jsonl"]}
    assert fmt.listed_files(value) == ["train-00000-of-00001.tfrecord", "errors-00000-of-00003.jsonl"]
    del value["format_version"]  # the first datasets had no version at all
    assert fmt.listed_files(value) == ["train-00000-of-00001.tfrecord", "errors-00000-of-00003.jsonl"]


def test_listed_files_skip_absolute_paths_urls_and_parent_references():
    """A hand-edited metadata.json must not make a republish delete files elsewhere."""
    value = {"format_version": 2, "splits": {"train": {"files": ["/etc/passwd", "gs://b/y", "", "ok.tfrecord"]}},
             "error_files": ["../../errors.jsonl", None], "exports": ["/abs", "features.json"]}
    listed = fmt.listed_files(value)
    assert {"ok.tfrecord", "index/ok.tfrecord.idx", "features.json"} <= set(listed)
    assert not {"/etc/passwd", "gs://b/y", "", "../../errors.jsonl", "/abs"} & set(listed)
    assert all(not posixpath.normpath(f).startswith(("..", "/")) for f in listed), listed
    assert fmt.listed_files({}) == []


@pytest.mark.parametrize("name", ["../../outside.tfrecord", "sub/../../outside.tfrecord"])
def test_listed_files_never_resolve_outside_the_output(name):
    value = {"format_version": 2, "splits": {"train": {"files": [name]}}, "error_files": [name]}
    escaping = [f for f in fmt.listed_files(value) if posixpath.normpath(f).startswith("..")]
    assert escaping == []


def test_split_files_names_the_existing_splits():
    metadata = make_metadata()
    assert fmt.split_files(metadata, "val") == ("val-00000-of-00001.tfrecord",)
    with pytest.raises(ValueError, match="no split 'training' in this dataset; it has train, val, test"):
        fmt.split_files(metadata, "training")
