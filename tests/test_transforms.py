"""One Beam pipeline per composite transform, on small real files in tmp_path (TestPipeline on the
DirectRunner), checked with assert_that and by reading the files they write."""
from __future__ import annotations

import collections
import json
import os
import pathlib

import apache_beam as beam
import pytest
import tensorflow as tf
from apache_beam.pvalue import AsSingleton
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipeline.accounting import GatherTotals
from pipeline.output.progress import RecordProgress, read_progress
from tests.helpers import beam_matcher, rejection_tuple, test_pipeline, write_image, write_text
from transforms.batches import batched
from transforms.dataset_format import DuplicateSummary, IndexEntry, RecordLocation, index_file_name
from transforms.files import content_hash
from transforms.images.image_header import ImageHeader
from transforms.inputs.discover import LABELS, REJECTED, DiscoverImages, OutputFolder
from transforms.inputs.manifests import ManifestError
from transforms.inputs.read import ReadAndCheck
from transforms.inputs.source import describe_source
from transforms.plan.assign import DUPLICATES, ComputeLabelMap, DuplicateGroup, LabeledImage, PlanSplits, group_copies
from transforms.plan.fingerprint import InputFingerprint
from transforms.plan.reuse import AttachReusableRecords, ReuseSource
from transforms.plan.split import shard_for
from transforms.refs import Batch, Candidate, PlannedImage, SourceImage
from transforms.rejections import Rejection
from transforms.specs import ConversionSpec, FeatureKeys, ImageSpec, InputSpec, OutputSpec, SplitSpec
from transforms.write.parts import ShardResult, WriterSettings, record_digest, shard_order
from transforms.write.write_shards import WriteShards

pytestmark = pytest.mark.beam
VERSIONS = {"imgrec": "1", "opencv": "5", "numpy": "2", "pillow": "12"}

TestPipeline.__test__ = False  # not a test class, though pytest would try to collect it by name

SPEC = ImageSpec(height=8, width=8, normalize="none")
LABEL_MAP = {"cat": 0, "dog": 1}


def candidate_pairs(found) -> beam.PCollection:
    return found["candidates"] | "CandidatePairs" >> beam.FlatMap(lambda batch: [(c.path, c.label) for c in batch])


def discover(spec: InputSpec, expected_candidates, expected_rejected, expected_labels=None, output=None,
             spread=True) -> None:
    with test_pipeline() as p:
        found = p | DiscoverImages(spec, output, spread=spread)
        assert_that(candidate_pairs(found), equal_to(list(expected_candidates)), label="candidates")
        assert_that(found[REJECTED] | "R" >> beam.Map(rejection_tuple), equal_to(list(expected_rejected)),
                    label="rejected")
        if expected_labels is not None:
            # LABELS carries one tuple of names per batch of candidates, and how candidates fall
            # into batches is the runner's choice; the label map is built from the distinct names.
            distinct = (found[LABELS] | "Labels" >> beam.FlatMap(lambda names: names)
                        | "Distinct" >> beam.Distinct())
            assert_that(distinct, equal_to(sorted(set(expected_labels))), label="labels")


# ----------------------------------------------------------------------------- DiscoverImages

@pytest.fixture
def class_folders(tmp_path) -> pathlib.Path:
    root = tmp_path / "root"
    write_image(root / "cat" / "a.jpg")
    write_image(root / "cat" / "B.PNG")
    write_image(root / "cat" / "nested" / "n.jpg")  # nested: belongs to cat
    write_text(root / "cat" / "._a.jpg", "AppleDouble")
    write_image(tmp_path / "dog_images" / "c.bmp")
    write_text(tmp_path / "dog_images" / "notes.txt", "not an image")
    (root / "dog").symlink_to(tmp_path / "dog_images")  # a symlinked class folder is followed
    (root / "fish").mkdir()  # an empty class still gets a label id
    write_text(root / "README.md", "top-level files are not class members")
    write_text(root / "dog_images_notes.txt", "x")
    return root


@pytest.mark.parametrize("spread", [True, False], ids=["reshuffled", "in-one-process"])
def test_discover_class_folders_accounts_for_every_path(class_folders, spread):
    """The same whether the class folders are reshuffled between workers (a cluster) or walked
    where they are listed (one process)."""
    root = str(class_folders)
    discover(InputSpec(root),
             [(f"{root}/cat/a.jpg", "cat"), (f"{root}/cat/B.PNG", "cat"), (f"{root}/cat/nested/n.jpg", "cat"),
              (f"{root}/dog/c.bmp", "dog")],
             [(f"{root}/cat/._a.jpg", "discover", "SkippedFile"), (f"{root}/dog/notes.txt", "discover", "SkippedFile"),
              (f"{root}/README.md", "discover", "SkippedFile"),
              (f"{root}/dog_images_notes.txt", "discover", "SkippedFile")],
             expected_labels=["cat", "dog", "fish"], spread=spread)


