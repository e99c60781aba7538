"""pipeline.metadata: metadata.json from what the pipeline counted (build_metadata, the counting
rules, the error budget), and the fingerprints that decide skip_unchanged and reuse."""
from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from pipeline.convert import check_not_empty
from pipeline.errors import RunFailed
from pipeline.metadata import (
    CountMismatch,
    RunTotals,
    TooManyErrors,
    build_metadata,
    check_error_budget,
    pixel_fingerprint,
    versions,
)
from transforms.dataset_format import DatasetMetadata, DuplicateSummary, ReuseSummary
from transforms.images.decode import DAMAGE_CHECKS
from transforms.plan.fingerprint import (
    POLICY_FIELDS,
    add_hashes,
    config_fingerprint,
    image_row,
    recorded_fingerprint,
    retry_hash,
    rows_sum,
    seeded_fingerprint,
)
from transforms.plan.split import STRATIFIED_ROUNDING
from transforms.rejections import Rejection
from transforms.specs import ConversionSpec, FeatureKeys, InputSpec, OutputSpec, SplitSpec
from transforms.write.example import feature_spec
from transforms.write.parts import ShardResult

pytestmark = pytest.mark.unit

SPEC = ConversionSpec(InputSpec("in"), OutputSpec("out"), splits=SplitSpec(names=("train", "val"), ratios=(0.5, 0.5)))
VERSIONS = {"imgrec": "0.1.0", "apache_beam": "2.x", "opencv": "5.0", "numpy": "2.0", "pillow": "12.0",
            "python": "3.11"}
SHARDS = (
    ShardResult("train", 1, 2, "train-00001-of-00002.tfrecord", 1, 10, (("dog", 1),), reused=1, converters=("h:1",)),
    ShardResult("train", 0, 2, "train-00000-of-00002.tfrecord", 2, 20, (("cat", 1), ("dog", 1)),
                converters=("h:1", "h:2")),
    ShardResult("val", 0, 1, "val-00000-of-00001.tfrecord", 1, 5, (("cat", 1),), converters=("g:1",), resumed=1),
)
REJECTIONS = (
    (("train", "decode", "CorruptImage", True), 1),
    ((None, "read", "EmptyFile", True), 1),
    ((None, "discover", "SkippedFile", False), 2),
    ((None, "dedup", "DuplicateImage", False), 1),
)
DUPLICATES = DuplicateSummary(groups=1, extra_copies=1, dropped=True,
                              examples=({"sha256": "00" * 32, "paths": ["/a", "/b"], "labels": ["cat", "cat"]},))


def totals(**overrides) -> RunTotals:
    """3 + 1 written, 5 rejected (2 of them errors): 9 inputs."""
    values = dict(label_map={"dog": 1, "cat": 0}, shards=SHARDS, planned_counts={"train": 4, "val": 1},
                  rejection_counts=REJECTIONS, num_inputs=9, duplicates=DUPLICATES,
                  error_files=("errors-00000-of-00001.jsonl",), fingerprint="f" * 64)
    return RunTotals(**{**values, **overrides})


def metadata(spec: ConversionSpec = SPEC, reuse_source=None, **overrides) -> DatasetMetadata:
    return build_metadata(spec, totals(**overrides), run={"run_id": "x", "runner": "DirectRunner"},
                          library_versions=VERSIONS, reuse_source=reuse_source)


def test_build_metadata_counts():
    meta = metadata()
    train = meta.splits["train"]
    assert train.files == ("train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord")  # in shard order
    assert train.shard_lengths == (2, 1) and train.num_bytes == 30 and train.rejected == 1
    assert dict(train.label_counts) == {"cat": 1, "dog": 2}
    assert meta.splits["val"].num_examples == 1 and meta.splits["val"].rejected == 0
    inputs = meta.inputs
    assert (inputs.total, inputs.written, inputs.rejected, inputs.errors) == (9, 4, 5, 2)
    # errors among the images to convert (written + errors): skipped files and copies do not dilute it
    assert inputs.error_fraction == pytest.approx(2 / 6)
    assert dict(inputs.rejected_by_error) == {"CorruptImage": 1, "DuplicateImage": 1, "EmptyFile": 1, "SkippedFile": 2}
    assert dict(inputs.rejected_by_stage) == {"decode": 1, "read": 1, "discover": 2, "dedup": 1}
    assert meta.class_names() == ["cat", "dog"]
    assert meta.duplicates == DUPLICATES and meta.error_files == ("errors-00000-of-00001.jsonl",)
    assert meta.features == feature_spec(SPEC.image, SPEC.features)
    assert meta.image == {"height": 224, "width": 224, "channels": 3, "dtype": "uint8", "encoding": "jpeg"}
    assert meta.config == json.loads(json.dumps(SPEC.to_dict())) and meta.versions == VERSIONS
    assert meta.run == {"run_id": "x", "runner": "DirectRunner", "converter_processes": 3, "resumed_records": 1}
    assert meta.fingerprint == "f" * 64 and meta.pixel_fingerprint == pixel_fingerprint(SPEC, VERSIONS)
    assert meta.reuse is None and meta.format_version == 2
    assert DatasetMetadata.loads(meta.dumps()).to_json() == json.loads(meta.dumps())  # all JSON, reads back


