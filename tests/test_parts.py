"""transforms.write.parts without Beam: part digests, cutting shards into parts, converting a part
(records, outcome, record index, resumption, reuse) and concatenating parts into a shard."""
from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import pathlib
import shutil
import socket

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import write_photo
from transforms.dataset_format import METADATA_FILE, IndexEntry, RecordLocation
from transforms.images.image_header import ImageHeader
from transforms.images.process import image_to_record
from transforms.inputs.source import describe_source
from transforms.plan.reuse import attach, read_index
from transforms.plan.split import order_in_shard
from transforms.refs import Candidate, PlannedImage, SourceImage
from transforms.specs import FeatureKeys, ImageSpec, OutputSpec
from transforms.write import tfrecord
from transforms.write.example import RecordFields
from transforms.write.parts import (
    PartOutcome,
    PartResult,
    PartTask,
    ShardPlan,
    WriterSettings,
    concat_shard,
    convert_image,
    convert_part,
    cut_into_parts,
    part_digest,
    part_size,
    record_digest,
    shard_keys,
    shard_order,
)

pytestmark = pytest.mark.unit

SPEC = ImageSpec(height=8, width=12, normalize="unit", encoding="raw")
KEYS = FeatureKeys()
VERSIONS = {"imgrec": "0.1.0", "opencv": "5", "numpy": "2", "pillow": "12"}
SHARD = ("train", 0, 1)


def settings_for(tmp_path: pathlib.Path, name: str = "run", part_images: int = 3, compression: str = "none",
                 parts: str = "parts") -> WriterSettings:
    return WriterSettings(image=SPEC, keys=KEYS, output=OutputSpec(str(tmp_path / "out"), compression=compression),
                          max_file_bytes=2**20, run_dir=str(tmp_path / name), parts_dir=str(tmp_path / parts),
                          record_digest=record_digest(SPEC, KEYS, VERSIONS), part_images=part_images)


def planned(path: pathlib.Path, label_id: int = 0, split: str = "train") -> PlannedImage:
    source = describe_source(Candidate(str(path), path.parent.name), path.read_bytes(), SPEC)
    return PlannedImage(source, label_id, split)


@pytest.fixture
def images(tmp_path) -> list[PlannedImage]:
    paths = []
    for i in range(8):
        path = tmp_path / "in" / ("cat" if i % 2 else "dog") / f"{i}{'.png' if i % 3 == 0 else '.jpg'}"
        write_photo(path, seed=i, size=(10 + i, 14))
        paths.append(path)
    return [planned(p, label_id=int(p.parent.name == "cat")) for p in paths]


