"""One Beam pipeline per transform, on small real files in tmp_path (in-memory DirectRunner)."""
from __future__ import annotations

import collections
import glob
import json
import os
from pathlib import Path
from typing import Callable, Iterable

import apache_beam as beam
import cv2
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.pvalue import AsSingleton
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import BeamAssertException, assert_that, equal_to

from transforms.assign import DUPLICATES, ComputeLabelMap, DuplicateGroup, PlannedImage, PlanSplits
from transforms.discover import REJECTED, Candidate, DiscoverImages
from transforms.read import ReadAndCheck, SourceImage, content_hash, describe_source
from transforms.specs import FeatureKeys, ImageSpec, InputSpec, OutputSpec, SplitSpec
from transforms.split import order_in_shard, shard_for
from transforms.write_shards import WriteShards

TestPipeline.__test__ = False  # not a test class, though pytest would try to collect it by name

SPEC = ImageSpec(height=8, width=8, normalize="none")
LABEL_MAP = {"cat": 0, "dog": 1}


def write_image(path: Path, color=(0, 0, 255), size=(6, 10)) -> str:
    """A small solid-color image at `path` (format from the extension); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.full((*size, 3), color, np.uint8))
    return str(path)


def write_text(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def rejection_tuple(rejection) -> tuple:
    return rejection.path, rejection.stage, rejection.error


def matches(check: Callable[[list], None]) -> Callable[[list], None]:
    """An assert_that matcher from a plain function that asserts on the whole output list."""
    def matcher(actual):
        try:
            check(list(actual))
        except AssertionError as exc:
            raise BeamAssertException(str(exc)) from exc
    return matcher


# ----------------------------------------------------------------------------- DiscoverImages

@pytest.fixture
def class_folders(tmp_path) -> Path:
    root = tmp_path / "root"
    write_image(root / "cat" / "a.jpg")
    write_image(root / "cat" / "B.PNG")
    write_image(root / "dog" / "c.bmp")
    write_text(root / "dog" / "notes.txt", "not an image")
    write_text(root / "README.md", "top-level files are not class members")
    return root


def discover(spec: InputSpec, expected_candidates: Iterable[tuple], expected_rejected: Iterable[tuple]) -> None:
    with TestPipeline() as p:
        found = p | DiscoverImages(spec)
        assert_that(found["candidates"] | "C" >> beam.Map(lambda c: (c.path, c.label)),
                    equal_to(list(expected_candidates)), label="candidates")
        assert_that(found[REJECTED] | "R" >> beam.Map(rejection_tuple),
                    equal_to(list(expected_rejected)), label="rejected")


def test_discover_class_folders(class_folders):
    root = str(class_folders)
    discover(InputSpec(root),
             [(f"{root}/cat/a.jpg", "cat"), (f"{root}/cat/B.PNG", "cat"), (f"{root}/dog/c.bmp", "dog")],
             [(f"{root}/dog/notes.txt", "discover", "SkippedFile")])


def test_discover_glob(class_folders):
    root = str(class_folders)
    discover(InputSpec(f"{root}/*/*.jpg"), [(f"{root}/cat/a.jpg", "cat")], [])


def test_discover_csv_manifest(tmp_path):
    manifest = write_text(tmp_path / "m" / "list.csv",
                          'path,label\nimgs/a.jpg,cat\n"imgs/with, comma.jpg",dog\n/abs/x.png,cat\n\nbad line\n')
    folder = str(tmp_path / "m")
    discover(InputSpec(manifest),
             [(f"{folder}/imgs/a.jpg", "cat"), (f"{folder}/imgs/with, comma.jpg", "dog"), ("/abs/x.png", "cat")],
             [(manifest, "discover", "BadManifestLine")])


def test_discover_jsonl_manifest(tmp_path):
    lines = [{"path": "imgs/a.jpg", "label": "cat"}, {"path": "gs://bucket/b.jpg", "label": 7}]
    manifest = write_text(tmp_path / "list.jsonl", "\n".join(json.dumps(x) for x in lines) + '\n{"path": broken\n')
    discover(InputSpec(manifest), [(f"{tmp_path}/imgs/a.jpg", "cat"), ("gs://bucket/b.jpg", "7")],
             [(manifest, "discover", "BadManifestLine")])


# ----------------------------------------------------------------------------- ReadAndCheck

def test_read_and_check(tmp_path):
    good = write_image(tmp_path / "cat" / "good.png", size=(6, 10))
    empty = write_text(tmp_path / "cat" / "empty.jpg", "")
    missing = str(tmp_path / "cat" / "missing.jpg")
    text = write_text(tmp_path / "cat" / "text.jpg", "this is not an image")
    candidates = [Candidate(path, "cat") for path in (good, empty, missing, text)]
    expected = SourceImage(good, "cat", content_hash(Path(good).read_bytes()), "png", width=10, height=6)
    with TestPipeline() as p:
        read = (p | beam.Create(candidates)
                | beam.ParDo(ReadAndCheck(SPEC)).with_outputs(REJECTED, main="images"))
        assert_that(read.images, equal_to([expected]), label="images")
        assert_that(read[REJECTED] | beam.Map(rejection_tuple), equal_to([
            (empty, "read", "EmptyFile"), (missing, "read", "UnreadableFile"), (text, "header", "NotAnImage"),
        ]), label="rejected")


# ----------------------------------------------------------------------------- ComputeLabelMap

@pytest.mark.parametrize("labels,class_names,expected", [
    (["dog", "cat", "dog", "bird"], None, {"bird": 0, "cat": 1, "dog": 2}),
    (["3", "10", "3"], None, {"3": 3, "10": 10}),
    (["dog", "cat"], ("dog", "cat", "fish"), {"dog": 0, "cat": 1, "fish": 2}),
], ids=["sorted-names", "integers", "class-names"])
def test_compute_label_map(labels, class_names, expected):
    with TestPipeline() as p:
        label_map = (p | beam.Create([Candidate(f"/{i}.jpg", label) for i, label in enumerate(labels)])
                     | ComputeLabelMap(class_names))
        assert_that(label_map, equal_to([expected]))


# ----------------------------------------------------------------------------- PlanSplits

def source(path: str, label: str = "cat", digest: str = "") -> SourceImage:
    """PlanSplits only looks at references, so no file is needed; by default every path is unique content."""
    return SourceImage(path, label, digest or content_hash(path.encode()), "jpeg", 10, 10)


def plan(images: list[SourceImage], splits: SplitSpec = SplitSpec(), drop_duplicates: bool = False,
         label_map: dict = LABEL_MAP, check_planned=None, expected_rejected=(), expected_duplicates=None) -> None:
    with TestPipeline() as p:
        labels = p | "LabelMap" >> beam.Create([label_map])
        planned = p | beam.Create(images) | PlanSplits(splits, AsSingleton(labels), drop_duplicates)
        if check_planned is not None:
            assert_that(planned["planned"] | "P" >> beam.Map(lambda im: (im.source.path, im.label_id, im.split)),
                        matches(check_planned), label="planned")
        assert_that(planned[REJECTED] | "R" >> beam.Map(rejection_tuple), equal_to(list(expected_rejected)),
                    label="rejected")
        if expected_duplicates is not None:
            assert_that(planned[DUPLICATES], equal_to(expected_duplicates), label="duplicates")


def copies_of(n: int) -> list[SourceImage]:
    """n contents, each stored twice (under cat/ and under dog/)."""
    return [source(f"/{folder}/{i}.jpg", folder, digest=f"{i:064x}") for i in range(n) for folder in ("cat", "dog")]


@pytest.mark.parametrize("salt", ["imgrec", "other"])
def test_copies_share_a_split(salt):
    def check(planned):
        split_of = {path: split for path, _, split in planned}
        assert len(split_of) == 60
        assert all(split_of[f"/cat/{i}.jpg"] == split_of[f"/dog/{i}.jpg"] for i in range(30))
        assert len(set(split_of.values())) > 1
        assert {(path, label) for path, label, _ in planned} == {(f"/{f}/{i}.jpg", LABEL_MAP[f])
                                                                 for i in range(30) for f in ("cat", "dog")}

    plan(copies_of(30), SplitSpec(salt=salt), check_planned=check)


def test_duplicates_reported_and_dropped():
    images = [*copies_of(2), source("/cat/unique.jpg")]
    groups = [DuplicateGroup(f"{i:064x}", (f"/cat/{i}.jpg", f"/dog/{i}.jpg"), ("cat", "dog")) for i in range(2)]

    def check(planned):
        assert sorted(path for path, _, _ in planned) == ["/cat/0.jpg", "/cat/1.jpg", "/cat/unique.jpg"]

    plan(images, drop_duplicates=True, check_planned=check, expected_duplicates=groups,
         expected_rejected=[(f"/dog/{i}.jpg", "dedup", "DuplicateImage") for i in range(2)])


def test_unknown_label_rejected():
    def check(planned):
        assert [path for path, _, _ in planned] == ["/cat/1.jpg"]

    plan([source("/cat/1.jpg"), source("/fish/1.jpg", "fish")], check_planned=check,
         expected_rejected=[("/fish/1.jpg", "label", "UnknownLabel")])


def test_stratified_exact_counts_per_label():
    images = [source(f"/cat/{i}.jpg", "cat") for i in range(10)] + [source(f"/dog/{i}.jpg", "dog") for i in range(20)]

    def check(planned):
        counts = collections.Counter((label, split) for _, label, split in planned)
        assert counts == {(0, "train"): 7, (0, "val"): 2, (0, "test"): 1,
                          (1, "train"): 14, (1, "val"): 4, (1, "test"): 2}

    plan(images, SplitSpec(method="stratified"), check_planned=check)


# ----------------------------------------------------------------------------- WriteShards

COLORS = {"cat": (0, 0, 255), "dog": (255, 0, 0)}


def planned_image(path: str, label: str, split: str) -> PlannedImage:
    data = Path(path).read_bytes()
    return PlannedImage(describe_source(Candidate(path, label), data, SPEC), LABEL_MAP[label], split)


def read_shards(pattern: str) -> dict[str, list[tuple[str, int]]]:
    """{shard file name: [(source path, label id), ...] in file order}, read with tf.data."""
    shards = {}
    for path in sorted(glob.glob(pattern)):
        compression = "GZIP" if path.endswith(".gz") else ""
        records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path, compression)]
        shards[os.path.basename(path)] = [(e.features.feature["image/source_path"].bytes_list.value[0].decode(),
                                           e.features.feature["label"].int64_list.value[0]) for e in records]
    return shards


SEED = 5
# 12 cats and 12 dogs in train, 3 dogs in val.
PLAN = [(label, split, i) for split, labels, n in (("train", ("cat", "dog"), 12), ("val", ("dog",), 3))
        for label in labels for i in range(n)]


def shard_name(split: str, index: int, suffix: str) -> str:
    return f"{split}-{index:05d}-of-00002{suffix}"


@pytest.mark.parametrize("compression,suffix", [("none", ".tfrecord"), ("gzip", ".tfrecord.gz")])
def test_write_shards(tmp_path, compression, suffix):
    images = [planned_image(write_image(tmp_path / "in" / split / label / f"{i}.png", COLORS[label]), label, split)
              for label, split, i in PLAN]
    staging = tmp_path / "staging"
    output = OutputSpec(str(tmp_path / "out"), num_shards=2, shuffle_seed=SEED, compression=compression)
    # Each image goes to the shard its path hashes to; a shard no image hashes to has no file yet.
    expected = collections.defaultdict(list)
    for im in images:
        expected[shard_name(im.split, shard_for(im.source.path, SEED, 2), suffix)].append(im.source.path)
    with TestPipeline() as p:
        written = p | beam.Create(images) | WriteShards(SPEC, FeatureKeys(), output, str(staging))
        assert_that(written["shards"] | "S" >> beam.Map(lambda s: (os.path.basename(s.path), s.num_examples)),
                    equal_to([(name, len(paths)) for name, paths in expected.items()]), label="shards")
        assert_that(written["planned_counts"], equal_to([{"train": 24, "val": 3}]), label="planned_counts")
        assert_that(written[REJECTED], equal_to([]), label="rejected")

    shards = read_shards(str(staging / "*"))
    assert set(shards) == set(expected)  # and no attempt files are left
    label_of = {im.source.path: im.label_id for im in images}
    for name, records in shards.items():  # each shard in the seeded order, with the right labels
        assert [path for path, _ in records] == sorted(expected[name], key=lambda path: order_in_shard(path, SEED))
        assert all(label == label_of[path] for path, label in records)


def test_write_shards_rejects_a_file_changed_after_planning(tmp_path):
    kept = planned_image(write_image(tmp_path / "cat" / "kept.png"), "cat", "train")
    changed_path = write_image(tmp_path / "cat" / "changed.png")
    changed = planned_image(changed_path, "cat", "train")
    write_image(tmp_path / "cat" / "changed.png", color=(1, 2, 3))  # rewritten after planning
    with TestPipeline() as p:
        written = (p | beam.Create([kept, changed])
                   | WriteShards(SPEC, FeatureKeys(), OutputSpec("unused", num_shards=1), str(tmp_path / "staging")))
        assert_that(written[REJECTED] | beam.Map(lambda r: (*rejection_tuple(r), r.split)),
                    equal_to([(changed_path, "read", "FileChanged", "train")]), label="rejected")
        assert_that(written["shards"] | "S" >> beam.Map(lambda s: (s.num_examples, s.label_counts)),
                    equal_to([(1, (("cat", 1),))]), label="shards")
    assert read_shards(str(tmp_path / "staging" / "*")) == {"train-00000-of-00001.tfrecord": [(kept.source.path, 0)]}