@pytest.mark.parametrize("kind", ["folders", "glob"])
def test_discover_passes_over_what_imgrec_wrote_into_an_output_inside_the_input(class_folders, kind):
    root = str(class_folders)
    output = class_folders / "cat" / "out"
    write_image(output / "contact_sheet.png")
    write_image(output / "index" / "x.png")
    write_text(output / "index" / "train-00000-of-00001.tfrecord.idx", "0 10 ab 0 1\n")  # no row either:
    write_text(output / ".imgrec.lock", "{}")  # a glob reaching them once counted them as SkippedFile inputs
    write_text(output / ".imgrec-staging" / "parts" / "p.tfrecord", "")
    write_image(output / "mine.jpg")  # the user's: discovered
    spec = InputSpec(root) if kind == "folders" else InputSpec(f"{root}/cat/**", kind="glob")
    folders = kind == "folders"  # labels: the class folder, or (globs) the file's own folder
    found = [(f"{root}/cat/a.jpg", "cat"), (f"{root}/cat/B.PNG", "cat"),
             (f"{root}/cat/nested/n.jpg", "cat" if folders else "nested"),
             (f"{root}/cat/out/mine.jpg", "cat" if folders else "out")]
    skipped = [(f"{root}/cat/._a.jpg", "discover", "SkippedFile")]
    if folders:
        found.append((f"{root}/dog/c.bmp", "dog"))
        skipped += [(f"{root}/{name}", "discover", "SkippedFile")
                    for name in ("dog/notes.txt", "README.md", "dog_images_notes.txt")]
    imgrecs = frozenset({"contact_sheet.png", "index", ".imgrec.lock", ".imgrec-staging"})
    discover(spec, found, skipped, output=OutputFolder(os.path.realpath(output), imgrecs))


def test_discover_glob(class_folders):
    root = str(class_folders)
    cases = {  # pattern: (candidates, rejections); the label is the parent folder's name
        f"{root}/*/*.jpg": ([(f"{root}/cat/a.jpg", "cat")], [(f"{root}/cat/._a.jpg", "discover", "SkippedFile")]),
        f"{root}/cat/**": ([(f"{root}/cat/a.jpg", "cat"), (f"{root}/cat/B.PNG", "cat"), (f"{root}/cat/nested/n.jpg",
                                                                                        "nested")],
                           [(f"{root}/cat/._a.jpg", "discover", "SkippedFile")]),
        f"{root}/nothing/*.jpg": ([], []),
    }
    with test_pipeline() as p:
        for i, (pattern, (candidates, rejected)) in enumerate(cases.items()):
            found = p | f"Discover{i}" >> DiscoverImages(InputSpec(pattern))
            assert_that(found["candidates"] | f"C{i}" >> beam.FlatMap(lambda batch: [(c.path, c.label) for c in batch]),
                        equal_to(candidates), label=f"candidates{i}")
            assert_that(found[REJECTED] | f"R{i}" >> beam.Map(rejection_tuple), equal_to(rejected),
                        label=f"rejected{i}")
            assert_that(found[LABELS] | f"L{i}" >> beam.FlatMap(lambda names: names),
                        equal_to(sorted({label for _, label in candidates})), label=f"labels{i}")


def test_discover_csv_manifest(tmp_path):
    manifest = write_text(tmp_path / "m" / "list.csv",
                          'path,label\nimgs/a.jpg,cat\n"imgs/with, comma.jpg",dog\n/abs/x.png,cat\n\nbad line\n')
    folder = str(tmp_path / "m")
    discover(InputSpec(manifest),
             [(f"{folder}/imgs/a.jpg", "cat"), (f"{folder}/imgs/with, comma.jpg", "dog"), ("/abs/x.png", "cat")],
             [(manifest, "discover", "BadManifestLine")], expected_labels=["cat", "dog"])


def test_a_manifest_listing_what_imgrec_wrote_gets_a_row_for_each(tmp_path):
    """Every manifest line is a record or a row: the output's own files are passed over with a
    SkippedFile row, never silently (a glob passes over them as a folder walk does)."""
    output = tmp_path / "out"
    write_image(output / "contact_sheet.png")
    write_image(output / "mine.jpg")
    manifest = write_text(tmp_path / "list.csv", "path,label\nout/contact_sheet.png,cat\nout/mine.jpg,cat\n")
    discover(InputSpec(manifest), [(f"{output}/mine.jpg", "cat")],
             [(f"{output}/contact_sheet.png", "discover", "SkippedFile")],
             output=OutputFolder(os.path.realpath(output), frozenset({"contact_sheet.png"})))


