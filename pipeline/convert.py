"""The whole conversion as one composite transform: discover → read → plan → write → publish."""
from __future__ import annotations

import posixpath
from typing import Iterable, Mapping, Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsList, AsSingleton

from pipeline.metadata import RejectionCount, build_metadata, check_error_fraction
from pipeline.publish import discard_staging, publish
from transforms.assign import DUPLICATES, ComputeLabelMap, PlanSplits
from transforms.discover import REJECTED, DiscoverImages
from transforms.fingerprint import FingerprintFn, config_fingerprint
from transforms.read import ReadAndCheck, SourceImage
from transforms.rejections import Rejection
from transforms.specs import ConversionSpec
from transforms.split import num_shards_for
from transforms.write_shards import ShardResult, WriteShards, create_tfrecord_file, shard_file_name

DUPLICATE_EXAMPLES = 100


def rejection_key(rejection: Rejection) -> tuple[object, str, str, bool]:
    Metrics.counter("imgrec", f"rejected_{rejection.error}").inc()
    return rejection.split, rejection.stage, rejection.error, rejection.counts_as_error


def summarize_duplicates(counts: Sequence[tuple[int, int]], examples: Sequence[tuple], dropped: bool) -> dict:
    groups, extra = counts[0] if counts else (0, 0)
    return {"groups": groups, "extra_copies": extra, "dropped": dropped,
            "examples": [{"sha256": h, "paths": list(p), "labels": list(l)} for h, p, l in examples]}


def image_row(image: SourceImage) -> str:
    return f"image\t{image.path}\t{image.content_hash}\t{image.label}"


def rejection_row(rejection: Rejection) -> str:
    return f"rejected\t{rejection.path}\t{rejection.error}\t{rejection.message}"


def fill_missing_shards(results: Sequence[ShardResult], planned_counts: Mapping[str, int],
                        spec: ConversionSpec, staging_dir: str) -> list[ShardResult]:
    """Shard indices that no image hashed to still get an (empty) file, so `-of-N` is true."""
    present = {(r.split, r.index) for r in results}
    filled = list(results)
    for split, planned in planned_counts.items():
        num_shards = num_shards_for(planned, spec.image, spec.output)
        for index in range(num_shards):
            if (split, index) not in present:
                path = FileSystems.join(staging_dir, shard_file_name(split, index, num_shards, spec.output.suffix))
                create_tfrecord_file(path, spec.output.compression).close()
                filled.append(ShardResult(split, index, num_shards, path, 0, 0, ()))
    return filled


def finalize_dataset(_, spec: ConversionSpec, staging_dir: str, run: dict, previous_fingerprint: Optional[str],
                     fingerprint: str, label_map: Mapping[str, int],
                     shard_results: Sequence[ShardResult], planned_counts: Sequence[Mapping[str, int]],
                     rejection_counts: Iterable[RejectionCount], num_inputs: int,
                     duplicates: Sequence[dict], error_files: Sequence[str]) -> dict:
    """Checks the counts and the error budget, then publishes shards, dead letters and metadata.

    When the inputs and config match the published dataset's fingerprint, nothing was converted
    and the published dataset is kept as it is.
    """
    if fingerprint == previous_fingerprint:
        discard_staging(spec.output.path)
        return {"unchanged": True, "fingerprint": fingerprint}
    planned = planned_counts[0] if planned_counts else {}
    results = fill_missing_shards(shard_results, planned, spec, staging_dir)
    staged = {r.path: posixpath.basename(r.path) for r in results}
    staged.update({path: posixpath.basename(path) for path in error_files})
    shards = [{"split": r.split, "file": staged[r.path], "num_examples": r.num_examples,
               "num_bytes": r.num_bytes, "label_counts": r.label_counts} for r in results]
    metadata = build_metadata(
        spec, label_map=label_map, shards=shards, planned_counts=planned, rejection_counts=rejection_counts,
        num_inputs=num_inputs, duplicates=duplicates[0], error_files=sorted(staged[p] for p in error_files),
        run=run, fingerprint=fingerprint)
    check_error_fraction(metadata, spec.output.max_error_fraction, FileSystems.join(staging_dir, "errors-*.jsonl"))
    publish(staged, spec.output.path, metadata)
    return metadata


