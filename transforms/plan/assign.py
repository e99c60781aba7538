"""Give every readable image a label id, a duplicate group and a split.

All of this moves small references (path, label, hash), never pixels, so the grouping steps
stay cheap on every runner.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, Mapping, Optional, Sequence, Union

import apache_beam as beam

from transforms import files
from transforms.batches import GroupInBuckets, batched, flatten, split_by
from transforms.inputs.discover import REJECTED
from transforms.inputs.labels import build_label_map, label_list
from transforms.plan.split import assign_split, stratified_splits
from transforms.refs import Batch, PlannedImage, SourceImage
from transforms.rejections import DuplicateImage, Rejection, UnknownLabel
from transforms.specs import SplitSpec

DUPLICATES = "duplicates"


@dataclasses.dataclass(frozen=True)
class LabeledImage:
    source: SourceImage
    label_id: Union[int, tuple[int, ...]]  # a multi-label image's: one per label


@dataclasses.dataclass(frozen=True)
class SplitUnit:
    """Images that must share a split: copies of one content (or a single path)."""

    key: str
    label: str
    members: tuple[LabeledImage, ...]


@dataclasses.dataclass(frozen=True)
class DuplicateGroup:
    content_hash: str
    paths: tuple[str, ...]
    labels: tuple[str, ...]


@beam.ptransform_fn
def ComputeLabelMap(labels: beam.PCollection, class_names: Optional[Sequence[str]], integer_ids: bool,
                    multi_label: bool = False) -> beam.PCollection:
    """Tuples of label names → a single {label text: id} dict, to be used as a side input."""
    if multi_label:  # each image's label text joins its labels: the classes are the labels
        labels = labels | "SplitLabels" >> beam.Map(
            lambda found: tuple(name for text in found for name in label_list(text)))
    return (labels
            | "DistinctLabels" >> beam.CombineGlobally(distinct)
            | "BuildLabelMap" >> beam.Map(build_label_map, class_names, integer_ids))


def distinct(groups: Iterable[Iterable[str]]) -> set[str]:
    """Groups of names → the set of distinct ones (small sets only: label names). As a
    CombineGlobally function it is also given the sets it made."""
    return set().union(*groups)


def attach_label_ids(batch: Batch, label_map: Mapping[str, int], multi_label: bool = False):
    """A batch of images → the batch with label ids; unknown labels as rejections. An annotated
    image (COCO, VOC) has no image-level class: id 0, its objects carry theirs. A multi-label
    image gets a tuple of ids, one per label (none for an image with no label)."""
    labeled = []
    for image in batch:
        labels = label_list(image.label) if multi_label else (image.label,)
        unknown = [label for label in labels if label not in label_map]
        if image.annotations is not None:
            labeled.append(LabeledImage(image, 0))
        elif not unknown:
            ids = tuple(label_map[label] for label in labels)
            labeled.append(LabeledImage(image, ids if multi_label else ids[0]))
        else:
            reason = UnknownLabel(f"label {unknown[0]!r} is not one of the {len(label_map)} configured classes")
            yield beam.pvalue.TaggedOutput(REJECTED, Rejection.from_exception(image.path, reason))
    if labeled:
        yield Batch(labeled)


def group_copies(content_hash: str, copies: Iterable[LabeledImage], split_key: str, drop_duplicates: bool,
                 source_root: str = "") -> Iterator[Union[SplitUnit, beam.pvalue.TaggedOutput]]:
    """One content hash's images → split units, plus a duplicate report when there are copies.

    The copy with the smallest path is canonical, so the choice does not depend on the runner.
    """
    members = sorted(copies, key=lambda m: m.source.path)
    canonical = members[0]
    if len(members) > 1:
        yield beam.pvalue.TaggedOutput(DUPLICATES, DuplicateGroup(
            content_hash, tuple(m.source.path for m in members), tuple(m.source.label for m in members)))
    if drop_duplicates:
        for copy in members[1:]:
            other_label = (f" (labelled {canonical.source.label!r}, this copy {copy.source.label!r})"
                           if copy.source.label != canonical.source.label else "")
            reason = DuplicateImage(f"same content (sha256 {content_hash[:12]}…) as {canonical.source.path}"
                                    f"{other_label}")
            yield beam.pvalue.TaggedOutput(REJECTED, Rejection.from_exception(copy.source.path, reason))
        members = [canonical]
    if split_key == "content":
        yield SplitUnit(content_hash, canonical.source.label, tuple(members))
    else:
        for member in members:
            yield SplitUnit(files.below(member.source.path, source_root), member.source.label, (member,))


def bucket_units(element: tuple[int, Batch], split_key: str, drop_duplicates: bool, source_root: str = ""):
    """One bucket's images → batches of split units: `group_copies` per content hash (its tagged
    outputs, rejections and duplicate reports, pass through `batched` as they come)."""
    _, images = element
    yield from batched(found for content_hash, copies in split_by(images, lambda m: m.source.content_hash).items()
                       for found in group_copies(content_hash, copies, split_key, drop_duplicates, source_root))


def plan_unit(unit: SplitUnit, split: str) -> Iterator[PlannedImage]:
    return (PlannedImage(member.source, member.label_id, split) for member in unit.members)


def plan_label_stratified(units: Iterable[SplitUnit], spec: SplitSpec) -> Iterator[PlannedImage]:
    units = list(units)
    assignment = stratified_splits((u.key for u in units), spec)
    return (image for unit in units for image in plan_unit(unit, assignment[unit.key]))


def plan_hash_splits(units: Iterable[SplitUnit], spec: SplitSpec) -> Batch:
    return Batch(image for unit in units for image in plan_unit(unit, assign_split(unit.key, spec)))


@beam.ptransform_fn
def PlanSplits(images: beam.PCollection, splits: SplitSpec, label_map: beam.pvalue.AsSingleton, drop_duplicates: bool,
               source_root: str = "", multi_label: bool = False) -> dict[str, beam.PCollection]:
    """Batches of SourceImage → {"planned": batches of PlannedImage, "rejected": Rejection,
    "duplicates": DuplicateGroup}."""
    labeled = images | "AttachLabelIds" >> beam.FlatMap(
        attach_label_ids, label_map, multi_label).with_outputs(REJECTED, main="labeled")
    units = (labeled.labeled
             | "ByContent" >> GroupInBuckets(lambda m: m.source.content_hash)
             | "ToSplitUnits" >> beam.FlatMap(
                 bucket_units, splits.key, drop_duplicates, source_root).with_outputs(
                     REJECTED, DUPLICATES, main="units"))
    if splits.method == "hash":
        planned = units.units | "HashSplit" >> beam.Map(plan_hash_splits, splits)
    else:
        planned = (units.units
                   | "ByLabel" >> beam.FlatMap(lambda batch: split_by(batch, lambda u: u.label).items())
                   | "GroupByLabel" >> beam.GroupByKey()
                   | "StratifiedSplit" >> beam.FlatMapTuple(
                       lambda _, parts: batched(plan_label_stratified(flatten(parts), splits))))
    rejected = (labeled[REJECTED], units[REJECTED]) | "MergeRejected" >> beam.Flatten()
    return {"planned": planned, REJECTED: rejected, DUPLICATES: units[DUPLICATES]}