def test_discover_csv_with_other_header_names_and_columns(tmp_path):
    manifest = write_text(tmp_path / "list.csv", "id,Filename,Class\n1,a.jpg,cat\n2,b.jpg,dog\n")
    discover(InputSpec(manifest), [(f"{tmp_path}/a.jpg", "cat"), (f"{tmp_path}/b.jpg", "dog")], [])


def test_an_unrecognised_csv_header_is_refused_before_the_pipeline_runs(tmp_path):
    manifest = write_text(tmp_path / "list.csv", "foo,bar\na.jpg,cat\n")
    with pytest.raises(ManifestError, match="--manifest_columns"):
        DiscoverImages(InputSpec(manifest)).expand(TestPipeline() | "Start" >> beam.Impulse())


def test_discover_jsonl_manifest(tmp_path):
    lines = [{"path": "imgs/a.jpg", "label": "cat"}, {"path": "gs://bucket/b.jpg", "label": 7}]
    manifest = write_text(tmp_path / "list.jsonl", "\n".join(json.dumps(x) for x in lines) + '\n{"path": broken\n')
    discover(InputSpec(manifest), [(f"{tmp_path}/imgs/a.jpg", "cat"), ("gs://bucket/b.jpg", "7")],
             [(manifest, "discover", "BadManifestLine")])


def test_discover_manifest_repeats_conflicts_and_latin1(tmp_path):
    manifest = tmp_path / "list.csv"
    manifest.write_bytes(b"path,label\na.jpg,cat\nb.jpg,cat\na.jpg,cat\nb.jpg,dog\ncaf\xe9.jpg,cat\nc.jpg,dog\n")
    m = str(manifest)
    discover(InputSpec(m), [(f"{tmp_path}/a.jpg", "cat"), (f"{tmp_path}/c.jpg", "dog")],
             [(f"{tmp_path}/a.jpg", "discover", "DuplicateListing"),
              (f"{tmp_path}/b.jpg", "discover", "ConflictingLabels"),
              (f"{tmp_path}/b.jpg", "discover", "ConflictingLabels"),
              (m, "discover", "BadManifestLine")],
             expected_labels=["cat", "dog"])


# ----------------------------------------------------------------------------- ReadAndCheck

def test_read_and_check(tmp_path):
    good = write_image(tmp_path / "cat" / "good.png", size=(6, 10))
    empty = write_text(tmp_path / "cat" / "empty.jpg", "")
    missing = str(tmp_path / "cat" / "missing.jpg")
    text = write_text(tmp_path / "cat" / "text.jpg", "this is not an image")
    large = write_image(tmp_path / "cat" / "large.bmp", size=(100, 100))  # 30 KB
    tiny = write_image(tmp_path / "cat" / "tiny.png", size=(1, 1))
    candidates = [Candidate(path, "cat") for path in (good, empty, missing, text, large, tiny)]
    expected = SourceImage(good, "cat", content_hash(pathlib.Path(good).read_bytes()), ImageHeader("png", 10, 6))
    with test_pipeline() as p:
        read = (p | beam.Create([Batch(candidates)])
                | beam.ParDo(ReadAndCheck(ImageSpec(min_side=2), max_file_bytes=20_000)).with_outputs(
                    REJECTED, main="images"))
        assert_that(read.images, equal_to([(expected,)]), label="images")
        assert_that(read[REJECTED] | beam.Map(rejection_tuple), equal_to([
            (empty, "read", "EmptyFile"), (missing, "read", "UnreadableFile"), (text, "header", "NotAnImage"),
            (large, "read", "FileTooLarge"), (tiny, "header", "ImageTooSmall"),
        ]), label="rejected")  # a FIFO: tests/test_files.py and, end to end, tests/test_trust_inputs.py



# ----------------------------------------------------------------------------- batches on the wire

def test_beam_encodes_a_batch_in_one_piece():
    """Beam's default coder pickles every dataclass of a plain tuple separately; a Batch is
    pickled whole, comes back a Batch and takes a third of the bytes."""
    from apache_beam.coders import FastPrimitivesCoder

    images = [PlannedImage(source(f"/data/cat/{i:05d}.jpg"), 0, "train") for i in range(256)]
    (batch,) = batched(images)
    coder = FastPrimitivesCoder()
    decoded = coder.decode(coder.encode(batch))
    assert type(decoded) is Batch and decoded == tuple(images)
    assert len(coder.encode(batch)) * 2 < len(coder.encode(tuple(images)))