class ConvertToTFRecords(beam.PTransform):
    """PBegin → the published dataset's metadata (one dict)."""

    def __init__(self, spec: ConversionSpec, staging_dir: str, run: dict, previous_fingerprint: Optional[str] = None):
        super().__init__()
        self._spec, self._staging_dir, self._run = spec, staging_dir, run
        self._previous_fingerprint = previous_fingerprint

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        spec = self._spec
        discovered = pbegin | "Discover" >> DiscoverImages(spec.input)
        # Matching yields every path in one bundle; redistribute so reads run on all workers.
        candidates = discovered["candidates"] | "SpreadCandidates" >> beam.Reshuffle()
        label_map = candidates | "LabelMap" >> ComputeLabelMap(spec.input.class_names)
        read = candidates | "ReadAndCheck" >> beam.ParDo(ReadAndCheck(spec.image)).with_outputs(
            REJECTED, main="images")
        fingerprint = ((read.images | "ImageRows" >> beam.Map(image_row),
                        (discovered[REJECTED], read[REJECTED]) | "EarlyRejections" >> beam.Flatten()
                        | "RejectionRows" >> beam.Map(rejection_row))
                       | "InputRows" >> beam.Flatten()
                       | "Fingerprint" >> beam.CombineGlobally(FingerprintFn(config_fingerprint(spec))))
        plan = read.images | "PlanSplits" >> PlanSplits(
            spec.splits, AsSingleton(label_map), spec.output.drop_duplicates)
        to_write = plan["planned"] | "SkipIfUnchanged" >> beam.Filter(
            lambda _, current, previous: current != previous, AsSingleton(fingerprint), self._previous_fingerprint)
        written = to_write | "WriteShards" >> WriteShards(
            spec.image, spec.features, spec.output, self._staging_dir)

        rejected = ((discovered[REJECTED], read[REJECTED], plan[REJECTED], written[REJECTED])
                    | "AllRejections" >> beam.Flatten())
        error_files = (rejected
                       | "RejectionJson" >> beam.Map(Rejection.to_json)
                       | "WriteDeadLetters" >> beam.io.WriteToText(
                           FileSystems.join(self._staging_dir, "errors"), file_name_suffix=".jsonl"))
        rejection_counts = (rejected
                            | "RejectionKey" >> beam.Map(rejection_key)
                            | "CountRejections" >> beam.combiners.Count.PerElement())
        num_inputs = ((discovered["candidates"], discovered[REJECTED])
                      | "AllInputs" >> beam.Flatten()
                      | "CountInputs" >> beam.combiners.Count.Globally())
        duplicates = self._summarize_duplicates(plan[DUPLICATES])

        return (pbegin
                | "Finalize" >> beam.Create([None])
                | "PublishDataset" >> beam.Map(
                    finalize_dataset, spec, self._staging_dir, self._run, self._previous_fingerprint,
                    fingerprint=AsSingleton(fingerprint),
                    label_map=AsSingleton(label_map),
                    shard_results=AsList(written["shards"]),
                    planned_counts=AsList(written["planned_counts"]),
                    rejection_counts=AsList(rejection_counts),
                    num_inputs=AsSingleton(num_inputs),
                    duplicates=AsList(duplicates),
                    error_files=AsList(error_files)))

    def _summarize_duplicates(self, groups: beam.PCollection) -> beam.PCollection:
        counts = (groups
                  | "CopiesPerGroup" >> beam.Map(lambda g: (1, len(g.paths) - 1))
                  | "SumCopies" >> beam.CombineGlobally(lambda pairs: tuple(map(sum, zip((0, 0), *pairs)))))
        examples = (groups
                    | "GroupTuple" >> beam.Map(lambda g: (g.content_hash, g.paths, g.labels))
                    | "FirstGroups" >> beam.combiners.Top.Smallest(DUPLICATE_EXAMPLES))
        dropped = self._spec.output.drop_duplicates
        return (groups.pipeline
                | "DuplicatesSummary" >> beam.Create([None])
                | "SummarizeDuplicates" >> beam.Map(
                    lambda _, c, e: summarize_duplicates(c, e[0] if e else [], dropped),
                    AsList(counts), AsList(examples)))