def test_a_split_without_shards_is_listed_empty():
    spec = dataclasses.replace(SPEC, splits=SplitSpec(names=("train", "val", "test"), ratios=(0.5, 0.5, 0.0)))
    meta = metadata(spec)
    assert list(meta.splits) == ["train", "val", "test"]
    assert meta.splits["test"].files == () and meta.splits["test"].num_examples == 0


def test_reuse_summary_counts_reused_records():
    meta = metadata(reuse_source="/data/previous")
    assert meta.reuse == ReuseSummary("/data/previous", reused=1, converted=3)
    assert json.loads(meta.dumps())["reuse"] == {"from": "/data/previous", "reused": 1, "converted": 3}


@pytest.mark.parametrize("overrides,message", [
    ({"planned_counts": {"train": 5, "val": 1}}, r"split train: 5 planned != 3 written \+ 1 rejected"),
    ({"planned_counts": {"train": 4}}, "split val: 0 planned"),
    ({"num_inputs": 10}, r"10 inputs != 4 written \+ 5 rejected"),
    ({"rejection_counts": REJECTIONS[1:], "planned_counts": {"train": 3, "val": 1}}, "9 inputs"),
])
def test_build_metadata_count_mismatch(overrides, message):
    with pytest.raises(CountMismatch, match=message):
        metadata(**overrides)


def test_a_count_mismatch_is_a_bug_not_a_run_failure():
    """Counts that do not reconcile must fail loudly, never be reported as a data problem."""
    assert not issubclass(CountMismatch, RunFailed)


def test_too_many_errors_names_counts_and_dead_letters():
    with pytest.raises(TooManyErrors) as info:
        check_error_budget(metadata(), 0.3, "out/.imgrec-staging/run-x/errors-00000-of-00001.jsonl")
    message = str(info.value)
    assert "2 of 6 images were rejected (33.33% > max_error_fraction 30.00%" in message
    assert "CorruptImage: 1" in message and "Nothing was published" in message
    assert "out/.imgrec-staging/run-x/errors-00000-of-00001.jsonl" in message
    assert "--max_error_fraction=0.34 would accept them" in message
    assert isinstance(info.value, RunFailed) and info.value.exit_code == 1
    check_error_budget(metadata(), 2 / 6, "unused")  # at the budget is within it


def test_skipped_files_do_not_dilute_the_error_fraction():
    """150 README files next to 10 images, 1 corrupt: 1 error in 10 images, not 1 in 160."""
    rejections = (((None, "discover", "SkippedFile", False), 150), ((None, "decode", "CorruptImage", True), 1))
    shards = (ShardResult("train", 0, 1, "train-00000-of-00001.tfrecord", 9, 90, (("cat", 9),)),)
    meta = metadata(shards=shards, planned_counts={"train": 9}, rejection_counts=rejections, num_inputs=160)
    assert meta.inputs.error_fraction == pytest.approx(0.1)
    with pytest.raises(TooManyErrors, match="1 of 10 images") as info:
        check_error_budget(meta, 0.05, "unused")
    assert "CorruptImage: 1)" in str(info.value) and "SkippedFile" not in str(info.value)


def test_when_every_image_was_rejected_the_budget_that_passes_names_allow_empty_too():
    """A run whose every image failed also needs --allow_empty: the budget alone would only lead
    to "no image was written"."""
    rejections = (((None, "decode", "CorruptImage", True), 2),)
    meta = metadata(shards=(), planned_counts={}, rejection_counts=rejections, num_inputs=2)
    with pytest.raises(TooManyErrors, match="--max_error_fraction=1 --allow_empty would accept them"):
        check_error_budget(meta, 0.5, "unused")