@pytest.mark.parametrize("splits", [SplitSpec(), SplitSpec(method="stratified")])
def test_the_steps_hand_on_batches(tmp_path, splits):
    """Discovery, the first pass and the split plan emit Batches, not plain tuples, so every
    stage boundary in between encodes them in one piece."""
    for i in range(3):
        write_image(tmp_path / "cat" / f"{i}.png", color=(i, 0, 0))
    with test_pipeline() as p:
        found = p | DiscoverImages(InputSpec(str(tmp_path)))
        read = found["candidates"] | beam.ParDo(ReadAndCheck(SPEC, max_file_bytes=20_000)).with_outputs(
            REJECTED, main="images")
        labels = p | "LabelMap" >> beam.Create([{"cat": 0}])
        planned = read.images | PlanSplits(splits, AsSingleton(labels), False)
        for name, batches in (("candidates", found["candidates"]), ("images", read.images),
                              ("planned", planned["planned"])):
            assert_that(batches | f"{name}Types" >> beam.Map(lambda batch: type(batch).__name__),
                        beam_matcher(only_batches), label=name)


def only_batches(types: list[str]) -> None:
    assert types and set(types) == {"Batch"}, types


# ----------------------------------------------------------------------------- ComputeLabelMap

@pytest.mark.parametrize("labels,class_names,integer_ids,expected", [
    (["3", "10", "3"], None, True, {"3": 3, "10": 10}),
    (["dog", "cat"], ("dog", "cat", "fish"), False, {"dog": 0, "cat": 1, "fish": 2}),
], ids=["manifest-integers", "class-names"])
def test_compute_label_map(labels, class_names, integer_ids, expected):
    """The label map of labels arriving in several batches (the rules: tests/test_labels.py)."""
    with test_pipeline() as p:
        label_map = p | beam.Create([tuple(labels[:1]), tuple(labels[1:])]) | ComputeLabelMap(class_names, integer_ids)
        assert_that(label_map, equal_to([expected]))


# ----------------------------------------------------------------------------- PlanSplits

def source(path: str, label: str = "cat", digest: str = "") -> SourceImage:
    """PlanSplits only looks at references, so no file is needed; by default every path is unique content."""
    return SourceImage(path, label, digest or content_hash(path.encode()), ImageHeader("jpeg", 10, 10))


DEFAULT_SPLITS = SplitSpec()


def plan(images: list[SourceImage], splits: SplitSpec = DEFAULT_SPLITS, drop_duplicates: bool = False,
         label_map: dict = LABEL_MAP, check_planned=None, expected_rejected=(), expected_duplicates=None) -> None:
    with test_pipeline() as p:
        labels = p | "LabelMap" >> beam.Create([label_map])
        planned = p | beam.Create(list(batched(images, 3))) | PlanSplits(splits, AsSingleton(labels), drop_duplicates)
        if check_planned is not None:
            assert_that(planned["planned"] | "P" >> beam.FlatMap(
                lambda batch: [(im.source.path, im.label_id, im.split) for im in batch]),
                        beam_matcher(check_planned), label="planned")
        assert_that(planned[REJECTED] | "R" >> beam.Map(rejection_tuple), equal_to(list(expected_rejected)),
                    label="rejected")
        if expected_duplicates is not None:
            assert_that(planned[DUPLICATES], equal_to(expected_duplicates), label="duplicates")


def copies_of(n: int) -> list[SourceImage]:
    """n contents, each stored twice (under cat/ and under dog/)."""
    return [source(f"/{folder}/{i}.jpg", folder, digest=f"{i:064x}") for i in range(n) for folder in ("cat", "dog")]


def test_copies_share_a_split():
    def check(planned):
        split_of = {path: split for path, _, split in planned}
        assert len(split_of) == 60
        assert all(split_of[f"/cat/{i}.jpg"] == split_of[f"/dog/{i}.jpg"] for i in range(30))
        assert len(set(split_of.values())) > 1
        assert {(path, label) for path, label, _ in planned} == {(f"/{f}/{i}.jpg", LABEL_MAP[f])
                                                                 for i in range(30) for f in ("cat", "dog")}

    plan(copies_of(30), SplitSpec(salt="other"), check_planned=check)  # any salt: tests/test_split.py


def test_path_split_key_lets_copies_go_apart():
    def check(planned):
        split_of = {path: split for path, _, split in planned}
        assert any(split_of[f"/cat/{i}.jpg"] != split_of[f"/dog/{i}.jpg"] for i in range(30))

    plan(copies_of(30), SplitSpec(key="path"), check_planned=check)


