"""Write every split's shards: plan parts per shard, convert parts in parallel, concatenate.

    PlannedImage ─► PlanShards ─► ConvertParts ─► ConcatShards ─► ShardResult
                   (group refs     (decode → ... →    (part files in
                    by shard,       Example, one       order → the shard
                    cut into        part file per      file + its record
                    parts)          part)              index)

Only small image references cross a shuffle; pixels are read, converted and written by the
part's DoFn call, so memory stays bounded by the parts in flight, even on the DirectRunner.
A part is a fixed number of consecutive records of one shard, so a shard's images are converted
by as many workers as it has parts (a cluster is not capped at one busy worker per shard), and
TFRecord framing is per record, so concatenating the parts in order gives the same bytes as
writing the shard in one pass. Shards are therefore byte-identical on every runner.

Parts are named by a digest of the settings and images they hold and kept in the staging area
until the dataset is published: a run that was killed and started again finds the parts it
already finished and converts only the rest (resumable runs).

Beam's `WriteToTFRecord(num_shards=N)` would group the encoded images themselves (which the
DirectRunner holds in memory) and, with `num_shards=0`, leave the shard count and the record
order to the runner. The cost of this design on a cluster: every record is written twice (the
part, then the shard) and the concatenation of one shard runs on one worker.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Iterable, Union

import apache_beam as beam
from apache_beam.metrics import Metrics

from transforms import files
from transforms.batches import flatten, split_by
from transforms.inputs.discover import REJECTED
from transforms.plan.split import num_shards_for, record_bytes_estimate, shard_for
from transforms.refs import Batch, PlannedImage
from transforms.specs import ImageSpec, OutputSpec
from transforms.write.concurrency import InflightDoFn, shared_process_pool
from transforms.write.parts import (
    PartOutcome,
    PartResult,
    PartTask,
    ShardKey,
    ShardPlan,
    WriterSettings,
    concat_shard,
    convert_part_on,
    cut_into_parts,
    shard_keys,
    shard_order,
)
from transforms.write.process_pool import SubprocessPool


def by_shard(batch: Batch, shard_counts: dict[str, int], seed: int,
             source_root: str = "") -> Iterable[tuple[ShardKey, tuple[PlannedImage, ...]]]:
    """A batch split by shard: (shard, its images in the batch)."""
    def shard_of(image: PlannedImage) -> ShardKey:
        num_shards = shard_counts[image.split]
        return image.split, shard_for(files.below(image.source.path, source_root), seed, num_shards), num_shards

    return split_by(batch, shard_of).items()


PLANS = "plans"


@dataclasses.dataclass(frozen=True)
class ShardOpening:
    """What every shard is grouped with besides its images: it makes empty shards exist, and it
    brings the dataset's size, which sets the part size. As a side input that size would make
    the conversion's stage one with a side input, and Prism (2.77) re-polls such a stage without
    pause while its bundle runs: half a core for the whole conversion."""

    images: int


def plan_shard(element: tuple[ShardKey, Iterable[Union[tuple[PlannedImage, ...], ShardOpening]]],
               settings: WriterSettings):
    """A shard's opening and batches of images → its parts, plus its plan keyed by shard (PLANS)
    for the concatenation."""
    shard, pieces = element
    pieces = list(pieces)
    (opening,) = [piece for piece in pieces if isinstance(piece, ShardOpening)]
    batches = [piece for piece in pieces if not isinstance(piece, ShardOpening)]
    ordered = shard_order(flatten(batches), settings.output.shuffle_seed, settings.source_root)
    parts = cut_into_parts(shard, ordered, settings, opening.images)
    yield beam.pvalue.TaggedOutput(PLANS, (shard, ShardPlan(shard, len(parts))))
    yield from parts


def count_batch(batch: Batch, image: ImageSpec) -> tuple[dict[str, int], dict[str, int]]:
    """A batch's ({split: images}, {split: estimated bytes of their records}), the bytes for the
    shard count (`record_bytes_estimate`)."""
    counts, sizes = collections.Counter(), collections.Counter()
    for planned in batch:
        counts[planned.split] += 1
        sizes[planned.split] += record_bytes_estimate(image, planned.source.header.width, planned.source.header.height)
    return dict(counts), dict(sizes)


def sum_counts(counted):
    """Counts and sizes (`count_batch`'s) summed per split. Beam's combine of a callable feeds
    it its own partial sums too, so it takes and returns one shape."""
    counts, sizes = collections.Counter(), collections.Counter()
    for more_counts, more_sizes in counted:
        counts.update(more_counts)
        sizes.update(more_sizes)
    return dict(counts), dict(sizes)


def shard_counts_of(counted: tuple[dict[str, int], dict[str, int]], output: OutputSpec) -> dict[str, int]:
    counts, sizes = counted
    return {split: num_shards_for(count, sizes[split], output) for split, count in counts.items()}


def shard_openings(counted: tuple[dict[str, int], dict[str, int]], output: OutputSpec) -> list:
    """(ShardKey, ShardOpening) for every shard, so shards no image hashed to exist too."""
    total = sum(counted[0].values())
    return [(key, ShardOpening(total)) for key in shard_keys(shard_counts_of(counted, output))]


class _ConvertParts(InflightDoFn):
    """PartTask → PartResult, plus a rejection per image that could not be converted.

    Every part is converted in a converter process, under the limits that bound what one image
    may cost (transforms/images/limits.py), on every runner: a runner that runs every step in this
    process shares the pool of `local_processes`; elsewhere each instance of this DoFn (one per
    thread the runner converts on) has a converter process of its own."""

    def __init__(self, settings: WriterSettings):
        super().__init__(settings.local_processes)
        self._settings = settings
        self._converted = Metrics.counter("imgrec", "images_converted")
        self._reused = Metrics.counter("imgrec", "images_reused")
        self._parts = Metrics.counter("imgrec", "parts_done")

    def task(self, part: PartTask):
        return convert_part_on, (self._converters, part, self._settings)

    def size(self, part: PartTask) -> int:
        return len(part.images)

    def setup(self) -> None:
        super().setup()
        self._settings.filesystems.use()  # what this worker itself reads: finished parts, previous datasets
        processes, converter = self._settings.local_processes, self._settings.converter
        self._converters = shared_process_pool(processes, converter) if processes else SubprocessPool(1, converter)

    def teardown(self) -> None:
        super().teardown()
        converters = getattr(self, "_converters", None)
        if converters is not None and not self._settings.local_processes:
            converters.shutdown(wait=True)

    def emit(self, part: PartTask, outcome: PartOutcome):
        self._converted.inc(outcome.records - outcome.reused)
        self._reused.inc(outcome.reused)
        self._parts.inc()
        for rejection in outcome.rejections:
            yield beam.pvalue.TaggedOutput(REJECTED, rejection)
        yield part.shard, PartResult(part.shard, part.index, part.digest, len(part.images), outcome.records,
                                     outcome.num_bytes, outcome.label_counts, outcome.reused,
                                     outcome.converted_by, outcome.resumed)


class _ConcatShards(InflightDoFn):
    """(shard, [ShardPlan, PartResult...]) → ShardResult; on the converters' pool, since a
    shard's copy is I/O that can overlap with the other shards'."""

    def __init__(self, settings: WriterSettings):
        # the converters' own pool: one of its own would start more processes
        super().__init__(settings.local_processes, processes=True, initializer=settings.converter)
        self._settings = settings

    def task(self, element: tuple[ShardKey, Iterable[Union[ShardPlan, PartResult]]]):
        values = list(element[1])
        (plan,) = [v for v in values if isinstance(v, ShardPlan)]
        return concat_shard, (plan, [v for v in values if isinstance(v, PartResult)], self._settings)

    def setup(self) -> None:
        super().setup()
        self._settings.filesystems.use()  # empty shards, written inline in this worker


@beam.ptransform_fn
def WriteShards(planned: beam.PCollection, settings: WriterSettings, spread: bool = True):
    """Batches of PlannedImage → {"shards": ShardResult, "rejected": Rejection, "planned_counts":
    {split: n}, "parts": PartResult (for progress)}.

    `spread`: reshuffle the parts, so that a cluster's workers share a shard's parts, which one
    worker cut. A runner that runs every step in one process converts on its own pool instead,
    where the reshuffle would only pickle every part a few more times."""
    output = settings.output
    counted = (planned | "CountBatches" >> beam.Map(count_batch, settings.image)
               | "PlannedCounts" >> beam.CombineGlobally(sum_counts))
    planned_counts = counted | "Counts" >> beam.MapTuple(lambda counts, _: counts)
    shard_counts = counted | "ShardCounts" >> beam.Map(shard_counts_of, output)
    openings = counted | "OpenShards" >> beam.FlatMap(shard_openings, output)
    keyed = planned | "ByShard" >> beam.FlatMap(by_shard, beam.pvalue.AsSingleton(shard_counts),
                                                output.shuffle_seed, settings.source_root)
    work = ((keyed, openings)
            | "ImagesAndShards" >> beam.Flatten()
            | "GroupShards" >> beam.GroupByKey()
            | "CutIntoParts" >> beam.FlatMap(plan_shard, settings)
            .with_outputs(PLANS, main="parts"))
    parts = (work.parts | "SpreadParts" >> beam.Reshuffle()) if spread else work.parts
    converted = parts | "ConvertParts" >> beam.ParDo(_ConvertParts(settings)).with_outputs(REJECTED, main="parts")
    shards = ((work[PLANS], converted.parts)
              | "PlansAndParts" >> beam.Flatten()
              | "GroupParts" >> beam.GroupByKey()
              | "ConcatShards" >> beam.ParDo(_ConcatShards(settings)))
    return {"shards": shards, REJECTED: converted[REJECTED], "planned_counts": planned_counts,
            "parts": converted.parts | "PartResults" >> beam.Values()}
