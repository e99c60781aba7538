"""metadata.json from what the pipeline counted: the counting rules, as pure functions.

Tests check the rules without running Beam; the pipeline calls `build_metadata` once, in its last
step, with one `RunTotals` value.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import math
import platform
from typing import Mapping, Optional

from pipeline import __version__
from pipeline.errors import RunFailed
from transforms.dataset_format import (
    DatasetMetadata,
    DuplicateSummary,
    InputAccounting,
    ObjectAccounting,
    ReuseSummary,
    SplitInfo,
)
from transforms.plan.fingerprint import pixel_library_versions
from transforms.rejections import is_error_class
from transforms.specs import ConversionSpec
from transforms.write.detection_example import detection_feature_spec
from transforms.write.example import feature_spec, image_description
from transforms.write.parts import ShardResult

# (split or None, stage, error class, counts as error) → how many inputs
RejectionKey = tuple[Optional[str], str, str, bool]


class CountMismatch(RuntimeError):
    """Inputs and outputs do not reconcile: a bug, never a data problem; the run must fail."""


class TooManyErrors(RunFailed):
    """More errors than --max_error_fraction allows; the run keeps its dead letters for the user."""


def versions() -> dict[str, str]:
    """What produced the bytes; part of what an incremental run must match."""
    import apache_beam
    import cv2
    import numpy as np
    import PIL

    return {"imgrec": __version__, "apache_beam": apache_beam.__version__, "opencv": cv2.__version__,
            "numpy": np.__version__, "pillow": PIL.__version__, "python": platform.python_version()}


def pixel_fingerprint(spec: ConversionSpec, library_versions: Mapping[str, str]) -> str:
    """Everything that decides an accepted image's stored bytes: an incremental run reuses image
    bytes only from a dataset with the same value."""
    settings = {"image": spec.image.pixel_settings(),
                "versions": pixel_library_versions(library_versions)}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True)
class RunTotals:
    """Everything the pipeline counted, gathered in its last step."""

    label_map: Mapping[str, int]
    shards: tuple[ShardResult, ...]
    planned_counts: Mapping[str, int]
    rejection_counts: tuple[tuple[RejectionKey, int], ...]
    num_inputs: int
    duplicates: DuplicateSummary
    error_files: tuple[str, ...]
    fingerprint: str
    objects_dropped: Mapping[str, int] = dataclasses.field(default_factory=dict)  # by error class


def split_infos(spec: ConversionSpec, totals: RunTotals) -> dict[str, SplitInfo]:
    """Per split: its shards in order; raises CountMismatch unless planned = written + rejected."""
    splits = {}
    for name in spec.splits.names:
        shards = sorted((s for s in totals.shards if s.split == name), key=lambda s: s.index)
        label_counts = sum((collections.Counter(dict(s.label_counts)) for s in shards), collections.Counter())
        written = sum(s.num_examples for s in shards)
        rejected = sum(n for (split, *_), n in totals.rejection_counts if split == name)
        planned = totals.planned_counts.get(name, 0)
        if planned != written + rejected:
            raise CountMismatch(f"split {name}: {planned} planned != {written} written + {rejected} rejected")
        splits[name] = SplitInfo(written, sum(s.num_bytes for s in shards), tuple(s.file for s in shards),
                                 tuple(s.num_examples for s in shards), dict(label_counts), rejected)
    return splits


def input_accounting(totals: RunTotals, written: int) -> InputAccounting:
    """Raises CountMismatch unless every input was written or rejected."""
    rejected = sum(n for _, n in totals.rejection_counts)
    if totals.num_inputs != written + rejected:
        raise CountMismatch(f"{totals.num_inputs} inputs != {written} written + {rejected} rejected")
    by_error: collections.Counter[str] = collections.Counter()
    by_stage: collections.Counter[str] = collections.Counter()
    errors = 0
    for (_, stage, error, counts_as_error), n in totals.rejection_counts:
        by_error[error] += n
        by_stage[stage] += n
        errors += n if counts_as_error else 0
    return InputAccounting(totals.num_inputs, written, rejected, errors, dict(by_error), dict(by_stage))


def build_metadata(spec: ConversionSpec, totals: RunTotals, *, run: Mapping[str, object],
                   library_versions: Mapping[str, str], reuse_source: Optional[str] = None) -> DatasetMetadata:
    splits = split_infos(spec, totals)
    inputs = input_accounting(totals, sum(info.num_examples for info in splits.values()))
    reused = sum(s.reused for s in totals.shards)
    return DatasetMetadata(
        splits=splits,
        features=(detection_feature_spec(spec.image, spec.features, spec.annotations.masks,
                                         spec.input.resolved_kind == "voc") if spec.input.detection
                  else feature_spec(spec.image, spec.features, spec.input.multi_label)),
        image=image_description(spec.image),
        compression=spec.output.compression,
        label_map=dict(totals.label_map),
        inputs=inputs,
        duplicates=totals.duplicates,
        error_files=tuple(totals.error_files),
        fingerprint=totals.fingerprint,
        pixel_fingerprint=pixel_fingerprint(spec, library_versions),
        config=json.loads(json.dumps(spec.to_dict())),  # as metadata.json holds it (lists, not tuples)
        # How many processes converted images (parts of one shard may be converted by several).
        run={**run, "converter_processes": len({c for shard in totals.shards for c in shard.converters}),
             "resumed_records": sum(shard.resumed for shard in totals.shards)},
        versions=dict(library_versions),
        reuse=ReuseSummary(reuse_source, reused, inputs.written - reused) if reuse_source else None,
        # COCO and VOC: objects written per class (label_counts count objects), and dropped by reason
        objects=ObjectAccounting(dict(sum((collections.Counter(info.label_counts) for info in splits.values()),
                                          collections.Counter())), dict(totals.objects_dropped))
        if spec.input.detection else None,
    )


def rejections_by_error(inputs: InputAccounting, errors_only: bool = False) -> str:
    """`ImageTooSmall: 60, CorruptImage: 2`, most frequent first: what a refusal names."""
    counted = collections.Counter({e: n for e, n in inputs.rejected_by_error.items()
                                   if is_error_class(e) or not errors_only})
    return ", ".join(f"{error}: {n}" for error, n in counted.most_common())


def _budget_that_passes(fraction: float) -> str:
    """The smallest budget in hundredths that `fraction` does not exceed (0.0164 → 0.02)."""
    budget = math.ceil(fraction * 100) / 100
    return "1" if budget >= 1 else f"{budget + (0.01 if budget < fraction else 0):.2f}"


def check_error_budget(metadata: DatasetMetadata, max_error_fraction: float, dead_letters: str) -> None:
    inputs = metadata.inputs
    if inputs.error_fraction > max_error_fraction:
        raise TooManyErrors(
            f"{inputs.errors} of {inputs.written + inputs.errors} images were rejected "
            f"({inputs.error_fraction:.2%} > max_error_fraction {max_error_fraction:.2%}; "
            f"{rejections_by_error(inputs, errors_only=True)}). Nothing was published; --max_error_fraction="
            f"{_budget_that_passes(inputs.error_fraction)}{'' if inputs.written else ' --allow_empty'} would accept "
            f"them. Dead letters: {dead_letters}")