def test_duplicates_reported_and_dropped():
    images = [*copies_of(2), source("/cat/unique.jpg")]
    groups = [DuplicateGroup(f"{i:064x}", (f"/cat/{i}.jpg", f"/dog/{i}.jpg"), ("cat", "dog")) for i in range(2)]

    def check(planned):
        assert sorted(path for path, _, _ in planned) == ["/cat/0.jpg", "/cat/1.jpg", "/cat/unique.jpg"]

    plan(images, drop_duplicates=True, check_planned=check, expected_duplicates=groups,
         expected_rejected=[(f"/dog/{i}.jpg", "dedup", "DuplicateImage") for i in range(2)])


def test_a_dropped_copy_says_when_its_label_differs_from_the_one_kept():
    same, other = source("/cat/a.jpg", digest="0" * 64), source("/cat/b.jpg", digest="0" * 64)
    relabelled = source("/dog/c.jpg", "dog", digest="0" * 64)
    copies = [LabeledImage(image, LABEL_MAP[image.label]) for image in (relabelled, other, same)]
    messages = [output.value.message for output in group_copies("0" * 64, copies, "content", True)
                if isinstance(output, beam.pvalue.TaggedOutput) and output.tag == REJECTED]
    assert messages == ["same content (sha256 000000000000…) as /cat/a.jpg",
                        "same content (sha256 000000000000…) as /cat/a.jpg (labelled 'cat', this copy 'dog')"]


def test_duplicates_reported_and_kept():
    def check(planned):
        assert len(planned) == 4

    plan(copies_of(2), check_planned=check, expected_rejected=[],
         expected_duplicates=[DuplicateGroup(f"{i:064x}", (f"/cat/{i}.jpg", f"/dog/{i}.jpg"), ("cat", "dog"))
                              for i in range(2)])


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
SEED = 5
# 12 cats and 12 dogs in train, 3 dogs in val.
PLAN = [(label, split, i) for split, labels, n in (("train", ("cat", "dog"), 12), ("val", ("dog",), 3))
        for label in labels for i in range(n)]


def planned_image(path: str, label: str, split: str) -> PlannedImage:
    data = pathlib.Path(path).read_bytes()
    return PlannedImage(describe_source(Candidate(path, label), data, SPEC), LABEL_MAP[label], split)


def writer_settings(tmp_path: pathlib.Path, run: str = "run", num_shards: int = 2, compression: str = "none",
                    part_images: int = 64, local_processes: int = 0, parts: str = "parts") -> WriterSettings:
    output = OutputSpec(str(tmp_path / "out"), num_shards=num_shards, shuffle_seed=SEED, compression=compression)
    return WriterSettings(image=SPEC, keys=FeatureKeys(), output=output, max_file_bytes=2**20,
                          run_dir=str(tmp_path / run), parts_dir=str(tmp_path / parts),
                          record_digest=record_digest(SPEC, FeatureKeys(), {"imgrec": "test"}),
                          part_images=part_images, local_processes=local_processes)


def read_shards(folder: pathlib.Path) -> dict[str, list[tuple[str, int]]]:
    """{shard file name: [(source path, label id), ...] in file order}, read with tf.data."""
    shards = {}
    for path in sorted(folder.glob("*.tfrecord*")):
        compression = "GZIP" if path.name.endswith(".gz") else ""
        records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path), compression)]
        shards[path.name] = [(e.features.feature["image/source_path"].bytes_list.value[0].decode(),
                              e.features.feature["label"].int64_list.value[0]) for e in records]
    return shards


@pytest.fixture
def plan_images(tmp_path) -> list[PlannedImage]:
    return [planned_image(write_image(tmp_path / "in" / split / label / f"{i}.png", COLORS[label]), label, split)
            for label, split, i in PLAN]


def write_shards(images, settings, expected_shards=None, expected_rejected=(), spread=True) -> None:
    with test_pipeline() as p:
        written = p | beam.Create(list(batched(images, 7))) | WriteShards(settings, spread=spread)
        if expected_shards is not None:
            assert_that(written["shards"] | "S" >> beam.Map(lambda s: (s.file, s.num_examples)),
                        equal_to(expected_shards), label="shards")
        assert_that(written["planned_counts"], equal_to([dict(collections.Counter(im.split for im in images))]),
                    label="planned_counts")
        assert_that(written[REJECTED] | beam.Map(lambda r: (*rejection_tuple(r), r.split)),
                    equal_to(list(expected_rejected)), label="rejected")


