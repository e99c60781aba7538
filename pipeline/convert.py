"""The whole conversion as one composite transform: discover → read → plan → write → publish.

Each concern is its own labelled composite; this one only wires them. Its last step gathers
the counts, checks them (they must reconcile, the error budget must hold, some image must have
been written) and publishes the dataset (pipeline/output/publish.py). A refusal leaves its reason in
the run's staging folder for the driver to print; on Dataflow, whose job status schedulers
watch without the driver, it also fails the job.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

import apache_beam as beam
from apache_beam.pvalue import AsSingleton

from pipeline.accounting import Gathered, GatherTotals
from pipeline.errors import RunFailed
from pipeline.metadata import build_metadata, check_error_budget, rejections_by_error
from pipeline.output.dead_letters import WriteSortedRuns, write_dead_letters
from pipeline.output.progress import RecordProgress
from pipeline.output.publish import publish
from pipeline.tables import counted
from transforms import files
from transforms.dataset_format import DatasetMetadata, FormatError, join
from transforms.inputs.annotations import OBJECT_STAGE
from transforms.inputs.discover import LABELS, REJECTED, DiscoverImages, OutputFolder
from transforms.inputs.discover_annotated import LABEL_MAP, DiscoverAnnotated
from transforms.inputs.label_map_files import write_label_maps
from transforms.inputs.read import ReadAndCheck
from transforms.inputs.rejected_objects import ObjectsOfRejectedImages
from transforms.plan.assign import DUPLICATES, ComputeLabelMap, PlanSplits
from transforms.plan.fingerprint import InputFingerprint
from transforms.plan.reuse import AttachReusableRecords, ReuseSource
from transforms.specs import ConversionSpec
from transforms.write.parts import WriterSettings
from transforms.write.write_shards import WriteShards

UNCHANGED_MARKER = "unchanged"
VERDICT_FILE = "refused.txt"  # why the last step refused to publish


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What the driver decided for this run, before the pipeline starts."""

    run: Mapping[str, object]  # run_id, started, runner
    output: str
    run_dir: str
    writer: WriterSettings
    library_versions: Mapping[str, str]
    previous_fingerprint: Optional[str] = None  # --skip_unchanged: the dataset compared with
    reuse: Optional[ReuseSource] = None  # --reuse_from
    output_folder: Optional[OutputFolder] = None  # what imgrec wrote there is not an input
    previous_run_id: Optional[str] = None  # the dataset in the output when the run started
    previous_files: tuple[str, ...] = ()  # its files: the only ones publishing may replace
    fail_job_on_refusal: bool = False  # the job's own status must show a refusal (Dataflow)
    in_one_process: bool = False  # the runner runs every step in this process (run.runs_in_one_process)


def check_not_empty(metadata: DatasetMetadata, spec: ConversionSpec, dead_letters: str) -> None:
    inputs = metadata.inputs
    if inputs.written == 0 and not spec.output.allow_empty:
        why = f": {rejections_by_error(inputs)}" if inputs.rejected else ""
        where = f" Dead letters: {dead_letters}" if inputs.rejected else ""
        raise RunFailed(f"no image was written ({counted(inputs.total, 'input')} found under {spec.input.path}, "
                        f"{inputs.rejected} rejected{why}); nothing was published. Pass --allow_empty to publish "
                        f"an empty dataset.{where}")


def check_readable(metadata: DatasetMetadata) -> None:
    """What readers will parse is parsed before it is published: a metadata.json they refuse
    must never replace a dataset."""
    try:
        DatasetMetadata.loads(metadata.dumps())
    except FormatError as exc:
        raise RunFailed(f"this run's metadata.json would not be readable ({exc}); nothing was published") from None


