"""How every input was accounted for: counts, dead letters and duplicate reports, as labelled
composites the conversion applies to its rejections and plan."""
from __future__ import annotations

from typing import Sequence

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsList

from pipeline.metadata import RejectionKey
from transforms.assign import DuplicateGroup
from transforms.dataset_format import (
    ERRORS_PREFIX,
    ERRORS_SUFFIX,
    DuplicateSummary,
    join,
)
from transforms.rejections import Rejection

DUPLICATE_EXAMPLES = 100  # duplicate groups listed in metadata.json
DEAD_LETTERS_FILE = f"{ERRORS_PREFIX}-00000-of-00001{ERRORS_SUFFIX}"


def rejection_key(rejection: Rejection) -> RejectionKey:
    Metrics.counter("imgrec", f"rejected_{rejection.error}").inc()
    return rejection.split, rejection.stage, rejection.error, rejection.counts_as_error


class CountRejections(beam.PTransform):
    """Rejection → (key, count) per (split, stage, error class, counts as error); a Beam counter
    per error class."""

    def expand(self, rejected: beam.PCollection) -> beam.PCollection:
        return (rejected
                | "RejectionKey" >> beam.Map(rejection_key)
                | "CountPerKey" >> beam.combiners.Count.PerElement())


def write_dead_letters(rows: Sequence[str], directory: str) -> str:
    """One file, rows sorted, so dead letters are byte-identical on every runner."""
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(join(directory, DEAD_LETTERS_FILE)) as handle:
        handle.write("".join(f"{row}\n" for row in sorted(rows)).encode("utf-8"))
    return DEAD_LETTERS_FILE


class WriteDeadLetters(beam.PTransform):
    """Rejection → the dead-letter file name (one JSON object per line), written to `directory`."""

    def __init__(self, directory: str):
        super().__init__()
        self._directory = directory

    def expand(self, rejected: beam.PCollection) -> beam.PCollection:
        return (rejected
                | "ToJson" >> beam.Map(Rejection.to_json)
                | "AllRows" >> beam.combiners.ToList()
                | "WriteFile" >> beam.Map(write_dead_letters, self._directory))


def summarize_duplicates(groups: Sequence[DuplicateGroup], extra_copies: int, num_groups: int,
                         dropped: bool) -> DuplicateSummary:
    examples = tuple({"sha256": g.content_hash, "paths": list(g.paths), "labels": list(g.labels)} for g in groups)
    return DuplicateSummary(num_groups, extra_copies, dropped, examples)


class SummarizeDuplicates(beam.PTransform):
    """DuplicateGroup → one DuplicateSummary: totals and the first groups by hash."""

    def __init__(self, dropped: bool):
        super().__init__()
        self._dropped = dropped

    def expand(self, groups: beam.PCollection) -> beam.PCollection:
        dropped = self._dropped
        counts = (groups
                  | "CopiesPerGroup" >> beam.Map(lambda g: (1, len(g.paths) - 1))
                  | "SumCopies" >> beam.CombineGlobally(lambda pairs: tuple(map(sum, zip((0, 0), *pairs)))))
        examples = groups | "FirstGroups" >> beam.combiners.Top.Of(
            DUPLICATE_EXAMPLES, key=lambda g: g.content_hash, reverse=True)
        return (groups.pipeline
                | "Once" >> beam.Create([None])
                | "Summary" >> beam.Map(
                    lambda _, c, e: summarize_duplicates(e[0] if e else [], c[0][1] if c else 0,
                                                         c[0][0] if c else 0, dropped),
                    AsList(counts), AsList(examples)))