@pytest.mark.parametrize("compression,suffix", [("none", ".tfrecord"), ("gzip", ".tfrecord.gz")])
@pytest.mark.parametrize("spread", [True, pytest.param(False, marks=pytest.mark.converter)],
                         ids=["reshuffled", "in-one-process"])
def test_write_shards(tmp_path, plan_images, compression, suffix, spread):
    """The same shards whether the parts are reshuffled between workers (a cluster) or not (one
    process, whose pool spreads them)."""
    settings = writer_settings(tmp_path, compression=compression, local_processes=0 if spread else 2)
    # Each image goes to the shard its path hashes to; every shard of a split exists, even an empty one.
    expected = {f"{split}-{i:05d}-of-00002{suffix}": [] for split in ("train", "val") for i in range(2)}
    for im in plan_images:
        expected[f"{im.split}-{shard_for(im.source.path, SEED, 2):05d}-of-00002{suffix}"].append(im.source.path)
    write_shards(plan_images, settings, expected_shards=[(name, len(paths)) for name, paths in expected.items()],
                 spread=spread)

    run = tmp_path / "run"
    shards = read_shards(run)
    assert set(shards) == set(expected)  # and no temporary files are left
    assert sorted(p.name for p in (run / "index").iterdir()) == sorted(f"{name}.idx" for name in expected)
    label_of = {im.source.path: im.label_id for im in plan_images}
    by_path = {im.source.path: im for im in plan_images}
    for name, records in shards.items():  # each shard in the seeded order, with the right labels
        assert [path for path, _ in records] == [im.source.path for im in shard_order(
            [by_path[path] for path in expected[name]], SEED)]
        assert all(label == label_of[path] for path, label in records)
        index = [IndexEntry.from_line(line) for line in (run / index_file_name(name)).read_text().splitlines()]
        assert [e.sha256 for e in index] == [by_path[path].source.content_hash for path, _ in records]