def test_skipped_files_and_duplicates_are_not_errors():
    only_intended = (((None, "discover", "SkippedFile", False), 4), ((None, "dedup", "DuplicateImage", False), 1))
    meta = metadata(rejection_counts=only_intended, planned_counts={"train": 3, "val": 1})
    assert meta.inputs.errors == 0 and meta.inputs.rejected == 5
    check_error_budget(meta, 0.0, "unused")


def test_an_empty_dataset_fails_unless_allowed():
    empty = metadata(shards=(), planned_counts={}, rejection_counts=(((None, "discover", "SkippedFile", False), 3),),
                     num_inputs=3)
    assert empty.inputs.written == 0
    with pytest.raises(RunFailed, match=r"no image was written \(3 inputs .*3 rejected: SkippedFile: 3\).*"
                                        r"--allow_empty.*Dead letters: staged/errors.jsonl"):
        check_not_empty(empty, SPEC, "staged/errors.jsonl")
    check_not_empty(empty, dataclasses.replace(SPEC, output=OutputSpec("out", allow_empty=True)), "unused")
    check_not_empty(metadata(), SPEC, "unused")


def test_versions_name_what_produced_the_bytes():
    import cv2
    import numpy as np
    import PIL

    found = versions()
    assert set(found) == {"imgrec", "apache_beam", "opencv", "numpy", "pillow", "python"}
    assert (found["opencv"], found["numpy"], found["pillow"]) == (cv2.__version__, np.__version__, PIL.__version__)


# ----------------------------------------------------------------------------- fingerprints

def with_image(**changes) -> ConversionSpec:
    return dataclasses.replace(SPEC, image=dataclasses.replace(SPEC.image, **changes))


def with_output(**changes) -> ConversionSpec:
    return dataclasses.replace(SPEC, output=dataclasses.replace(SPEC.output, **changes))


def test_pixel_fingerprint_follows_what_decides_the_image_bytes():
    base = pixel_fingerprint(SPEC, VERSIONS)
    for changed in (with_image(height=100), with_image(interpolation="cubic"), with_image(decoder="imread"),
                    with_image(alpha="drop"), with_image(normalize="mean_std", encoding="raw")):
        assert pixel_fingerprint(changed, VERSIONS) != base
    for version in ("imgrec", "opencv", "numpy", "pillow"):
        assert pixel_fingerprint(SPEC, {**VERSIONS, version: "other"}) != base
    # Not: acceptance limits, features, splits, output settings, Beam or Python versions.
    for same in (with_image(min_side=5, max_pixels=10, max_decoded_bytes=10**9), with_output(num_shards=7),
                 dataclasses.replace(SPEC, features=FeatureKeys(label="y")),
                 dataclasses.replace(SPEC, splits=SplitSpec(salt="s"))):
        assert pixel_fingerprint(same, VERSIONS) == base
    assert pixel_fingerprint(SPEC, {**VERSIONS, "apache_beam": "3", "python": "3.12"}) == base
    # Settings of an encoding, a normalization, a resize or an alpha mode the records do not use.
    png = with_image(encoding="png", interpolation="cubic")
    assert pixel_fingerprint(with_image(encoding="png", interpolation="cubic", quality=50, mean=(0.5, 0.5, 0.5),
                                        std=(0.2, 0.2, 0.2), pad_value=9, reduced_decode="off"),
                             VERSIONS) == pixel_fingerprint(png, VERSIONS)
    assert pixel_fingerprint(with_image(alpha="drop", background=(0, 0, 0)), VERSIONS) == pixel_fingerprint(
        with_image(alpha="drop"), VERSIONS)
    # ... and where they are used.
    for used, change in ((with_image(resize_mode="pad"), {"pad_value": 9}),
                         (with_image(interpolation="area"), {"reduced_decode": "off"}),
                         (SPEC, {"background": (0, 0, 0)})):  # alpha composited: the default
        other = dataclasses.replace(used, image=dataclasses.replace(used.image, **change))
        assert pixel_fingerprint(other, VERSIONS) != pixel_fingerprint(used, VERSIONS), change
    jpeg = with_image(encoding="jpeg", normalize="none")
    assert pixel_fingerprint(jpeg, VERSIONS) != pixel_fingerprint(with_image(encoding="jpeg", normalize="none",
                                                                             quality=50), VERSIONS)
    mean_std = with_image(normalize="mean_std", encoding="raw")
    assert pixel_fingerprint(mean_std, VERSIONS) != pixel_fingerprint(with_image(normalize="mean_std", encoding="raw",
                                                                                 std=(0.2, 0.2, 0.2)), VERSIONS)