def finalize(gathered: Gathered, spec: ConversionSpec, context: RunContext) -> Optional[str]:
    """Counts → dead letters and metadata → checks → published dataset; None when unchanged.

    Returns metadata.json's text, which is ASCII: a dict would carry file names that are not
    UTF-8 (as surrogates), which Beam's coders cannot encode, after the dataset was published."""
    context.writer.filesystems.use()  # an empty dead-letter file is written through the store's client (S3)
    if gathered.fingerprint == context.previous_fingerprint:
        files.write_atomically(join(context.run_dir, UNCHANGED_MARKER), gathered.fingerprint.encode("ascii"))
        return None
    error_file = write_dead_letters(gathered.dead_letter_runs, context.run_dir)
    totals = gathered.totals(spec.output.drop_duplicates, [error_file])
    metadata = build_metadata(spec, totals, run=context.run, library_versions=context.library_versions,
                              reuse_source=context.reuse.dataset if context.reuse else None)
    try:
        check_error_budget(metadata, spec.output.max_error_fraction, join(context.run_dir, error_file))
        check_not_empty(metadata, spec, join(context.run_dir, error_file))
        check_readable(metadata)
        if metadata.objects is not None:
            write_label_maps(context.run_dir, metadata.label_map)
        publish(context.output, context.run_dir, metadata, context.previous_run_id, context.previous_files)
    except RunFailed as exc:
        files.write_atomically(join(context.run_dir, VERDICT_FILE), str(exc).encode("utf-8", "backslashreplace"))
        if context.fail_job_on_refusal:
            raise
        return None
    return metadata.dumps()


@beam.ptransform_fn
def ConvertToTFRecords(pbegin: beam.pvalue.PBegin, spec: ConversionSpec, context: RunContext) -> beam.PCollection:
    """PBegin → the published metadata.json text (or None when the dataset is unchanged)."""
    if spec.input.detection:
        discovered = pbegin | "Discover" >> DiscoverAnnotated(spec.input, spec.annotations.masks)
        label_map = discovered[LABEL_MAP]
    else:
        discovered = pbegin | "Discover" >> DiscoverImages(spec.input, context.output_folder,
                                                          spread=not context.in_one_process)
        label_map = discovered[LABELS] | "LabelMap" >> ComputeLabelMap(
            spec.input.class_names, integer_ids=spec.input.resolved_kind in ("csv", "jsonl"),
            multi_label=spec.input.multi_label)
    candidates = discovered["candidates"]
    if not context.in_one_process:  # one process spreads the work on its own pool
        candidates = candidates | "SpreadCandidates" >> beam.Reshuffle()
    read = candidates | "ReadAndCheck" >> beam.ParDo(ReadAndCheck(
        spec.image, spec.input.max_file_bytes, context.writer.local_processes, context.writer.converter
    )).with_outputs(REJECTED, main="images")
    early_rejections = (discovered[REJECTED], read[REJECTED]) | "EarlyRejections" >> beam.Flatten()
    fingerprint = ((read.images, early_rejections, label_map)
                   | "Fingerprint" >> InputFingerprint(spec, context.library_versions))
    plan = read.images | "PlanSplits" >> PlanSplits(spec.splits, AsSingleton(label_map),
                                                    spec.output.drop_duplicates, context.writer.source_root,
                                                    spec.input.multi_label)
    to_write = plan["planned"] | "SkipIfUnchanged" >> beam.Filter(
        lambda _, current, previous: current != previous, AsSingleton(fingerprint), context.previous_fingerprint)
    if context.reuse:
        to_write = to_write | "AttachReusableRecords" >> AttachReusableRecords(context.reuse)
    written = to_write | "WriteShards" >> WriteShards(context.writer, spread=not context.in_one_process)
    _ = (written["planned_counts"], written["parts"]) | "RecordProgress" >> RecordProgress(
        context.run_dir, (context.output, str(context.run["run_id"])))
    inputs = ((discovered["candidates"] | "BatchSizes" >> beam.Map(len),
               discovered[REJECTED] | "One" >> beam.Map(lambda r: int(r.stage != OBJECT_STAGE)))
              | "AllInputs" >> beam.Flatten())
    rejected = [early_rejections, plan[REJECTED], written[REJECTED]]
    if spec.input.detection:  # the objects of an image rejected after discovery go with it, counted
        late = (read[REJECTED], plan[REJECTED], written[REJECTED]) | "LateRejections" >> beam.Flatten()
        rejected.append((discovered["candidates"], late) | "ObjectsOfRejectedImages" >> ObjectsOfRejectedImages())
    rejected = rejected | "AllRejections" >> beam.Flatten()
    dead_letter_runs = rejected | "DeadLetters" >> beam.ParDo(WriteSortedRuns(context.run_dir))
    return ({"inputs": inputs, "rejected": rejected, "shards": written["shards"],
             "planned_counts": written["planned_counts"], "duplicates": plan[DUPLICATES],
             "label_map": label_map, "fingerprint": fingerprint, "dead_letter_runs": dead_letter_runs}
            | "GatherTotals" >> GatherTotals()
            | "Publish" >> beam.Map(finalize, spec, context))