@pytest.mark.converter
def test_shards_are_the_same_bytes_however_they_are_cut_and_converted(tmp_path, plan_images):
    """One part per shard, parts of 2 images, parts on a pool of processes: byte-identical shards."""
    layouts = {"whole": dict(part_images=64), "small_parts": dict(part_images=2),
               "processes": dict(part_images=3, local_processes=2)}
    for name, kwargs in layouts.items():
        write_shards(plan_images, writer_settings(tmp_path, run=name, parts=f"parts_{name}", **kwargs))
    files = {name: {p.relative_to(tmp_path / name): p.read_bytes() for p in (tmp_path / name).rglob("*") if p.is_file()}
             for name in layouts}
    assert len(files["whole"]) == 8  # 4 shards + 4 index files
    assert files["small_parts"] == files["whole"] and files["processes"] == files["whole"]
    per_shard = collections.Counter((im.split, shard_for(im.source.path, SEED, 2)) for im in plan_images)
    assert len(list((tmp_path / "parts_small_parts").glob("*.records"))) == sum(-(-n // 2) for n in per_shard.values())


def test_a_restarted_write_takes_the_finished_parts(tmp_path, plan_images):
    settings = writer_settings(tmp_path, part_images=4)
    write_shards(plan_images, settings)
    first = {p.name: p.read_bytes() for p in (tmp_path / "run").glob("*.tfrecord")}
    for image in plan_images:  # the images are gone: only the parts can give the records now
        pathlib.Path(image.source.path).unlink()
    write_shards(plan_images, writer_settings(tmp_path, run="restarted", part_images=4))
    assert {p.name: p.read_bytes() for p in (tmp_path / "restarted").glob("*.tfrecord")} == first


def test_write_shards_rejects_a_file_changed_after_planning(tmp_path):
    kept = planned_image(write_image(tmp_path / "cat" / "kept.png"), "cat", "train")
    changed_path = write_image(tmp_path / "cat" / "changed.png")
    changed = planned_image(changed_path, "cat", "train")
    write_image(tmp_path / "cat" / "changed.png", color=(1, 2, 3))  # rewritten after planning
    with test_pipeline() as p:
        written = p | beam.Create([Batch([kept, changed])]) | WriteShards(writer_settings(tmp_path, num_shards=1))
        assert_that(written[REJECTED] | beam.Map(lambda r: (*rejection_tuple(r), r.split)),
                    equal_to([(changed_path, "read", "FileChanged", "train")]), label="rejected")
        assert_that(written["shards"] | "S" >> beam.Map(lambda s: (s.num_examples, s.label_counts)),
                    equal_to([(1, (("cat", 1),))]), label="shards")
    assert read_shards(tmp_path / "run") == {"train-00000-of-00001.tfrecord": [(kept.source.path, 0)]}


# ----------------------------------------------------------------------------- AttachReusableRecords

def test_attach_reusable_records_joins_on_content(tmp_path):
    index = tmp_path / "old" / "index" / "train-00000-of-00001.tfrecord.idx"
    entries = [IndexEntry(0, 100, "a" * 64, 10, 50), IndexEntry(100, 100, "b" * 64, 10, 50)]
    write_text(index, "".join(e.to_line() for e in entries))
    shard = str(tmp_path / "old" / "train-00000-of-00001.tfrecord")
    images = [PlannedImage(source(f"/{name}.jpg", digest=name * 64), 0, "train") for name in ("a", "b", "c")]
    expected = [("/a.jpg", RecordLocation(shard, entries[0], "pixels", "r1")),
                ("/b.jpg", RecordLocation(shard, entries[1], "pixels", "r1")), ("/c.jpg", None)]
    with test_pipeline() as p:
        attached = p | beam.Create(list(batched(images, 2))) | AttachReusableRecords(
            ReuseSource(str(tmp_path / "old"), "r1", ((shard, str(index)),), "pixels"))
        assert_that(attached | beam.FlatMap(lambda batch: [(im.source.path, im.reuse) for im in batch]),
                    equal_to(expected))


# ----------------------------------------------------------------------------- accounting

REJECTIONS = [Rejection("/b.jpg", "decode", "CorruptImage", "bad", "train"),
              Rejection("/a.txt", "discover", "SkippedFile", "extension", None),
              Rejection("/c.jpg", "read", "EmptyFile", "empty", None),
              Rejection("/d.txt", "discover", "SkippedFile", "extension", None)]


def test_gather_totals_combines_every_fact_once():
    shards = [ShardResult("train", 0, 1, "train-00000-of-00001.tfrecord", 3, 30, (("cat", 3),))]
    groups = [DuplicateGroup(f"{i:064x}", tuple(f"/{i}/{n}.jpg" for n in range(i + 2)), ("cat",) * (i + 2))
              for i in range(3)]
    with test_pipeline() as p:
        facts = {"inputs": p | "Inputs" >> beam.Create([3, 4]),
                 "rejected": p | "Rejected" >> beam.Create(REJECTIONS),
                 "shards": p | "Shards" >> beam.Create(shards),
                 "planned_counts": p | "Planned" >> beam.Create([{"train": 4}]),
                 "duplicates": p | "Duplicates" >> beam.Create(groups),
                 "label_map": p | "LabelMap" >> beam.Create([{"cat": 0}]),
                 "fingerprint": p | "Fingerprint" >> beam.Create(["f" * 64]),
                 "dead_letter_runs": p | "Runs" >> beam.Create(["/staging/runs/1.jsonl", "/staging/runs/2.jsonl"])}
        gathered = facts | GatherTotals()

        def check(found):
            (one,) = found
            totals = one.totals(dropped_duplicates=True, error_files=["errors-00000-of-00001.jsonl"])
            assert totals.num_inputs == 7 and totals.shards == tuple(shards)
            assert totals.planned_counts == {"train": 4} and totals.label_map == {"cat": 0}
            assert dict(totals.rejection_counts) == {
                ("train", "decode", "CorruptImage", True): 1, (None, "discover", "SkippedFile", False): 2,
                (None, "read", "EmptyFile", True): 1}
            assert totals.duplicates == DuplicateSummary(3, 1 + 2 + 3, True, tuple(
                {"sha256": g.content_hash, "copies": len(g.paths), "paths": list(g.paths), "labels": list(g.labels)}
                for g in groups))
            assert totals.fingerprint == "f" * 64 and totals.error_files == ("errors-00000-of-00001.jsonl",)
            assert sorted(one.dead_letter_runs) == ["/staging/runs/1.jsonl", "/staging/runs/2.jsonl"]

        assert_that(gathered, beam_matcher(check))


def test_a_duplicate_group_lists_ten_of_its_copies_with_every_label_among_them():
    """One image copied 100,000 times made metadata.json 14 MB, nearly all of it that group's paths."""
    from pipeline.accounting import example

    paths = tuple(f"/in/{n:06d}.jpg" for n in range(100_000))
    labels = ("big",) * 99_990 + ("small",) * 10  # the conflict is among the last paths
    assert example(DuplicateGroup("a" * 64, paths, labels)) == {
        "sha256": "a" * 64, "copies": 100_000, "paths": [*paths[:9], paths[99_990]], "labels": ["big"] * 9 + ["small"]}


def test_gather_totals_of_nothing():
    with test_pipeline() as p:
        empty = {name: p | name >> beam.Create([]) for name in ("inputs", "rejected", "shards", "planned_counts",
                                                                "duplicates", "label_map", "fingerprint",
                                                                "dead_letter_runs")}

        def check(found):
            (one,) = found
            assert (one.num_inputs, dict(one.rejections), one.shards) == (0, {}, [])
            assert one.dead_letter_runs == [] and one.retries == 0
            assert one.duplicates == DuplicateSummary()

        assert_that(empty | GatherTotals(), beam_matcher(check))


# ----------------------------------------------------------------------------- InputFingerprint

def test_input_fingerprint_ignores_order_and_follows_content_and_classes():
    spec = ConversionSpec(InputSpec("in"), OutputSpec("out"))
    images = [source(f"/cat/{i}.jpg") for i in range(20)]
    rejections = REJECTIONS[:2]
    with test_pipeline() as p:
        def fingerprint(name, imgs, rejected, label_map):
            return ((p | f"{name}Images" >> beam.Create(list(batched(imgs, 2))),
                     p | f"{name}Rejections" >> beam.Create(rejected),
                     p | f"{name}Labels" >> beam.Create([label_map]))
                    | f"{name}Fingerprint" >> InputFingerprint(spec, VERSIONS))
        forward = fingerprint("Forward", images, rejections, {"cat": 0})
        backward = fingerprint("Backward", images[::-1], rejections[::-1], {"cat": 0})
        fewer = fingerprint("Fewer", images[1:], rejections, {"cat": 0})
        # an empty class folder added: no image changed, but the label ids did
        more_classes = fingerprint("MoreClasses", images, rejections, {"ant": 0, "cat": 1})
        found = (forward, backward, fewer, more_classes) | beam.Flatten() | beam.combiners.ToList()
        assert_that(found, beam_matcher(lambda found: (
            _check(len(found[0]) == 4 and len(set(found[0])) == 3 and all(len(f) == 64 for f in found[0])))))


def _check(condition: bool) -> None:
    assert condition


# ----------------------------------------------------------------------------- RecordProgress

def _lock_owned_by(output: pathlib.Path, run_id: str) -> None:
    """The output's lock file, as a driver on another host wrote it for `run_id`."""
    from pipeline.output.lock import LockOwner
    from transforms.dataset_format import LOCK_FILE

    (output / LOCK_FILE).write_text(LockOwner(run_id, "host", 1, "2026-01-01T00:00:00+00:00",
                                              "2026-01-01T00:00:00+00:00").to_json())


def test_record_progress_markers(tmp_path):
    from transforms.write.parts import PartResult

    parts = [PartResult(shard=("train", 0, 1), index=i, digest=f"{i:064x}", images=n, records=n, num_bytes=0,
                        label_counts=(), reused=0, converted_by="host:1", resumed=0)
             for i, n in enumerate((64, 64, 2))]
    _lock_owned_by(tmp_path, "this")
    with test_pipeline() as p:
        _ = (p | "Counts" >> beam.Create([{"train": 130, "val": 0}]), p | "Parts" >> beam.Create(parts)) | \
            RecordProgress(str(tmp_path), (str(tmp_path), "this"))
    assert read_progress(str(tmp_path)) == (130, 130)


@pytest.mark.parametrize("lock_owner", [None, "another-run"])
def test_a_part_finished_after_the_run_lost_its_lock_fails_the_job(tmp_path, lock_owner):
    """A signal stops the driver, which cancels the job and releases the lock; Beam's Flink job
    server does not stop a batch job it is told to cancel, which then converted every image and
    wrote the staging folder back after the driver had cleared it. Now the first part that
    finishes fails the job, and leaves no marker."""
    from transforms.write.parts import PartResult

    output, run_dir = tmp_path / "out", tmp_path / "out" / ".imgrec-staging" / "run-this"
    output.mkdir()
    part = PartResult(shard=("train", 0, 1), index=0, digest="0" * 64, images=3, records=3, num_bytes=0,
                      label_counts=(), reused=0, converted_by="host:1", resumed=0)

    def record(owner):
        if owner is not None:
            _lock_owned_by(output, owner)
        with test_pipeline() as p:
            _ = (p | "Counts" >> beam.Create([{"train": 3}]), p | "Parts" >> beam.Create([part])) | \
                RecordProgress(str(run_dir), (str(output), "this"))

    with pytest.raises(Exception, match="no longer belongs to it"):
        record(lock_owner)
    assert read_progress(str(run_dir))[1] == 0
    record("this")
    assert read_progress(str(run_dir)) == (3, 3)
