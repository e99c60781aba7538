"""How every input was accounted for, gathered in one pass for the pipeline's last step.

Every small fact the run produces (an input seen, a rejection, a written shard, the planned
counts, a group of identical images, the label map, the input fingerprint, a file of dead
letters) is tagged and combined by one CombineFn into one `Gathered` value. One global combine
instead of one per count keeps the job graph small, which is most of a small run's fixed cost
on Beam's runners.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
from typing import Iterable, Sequence

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipeline.metadata import RejectionKey, RunTotals
from transforms.dataset_format import DuplicateSummary
from transforms.inputs.annotations import OBJECT_STAGE
from transforms.plan.assign import DuplicateGroup
from transforms.plan.fingerprint import add_hashes, recorded_fingerprint, retry_hash

DUPLICATE_EXAMPLES = 100  # duplicate groups listed in metadata.json
DUPLICATE_PATHS = 10  # paths listed for each of them

# The kinds of facts: the names of GatherTotals' inputs.
INPUT, REJECTION, SHARD, PLANNED, DUPLICATE, LABEL_MAP, FINGERPRINT, DEAD_LETTER_RUN = (
    "inputs", "rejected", "shards", "planned_counts", "duplicates", "label_map", "fingerprint", "dead_letter_runs")


@dataclasses.dataclass
class Gathered:
    """The combined facts of one run (the accumulator of `TotalsFn` and its output)."""

    num_inputs: int = 0
    # Rejections are counted, not kept (pipeline/output/dead_letters.py writes them): a run may have millions.
    rejections: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # RejectionKey → n
    retries: int = 0  # sum of the rejections' retry_hash
    dead_letter_runs: list = dataclasses.field(default_factory=list)  # paths of sorted run files
    shards: list = dataclasses.field(default_factory=list)  # ShardResult
    planned_counts: dict = dataclasses.field(default_factory=dict)
    duplicates: DuplicateSummary = DuplicateSummary()  # `dropped` is the run's setting, set by `totals`
    label_map: dict = dataclasses.field(default_factory=dict)
    fingerprint: str = ""
    # Objects and annotation entries dropped (stage "object"), by error class: apart from the inputs.
    objects_dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def add(self, kind: str, value: object) -> None:
        if kind == INPUT:
            self.num_inputs += value
        elif kind == REJECTION and value.stage == OBJECT_STAGE:
            self.objects_dropped[value.error] += 1
        elif kind == REJECTION:
            key: RejectionKey = (value.split, value.stage, value.error, value.counts_as_error)
            self.rejections[key] += 1
            self.retries = add_hashes(self.retries, retry_hash(value))
        elif kind == DEAD_LETTER_RUN:
            self.dead_letter_runs.append(value)
        elif kind == SHARD:
            self.shards.append(value)
        elif kind == PLANNED:
            self.planned_counts.update(value)
        elif kind == DUPLICATE:
            conflicts = int(len(set(value.labels)) > 1)  # its copies carry different labels
            self.duplicates = _merged(self.duplicates, DuplicateSummary(1, len(value.paths) - 1, False,
                                                                        (example(value),), conflicts))
        elif kind == LABEL_MAP:
            self.label_map.update(value)
        elif kind == FINGERPRINT:
            self.fingerprint = value
        else:
            raise ValueError(f"unknown fact {kind!r}")

    def merge(self, other: "Gathered") -> "Gathered":
        self.num_inputs += other.num_inputs
        self.rejections.update(other.rejections)
        self.objects_dropped.update(other.objects_dropped)
        self.retries = add_hashes(self.retries, other.retries)
        self.dead_letter_runs.extend(other.dead_letter_runs)
        self.shards.extend(other.shards)
        self.planned_counts.update(other.planned_counts)
        self.duplicates = _merged(self.duplicates, other.duplicates)
        self.label_map.update(other.label_map)
        self.fingerprint = self.fingerprint or other.fingerprint
        return self

    def totals(self, dropped_duplicates: bool, error_files: Sequence[str]) -> RunTotals:
        return RunTotals(label_map=self.label_map, shards=tuple(self.shards), planned_counts=self.planned_counts,
                         rejection_counts=tuple(self.rejections.items()), num_inputs=self.num_inputs,
                         duplicates=dataclasses.replace(self.duplicates, dropped=dropped_duplicates),
                         error_files=tuple(error_files),
                         fingerprint=recorded_fingerprint(self.fingerprint, self.retries),
                         objects_dropped=dict(self.objects_dropped))


def _merged(one: DuplicateSummary, other: DuplicateSummary) -> DuplicateSummary:
    """Both counts; of the examples, the `DUPLICATE_EXAMPLES` with the smallest hashes."""
    examples = sorted([*one.examples, *other.examples], key=lambda e: e["sha256"])[:DUPLICATE_EXAMPLES]
    return DuplicateSummary(one.groups + other.groups, one.extra_copies + other.extra_copies, False,
                            tuple(examples), one.label_conflicts + other.label_conflicts)


def example(group: DuplicateGroup) -> dict:
    """A duplicate group as metadata.json lists it: its number of copies and at most
    `DUPLICATE_PATHS` of them, the first of each label first (a conflict stays visible), then the
    smallest paths. One image copied 100,000 times made a 14 MB metadata.json, which every reader
    parses, listing them all."""
    firsts: dict = {}
    for i, label in enumerate(group.labels):
        firsts.setdefault(label, i)
    labelled = list(firsts.values())[:DUPLICATE_PATHS]
    rest = (i for i in range(len(group.paths)) if i not in labelled)
    shown = sorted([*labelled, *itertools.islice(rest, DUPLICATE_PATHS - len(labelled))])
    return {"sha256": group.content_hash, "copies": len(group.paths), "paths": [group.paths[i] for i in shown],
            "labels": [group.labels[i] for i in shown]}


class TotalsFn(beam.CombineFn):
    def create_accumulator(self) -> Gathered:
        return Gathered()

    def add_input(self, accumulator: Gathered, fact: tuple[str, object]) -> Gathered:
        accumulator.add(*fact)
        return accumulator

    def merge_accumulators(self, accumulators: Iterable[Gathered]) -> Gathered:
        return functools.reduce(Gathered.merge, accumulators)

    def extract_output(self, accumulator: Gathered) -> Gathered:
        return accumulator


def _tagged(fact: object, kind: str) -> tuple[str, object]:
    if kind == REJECTION:  # Beam's metrics show rejections by error class while the job runs
        Metrics.counter("imgrec", f"rejected_{fact.error}").inc()
    return kind, fact


class GatherTotals(beam.PTransform):
    """{"inputs": input counts, "rejected": Rejection, "shards": ShardResult,
    "planned_counts": {split: n}, "duplicates": DuplicateGroup, "label_map": {label: id},
    "fingerprint": str, "dead_letter_runs": path} → one Gathered."""

    def expand(self, facts) -> beam.PCollection:
        tagged = [facts_of_kind | f"Tag{kind.title().replace('_', '')}" >> beam.Map(_tagged, kind)
                  for kind, facts_of_kind in facts.items()]
        return tagged | "AllFacts" >> beam.Flatten() | "Combine" >> beam.CombineGlobally(TotalsFn())
