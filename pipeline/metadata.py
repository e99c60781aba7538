"""metadata.json: what was written, how to parse it, and how every input was accounted for.

Built by pure functions from the pipeline's small summaries, so tests can check the counting
rules without running Beam.
"""
from __future__ import annotations

import collections
import platform
from typing import Iterable, Mapping, Sequence

import apache_beam as beam
import cv2
import numpy as np

from pipeline import __version__
from transforms.example import feature_spec
from transforms.specs import ConversionSpec

METADATA_FILE = "metadata.json"
FORMAT_VERSION = 1

# (split or None, stage, error class, counts as error) → how many inputs
RejectionCount = tuple[tuple[object, str, str, bool], int]


class CountMismatch(RuntimeError):
    """Inputs and outputs do not reconcile: a bug, never a data problem; the run must fail."""


class TooManyErrors(RuntimeError):
    pass


def versions() -> dict[str, str]:
    return {"imgrec": __version__, "apache_beam": beam.__version__, "opencv": cv2.__version__,
            "numpy": np.__version__, "python": platform.python_version()}


def build_metadata(spec: ConversionSpec, *, label_map: Mapping[str, int], shards: Sequence[dict],
                   planned_counts: Mapping[str, int], rejection_counts: Iterable[RejectionCount],
                   num_inputs: int, duplicates: Mapping[str, object], error_files: Sequence[str],
                   run: Mapping[str, object], fingerprint: str) -> dict:
    """`shards`: one dict per published file with split, file, num_examples, num_bytes, label_counts.

    Raises CountMismatch unless inputs = written + rejected, in total and for every split.
    """
    rejection_counts = list(rejection_counts)
    splits = {}
    for name in spec.splits.names:
        files = sorted((s for s in shards if s["split"] == name), key=lambda s: s["file"])
        label_counts: collections.Counter[str] = collections.Counter()
        for shard in files:
            label_counts.update(dict(shard["label_counts"]))
        written = sum(s["num_examples"] for s in files)
        rejected = sum(n for (split, *_), n in rejection_counts if split == name)
        planned = planned_counts.get(name, 0)
        if planned != written + rejected:
            raise CountMismatch(f"split {name}: {planned} planned != {written} written + {rejected} rejected")
        splits[name] = {
            "num_examples": written,
            "num_bytes": sum(s["num_bytes"] for s in files),
            "num_shards": len(files),
            "files": [s["file"] for s in files],
            "shard_lengths": [s["num_examples"] for s in files],
            "label_counts": dict(sorted(label_counts.items())),
            "rejected": rejected,
        }
    written = sum(split["num_examples"] for split in splits.values())
    rejected = sum(n for _, n in rejection_counts)
    if num_inputs != written + rejected:
        raise CountMismatch(f"{num_inputs} inputs != {written} written + {rejected} rejected")
    by_error: collections.Counter[str] = collections.Counter()
    by_stage: collections.Counter[str] = collections.Counter()
    errors = 0
    for (_, stage, error, counts_as_error), n in rejection_counts:
        by_error[error] += n
        by_stage[stage] += n
        errors += n if counts_as_error else 0
    return {
        "format_version": FORMAT_VERSION,
        "splits": splits,
        "features": feature_spec(spec.image, spec.features),
        "image": {"height": spec.image.height, "width": spec.image.width, "channels": 3,
                  "dtype": spec.image.dtype, "encoding": spec.image.encoding},
        "compression": spec.output.compression,
        "label_map": dict(sorted(label_map.items(), key=lambda item: item[1])),
        "inputs": {
            "total": num_inputs,
            "written": written,
            "rejected": rejected,
            "errors": errors,
            "error_fraction": errors / num_inputs if num_inputs else 0.0,
            "rejected_by_error": dict(sorted(by_error.items())),
            "rejected_by_stage": dict(sorted(by_stage.items())),
        },
        "duplicates": dict(duplicates),
        "error_files": list(error_files),
        "fingerprint": fingerprint,
        "config": spec.to_dict(),
        "run": dict(run),
        "versions": versions(),
    }


def check_error_fraction(metadata: Mapping, max_error_fraction: float, dead_letters: str) -> None:
    inputs = metadata["inputs"]
    if inputs["error_fraction"] > max_error_fraction:
        worst = ", ".join(f"{error}: {n}" for error, n in sorted(
            inputs["rejected_by_error"].items(), key=lambda item: -item[1]))
        raise TooManyErrors(
            f"{inputs['errors']} of {inputs['total']} inputs were rejected "
            f"({inputs['error_fraction']:.2%} > max_error_fraction {max_error_fraction:.2%}; {worst}). "
            f"Nothing was published. Dead letters: {dead_letters}")