def test_config_fingerprint_ignores_where_and_how_to_publish():
    base = config_fingerprint(SPEC, VERSIONS)
    for same in (with_output(path="elsewhere"), with_output(overwrite=True), with_output(skip_unchanged=True),
                 with_output(allow_empty=True), with_output(skip_unchanged=True, compare_to="latest"),
                 with_output(reuse_from="x")):
        assert config_fingerprint(same, VERSIONS) == base
    assert config_fingerprint(SPEC, {**VERSIONS, "apache_beam": "3", "python": "3.12"}) == base
    for changed in (with_output(num_shards=3), with_output(shuffle_seed=1), with_output(compression="gzip"),
                    with_image(quality=80), dataclasses.replace(SPEC, splits=SplitSpec(salt="s")),
                    dataclasses.replace(SPEC, input=InputSpec("other"))):
        assert config_fingerprint(changed, VERSIONS) != base
    for library in ("imgrec", "opencv", "numpy", "pillow"):  # they make the pixels
        assert config_fingerprint(SPEC, {**VERSIONS, library: "0.0.1"}) != base


def test_input_fingerprint_is_order_independent_and_sensitive():
    rows = [image_row(f"/img/{i}.jpg", f"{i:064x}", "cat") for i in range(20)]

    def combine(*batches):
        return seeded_fingerprint(add_hashes(*(rows_sum(batch) for batch in batches)), "config")

    whole = combine(rows)
    assert combine(rows[::-1]) == whole == combine(rows[:7], rows[7:], [])  # any order, any bundling
    assert combine(rows[:-1]) != whole
    assert combine([*rows[:-1], image_row("/img/19.jpg", f"{19:064x}", "dog")]) != whole  # label changed
    assert seeded_fingerprint(add_hashes(), "other config") != combine([])


def test_a_dataset_that_rejected_files_for_their_state_while_converting_records_another_fingerprint():
    """A file changed (or unreadable) while converting was hashed as an image by the first pass:
    a dataset without it must not be found unchanged once the file is back."""
    def retries(*rejections: tuple[str, str, object]) -> int:
        return add_hashes(*(retry_hash(Rejection("/in/cat/1.jpg", stage, error, "why", split))
                            for error, stage, split in rejections))

    settled = [("CorruptImage", "decode", "train"), ("UnreadableFile", "read", None), ("SkippedFile", "discover", None)]
    assert retries(*settled) == 0 and recorded_fingerprint("f" * 64, 0) == "f" * 64
    changed = recorded_fingerprint("f" * 64, retries(*settled, ("FileChanged", "read", "train")))
    unreadable = recorded_fingerprint("f" * 64, retries(("UnreadableFile", "read", "val")))
    assert changed != "f" * 64 != unreadable and len(changed) == 64


def recomputed_fingerprint(spec: ConversionSpec, rounding: bool = True, damage_checks: bool = True) -> str:
    """config_fingerprint computed here, with or without the entries that name imgrec's rules."""
    config = json.loads(json.dumps(spec.to_dict()))
    config["versions"] = {name: VERSIONS[name] for name in ("imgrec", "opencv", "numpy", "pillow")}
    for field in POLICY_FIELDS:
        config["output"].pop(field)
    if rounding and spec.splits.method == "stratified":
        config["splits"]["rounding"] = STRATIFIED_ROUNDING
    if damage_checks:
        config["image"]["damage_checks"] = DAMAGE_CHECKS
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode("utf-8")).hexdigest()


def test_stratified_fingerprints_name_the_rounding():
    """--skip_unchanged must not keep a stratified dataset that an older rounding cut."""
    stratified = dataclasses.replace(SPEC, splits=dataclasses.replace(SPEC.splits, method="stratified"))
    assert config_fingerprint(stratified, VERSIONS) == recomputed_fingerprint(stratified)
    assert config_fingerprint(stratified, VERSIONS) != recomputed_fingerprint(stratified, rounding=False)


def test_fingerprints_name_the_damage_checks():
    """--skip_unchanged must not keep a dataset converted before damaged JPEGs were refused."""
    assert config_fingerprint(SPEC, VERSIONS) == recomputed_fingerprint(SPEC)
    assert config_fingerprint(SPEC, VERSIONS) != recomputed_fingerprint(SPEC, damage_checks=False)