def read_records(path: pathlib.Path) -> list[bytes]:
    return [bytes(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]


# ----------------------------------------------------------------------------- digests and plans

def source(path: str = "/in/cat/1.jpg", **changes) -> PlannedImage:
    values = dict(path=path, label="cat", content_hash="ab" * 32, header=ImageHeader("jpeg", 10, 10))
    label_id = changes.pop("label_id", 0)
    return PlannedImage(SourceImage(**{**values, **changes}), label_id, "train")


def test_part_digest_changes_with_every_field_that_decides_the_records():
    base = [source(), source("/in/cat/2.jpg")]
    digest = part_digest(base, "settings")
    assert part_digest([source(), source("/in/cat/2.jpg")], "settings") == digest  # equal values, equal digest
    changed = [
        part_digest(base, "other settings"),
        part_digest(base[::-1], "settings"),  # the order of records in the part
        part_digest(base[:1], "settings"),
        part_digest([source("/in/cat/1b.jpg"), base[1]], "settings"),
        part_digest([source(content_hash="cd" * 32), base[1]], "settings"),
        part_digest([source(label_id=1), base[1]], "settings"),
        part_digest([source(label="kitten"), base[1]], "settings"),
    ]
    assert digest not in changed and len(set(changed)) == len(changed)
    # Not part of the records: the header's format and size, the split.
    assert part_digest([source(header=ImageHeader("png", 3, 4)), base[1]], "settings") == digest
    assert part_digest([dataclasses.replace(base[0], split="val"), base[1]], "settings") == digest


def test_record_digest_changes_with_image_settings_keys_and_versions():
    digest = record_digest(SPEC, KEYS, VERSIONS)
    same = ImageSpec(height=8, width=12, normalize="unit", encoding="raw")
    assert record_digest(same, FeatureKeys(), dict(VERSIONS)) == digest
    others = {record_digest(dataclasses.replace(SPEC, interpolation="cubic"), KEYS, VERSIONS),
              record_digest(SPEC, FeatureKeys(label_text=""), VERSIONS),
              record_digest(SPEC, KEYS, {**VERSIONS, "opencv": "6"})}
    assert digest not in others and len(others) == 3


def test_cut_into_parts(tmp_path):
    settings = settings_for(tmp_path, part_images=64)
    images = [source(f"/in/{i:03d}.jpg") for i in range(130)]
    parts = cut_into_parts(SHARD, images, settings)
    assert [len(p.images) for p in parts] == [64, 64, 2] and [p.index for p in parts] == [0, 1, 2]
    assert [im for p in parts for im in p.images] == images  # consecutive, in shard order
    assert all(p.shard == SHARD and p.digest == part_digest(p.images, settings.record_digest) for p in parts)
    assert cut_into_parts(SHARD, [], settings) == []


def test_part_size_on_a_local_pool_and_on_a_cluster(tmp_path):
    cluster = settings_for(tmp_path, part_images=256)
    assert part_size(("train", 0, 100), 5000, 500_000, cluster) == 256
    two = dataclasses.replace(cluster, local_processes=2)
    assert part_size(("train", 0, 4), 1750, 10_000, two) == 1750  # <= 1/4 of the images: a whole shard
    assert part_size(("train", 0, 2), 3500, 10_000, two) == 256  # more: 8+ parts per process, capped
    assert part_size(("val", 0, 1), 2000, 10_000, two) == 256  # a split of one shard: parts
    assert part_size(("train", 0, 1), 40, 40, two) == 3  # 40 photos still spread over both processes
    assert part_size(("train", 0, 1), 3, 3, two) == 1
    assert part_size(("val", 0, 8), 0, 0, two) == 1


def test_a_shard_of_one_part_is_that_part_linked_not_copied(tmp_path, images):
    settings = settings_for(tmp_path, part_images=100)
    (result,) = convert_all(images, settings)
    shard = concat_shard(ShardPlan(SHARD, 1), [result], settings)
    written = tmp_path / "run" / shard.file
    part = tmp_path / "parts" / f"{result.digest}.records"
    assert written.stat().st_ino == part.stat().st_ino and written.read_bytes() == part.read_bytes()
    assert shard.num_examples == len(images)


def test_shard_order_is_a_seeded_shuffle_independent_of_arrival():
    images = [source(f"/in/{i:03d}.jpg") for i in range(40)]
    ordered = shard_order(images, seed=3)
    assert [im.source.path for im in ordered] == sorted((im.source.path for im in images),
                                                        key=lambda p: order_in_shard(p, 3))
    assert shard_order(images[::-1], seed=3) == ordered
    assert shard_order(images, seed=4) != ordered


def test_shard_keys_cover_every_shard_of_every_split():
    assert shard_keys({"val": 2, "train": 2}) == [("train", 0, 2), ("train", 1, 2), ("val", 0, 2), ("val", 1, 2)]
    assert shard_keys({}) == []


# ----------------------------------------------------------------------------- converting a part

def test_convert_part_writes_records_and_their_index(tmp_path, images):
    settings = settings_for(tmp_path, part_images=8)
    (task,) = cut_into_parts(SHARD, images, settings)
    outcome = convert_part(task, settings)
    records = read_records(tmp_path / "parts" / f"{task.digest}.records")
    assert outcome.records == len(records) == 8 and outcome.rejections == () and outcome.reused == 0
    assert outcome.num_bytes == sum(map(len, records))
    assert dict(outcome.label_counts) == {"cat": 4, "dog": 4}
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == [f"{task.digest}.json", f"{task.digest}.records"]
    assert PartOutcome.from_json((tmp_path / "parts" / f"{task.digest}.json").read_text()) == outcome
    data = (tmp_path / "parts" / f"{task.digest}.records").read_bytes()
    offset = 0
    for entry, record, image in zip(outcome.index, records, task.images):
        assert (entry.offset, entry.length, entry.sha256) == (offset, len(record) + 16, image.source.content_hash)
        assert tfrecord.read_record_at(io.BytesIO(data), entry.offset, entry.length) == record
        fields = RecordFields(image.label_id, image.source.label, image.source.path, image.source.content_hash)
        source_bytes = pathlib.Path(image.source.path).read_bytes()
        expected = image_to_record(source_bytes, image.source.header, fields, SPEC, KEYS)
        assert record == expected.data
        pixels = record[entry.image_offset:entry.image_offset + entry.image_length]
        assert pixels == tf.train.Example.FromString(record).features.feature["image"].bytes_list.value[0]
        offset += entry.length


def test_bad_images_in_a_part_become_rejections_with_their_split(tmp_path, images):
    corrupt = tmp_path / "in" / "cat" / "corrupt.jpg"
    corrupt.write_bytes(pathlib.Path(images[1].source.path).read_bytes()[:-40])  # cut in its scan data
    changed = images[3]
    pathlib.Path(changed.source.path).write_bytes(pathlib.Path(images[5].source.path).read_bytes())
    gone = images[4]
    pathlib.Path(gone.source.path).unlink()
    task_images = [images[0], planned(corrupt, 1, "val"), changed, gone, images[6]]
    settings = settings_for(tmp_path, part_images=8)
    (task,) = cut_into_parts(("val", 0, 1), task_images, settings)
    outcome = convert_part(task, settings)
    assert outcome.records == 2 == len(outcome.index)
    assert [(pathlib.Path(r.path).name, r.stage, r.error, r.split) for r in outcome.rejections] == [
        ("corrupt.jpg", "decode", "CorruptImage", "val"),
        (pathlib.Path(changed.source.path).name, "read", "FileChanged", "val"),
        (pathlib.Path(gone.source.path).name, "read", "UnreadableFile", "val")]
    assert [e.sha256 for e in outcome.index] == [images[0].source.content_hash, images[6].source.content_hash]


def test_a_finished_part_is_taken_as_it_is(tmp_path, images):
    """A restarted run finds finished parts by digest and does not read the images again."""
    settings, task, first, records = finished_part(tmp_path, images)
    for image in images:
        pathlib.Path(image.source.path).unlink()
    again = convert_part(task, dataclasses.replace(settings, run_dir=str(tmp_path / "restarted")))
    assert (again.resumed, first.resumed) == (8, 0)
    assert dataclasses.replace(again, resumed=0) == first
    assert (tmp_path / "parts" / f"{task.digest}.records").read_bytes() == records


def test_a_part_this_run_finished_is_taken_but_not_resumed(tmp_path, images):
    """A task run again in the same run (Spark runs a lost worker's tasks again) takes the part
    its first attempt finished; that is no record "an earlier, unfinished run had written"."""
    settings, task, first, _ = finished_part(tmp_path, images)
    again = convert_part(task, settings)
    assert again == first and again.resumed == 0


def test_a_part_cut_short_is_converted_again(tmp_path, images):
    """What a killed attempt leaves (records under a temporary name, or renamed but no outcome
    yet) is never taken: the part is converted again, to the same bytes."""
    settings, task, first, records = finished_part(tmp_path, images)
    parts = tmp_path / "parts"
    (parts / f"{task.digest}.json").unlink()  # killed after the records, before the outcome
    (parts / f"{task.digest}.records.tmp-killed").write_bytes(records[:len(records) // 2])
    again = convert_part(task, settings)
    assert again == first and again.resumed == 0
    assert (parts / f"{task.digest}.records").read_bytes() == records


def zeroed(data: bytes, start: int, length: int) -> bytes:
    return data[:start] + bytes(length) + data[start + length:]


@pytest.mark.parametrize("damage", [
    lambda records, outcome: records.write_bytes(records.read_bytes()[:1000]),  # torn by a power loss
    lambda records, outcome: records.write_bytes(records.read_bytes() + b"\0"),
    lambda records, outcome: records.write_bytes(zeroed(records.read_bytes(), 3000, 64)),  # same length
    lambda records, outcome: outcome.write_bytes(b""),
    lambda records, outcome: outcome.write_bytes(outcome.read_bytes()[:-20]),
    lambda records, outcome: outcome.write_text(outcome.read_text().replace('"index": [', '"index": ["x", ')),
    lambda records, outcome: outcome.write_text(outcome.read_text().replace('"path"', '"where"')),
], ids=["records torn", "records too long", "records zeroed", "outcome empty", "outcome torn", "bad index line",
        "bad rejection"])
def test_a_finished_part_that_does_not_check_out_is_converted_again(tmp_path, images, damage):
    bad = tmp_path / "in" / "cat" / "corrupt.jpg"  # a rejection in the outcome too
    bad.write_bytes(pathlib.Path(images[1].source.path).read_bytes()[:-40])  # cut in its scan data
    settings = settings_for(tmp_path, part_images=9)
    (task,) = cut_into_parts(SHARD, [*images, planned(bad, 1)], settings)
    first = convert_part(task, settings)
    records_file = tmp_path / "parts" / f"{task.digest}.records"
    records = records_file.read_bytes()
    damage(records_file, tmp_path / "parts" / f"{task.digest}.json")
    again = convert_part(task, settings)
    assert again == first and again.resumed == 0
    assert records_file.read_bytes() == records


def test_a_finished_part_that_found_a_file_changed_is_converted_again_once_it_is_back(tmp_path, images):
    """A file changed (or unreadable) during one run is no verdict on its bytes: once restored,
    the next run writes it instead of repeating the old rejection forever. The new attempt
    writes a new file and renames it, so a one-part shard, which is the earlier records file
    hard-linked, does not change under its reader."""
    settings = settings_for(tmp_path, part_images=8)
    (task,) = cut_into_parts(SHARD, images, settings)
    path = pathlib.Path(images[2].source.path)
    original = path.read_bytes()
    path.write_bytes(b"a sync tool rewrote it" + original)
    first = convert_part(task, settings)
    assert [(r.error, r.path) for r in first.rejections] == [("FileChanged", str(path))]
    shard = tmp_path / "run" / concat_shard(ShardPlan(SHARD, 1), [part_result(task, first)], settings).file
    linked = shard.read_bytes()
    path.write_bytes(original)
    again = convert_part(task, settings)
    assert (again.records, again.rejections, again.resumed) == (8, (), 0)
    assert shard.read_bytes() == linked


def test_a_finished_part_with_corrupt_images_is_taken_under_a_renamed_split(tmp_path, images):
    """A rejection that follows from the bytes stands; its split is the one this run names."""
    corrupt = tmp_path / "in" / "cat" / "corrupt.jpg"
    corrupt.write_bytes(pathlib.Path(images[1].source.path).read_bytes()[:-40])  # cut in its scan data
    settings = settings_for(tmp_path, part_images=8)
    task_images = [*images[:3], planned(corrupt, 1)]
    (first_task,) = cut_into_parts(("train", 0, 1), task_images, settings)
    first = convert_part(first_task, settings)
    corrupt.unlink()  # taken as it is: not read again
    (renamed,) = cut_into_parts(("tr", 0, 1), task_images, settings)
    again = convert_part(renamed, dataclasses.replace(settings, run_dir=str(tmp_path / "next")))
    assert again.resumed == 3
    assert [(r.error, r.split) for r in again.rejections] == [("CorruptImage", "tr")]
    assert [r.split for r in first.rejections] == ["train"]

def finished_part(tmp_path, images) -> tuple[WriterSettings, PartTask, PartOutcome, bytes]:
    """One part of all `images`, converted: its settings, task, outcome and records file's bytes."""
    settings = settings_for(tmp_path, part_images=8)
    (task,) = cut_into_parts(SHARD, images, settings)
    outcome = convert_part(task, settings)
    return settings, task, outcome, (tmp_path / "parts" / f"{task.digest}.records").read_bytes()


# ----------------------------------------------------------------------------- concatenating a shard

def part_result(task, outcome: PartOutcome) -> PartResult:
    """What the writer passes on for a converted part: the task's place, the outcome's counts."""
    values = {**{f.name: getattr(outcome, f.name) for f in dataclasses.fields(outcome)},
              "shard": task.shard, "index": task.index, "images": len(task.images)}
    return PartResult(**{f.name: values[f.name] for f in dataclasses.fields(PartResult)})


def convert_all(images, settings) -> list[PartResult]:
    return [part_result(task, convert_part(task, settings)) for task in cut_into_parts(SHARD, images, settings)]


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_concatenated_parts_equal_writing_the_shard_in_one_pass(tmp_path, images, compression):
    in_parts = settings_for(tmp_path, "parts_run", part_images=3, compression=compression, parts="p3")
    results = convert_all(images, in_parts)
    assert [r.images for r in results] == [3, 3, 2]
    shard = concat_shard(ShardPlan(SHARD, 3), results[::-1], in_parts)  # parts arrive in any order
    name = "train-00000-of-00001.tfrecord" + (".gz" if compression == "gzip" else "")
    assert (shard.file, shard.num_examples, shard.split, shard.index, shard.num_shards) == (name, 8, "train", 0, 1)
    assert dict(shard.label_counts) == {"cat": 4, "dog": 4}
    assert shard.converters == (f"{socket.gethostname()}:{os.getpid()}",)  # converted in this process

    one_pass = settings_for(tmp_path, "one_pass_run", part_images=100, parts="p100")
    (single,) = convert_all(images, one_pass)
    expected = (tmp_path / "p100" / f"{single.digest}.records").read_bytes()
    written = (tmp_path / "parts_run" / name).read_bytes()
    assert (gzip.decompress(written) if compression == "gzip" else written) == expected
    assert shard.num_bytes == single.num_bytes
    index = (tmp_path / "parts_run" / "index" / f"{name}.idx").read_text()
    outcome = PartOutcome.from_json((tmp_path / "p100" / f"{single.digest}.json").read_text())
    assert index == "".join(entry.to_line() for entry in outcome.index)
    assert sorted(p.name for p in (tmp_path / "parts_run").iterdir()) == ["index", name]  # no temporaries


def test_a_missing_part_fails_the_shard(tmp_path, images):
    settings = settings_for(tmp_path, part_images=3)
    results = convert_all(images, settings)
    with pytest.raises(RuntimeError, match=r"parts \[0, 2\] != 0..2"):
        concat_shard(ShardPlan(SHARD, 3), [results[0], results[2]], settings)


# ----------------------------------------------------------------------------- reuse

def test_a_reused_record_equals_a_fresh_one_and_a_damaged_source_is_converted_again(tmp_path, images):
    settings = settings_for(tmp_path, part_images=3)
    concat_shard(ShardPlan(SHARD, 3), convert_all(images, settings), settings)
    shard = str(tmp_path / "run" / "train-00000-of-00001.tfrecord")
    locations = index_locations(shard, tmp_path)
    assert set(locations) == {im.source.content_hash for im in images}
    image = images[2]
    converted = convert_image(image, settings)
    fresh, reused = converted.record, converted.reused
    assert reused is False
    with_reuse = dataclasses.replace(image, reuse=locations[image.source.content_hash])
    assert convert_image(with_reuse, settings) == dataclasses.replace(converted, reused=True)
    # Another label around the same pixels: the record is rebuilt, the pixel bytes copied.
    again = convert_image(dataclasses.replace(with_reuse, label_id=7), settings)
    record, was_reused = again.record, again.reused
    assert was_reused and tf.train.Example.FromString(record.data).features.feature["label"].int64_list.value == [7]
    pixels = fresh.data[fresh.image_offset:fresh.image_offset + fresh.image_length]
    assert record.data[record.image_offset:record.image_offset + record.image_length] == pixels

    data = bytearray(pathlib.Path(shard).read_bytes())
    entry = locations[image.source.content_hash].entry
    data[entry.offset + entry.image_offset + 5] ^= 0xFF
    pathlib.Path(shard).write_bytes(bytes(data))
    assert convert_image(with_reuse, settings) == converted  # CRC fails: converted from the file


def index_locations(shard: str, tmp_path) -> dict:
    """The record index of the written shard, by content hash."""
    index = str(tmp_path / "run" / "index" / "train-00000-of-00001.tfrecord.idx")
    return {loc.entry.sha256: loc for _, locations in read_index(shard, index, "image", "r1") for loc in locations}


def test_attach_takes_the_first_record_of_a_content():
    first = RecordLocation("/d/train-00000-of-00002.tfrecord", IndexEntry(100, 50, "h", 10, 20), "image", "r1")
    later = RecordLocation("/d/train-00001-of-00002.tfrecord", IndexEntry(0, 50, "h", 10, 20), "image", "r1")
    images = [source("/a.jpg", content_hash="h"), source("/b.jpg", content_hash="h")]
    attached = [im for batch in attach((0, {"images": [tuple(images)], "records": [(later,), (first,)]}))
                for im in batch]
    assert [im.reuse for im in attached] == [first, first] and [im.source for im in attached] == [
        im.source for im in images]
    unmatched = attach((0, {"images": [tuple(images)], "records": []}))
    assert [im.reuse for batch in unmatched for im in batch] == [None, None]


def publish_as(folder: pathlib.Path, run_id: str) -> None:
    (folder / METADATA_FILE).write_text(json.dumps({"run": {"run_id": run_id}}))


@pytest.mark.parametrize("then", ["replaced", "removed"])
def test_records_are_copied_only_from_the_dataset_the_run_checked(tmp_path, images, then):
    """A run replacing the previous dataset (other settings: other pixels at the same offsets,
    under the same content hashes) while a part copies from it: the part is written again from
    the files."""
    source = settings_for(tmp_path, part_images=3)
    concat_shard(ShardPlan(SHARD, 3), convert_all(images, source), source)
    locations = index_locations(str(tmp_path / "run" / "train-00000-of-00001.tfrecord"), tmp_path)
    settings = settings_for(tmp_path, name="run2", part_images=8, parts="parts2")
    (task,) = cut_into_parts(SHARD, [dataclasses.replace(im, reuse=locations[im.source.content_hash])
                                     for im in images], settings)
    publish_as(tmp_path / "run", "r1")
    assert convert_part(task, settings).reused == len(images)
    expected = (tmp_path / "parts2" / f"{task.digest}.records").read_bytes()
    shutil.rmtree(tmp_path / "parts2")
    if then == "replaced":
        publish_as(tmp_path / "run", "r2")
    else:
        (tmp_path / "run" / METADATA_FILE).unlink()
    again = convert_part(task, settings)
    assert (again.records, again.reused) == (len(images), 0)
    assert (tmp_path / "parts2" / f"{task.digest}.records").read_bytes() == expected
    assert sorted(p.name for p in (tmp_path / "parts2").iterdir()) == [f"{task.digest}.json", f"{task.digest}.records"]


def test_a_missing_or_damaged_index_offers_no_records(tmp_path):
    index = tmp_path / "train.idx"
    assert list(read_index(str(tmp_path / "train"), str(index), "image", "r1")) == []
    index.write_bytes(b"not an index line\n")
    assert list(read_index(str(tmp_path / "train"), str(index), "image", "r1")) == []


def test_reuse_needs_no_pixels_of_a_changed_source(tmp_path, images):
    """A reused image's file is not read at all, so its bytes cost nothing (the digest covers it)."""
    settings = settings_for(tmp_path, part_images=3)
    concat_shard(ShardPlan(SHARD, 3), convert_all(images, settings), settings)
    shard = str(tmp_path / "run" / "train-00000-of-00001.tfrecord")
    locations = index_locations(shard, tmp_path)
    image = images[0]
    pathlib.Path(image.source.path).unlink()
    converted = convert_image(dataclasses.replace(image, reuse=locations[image.source.content_hash]), settings)
    record, reused = converted.record, converted.reused
    assert reused and np.frombuffer(record.data[record.image_offset:][:record.image_length], "<f4").size == 8 * 12 * 3
