"""Entry point: `python -m pipeline.run --config=configs/local.yaml --input=... --output=...`.

Exit code 0 means a finished dataset is in the output (written now, or kept because nothing
changed); anything else is a failure, so schedulers can rely on it.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import sys
import uuid
from typing import Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import TestOptions
from apache_beam.runners.runner import PipelineResult, PipelineState

from pipeline.convert import ConvertToTFRecords
from pipeline.metadata import METADATA_FILE
from pipeline.options import (ImgrecOptions, beam_args_from_config, build_spec, parse_config_flag,
                              read_config)
from pipeline.publish import new_staging_dir, prepare_output, read_json
from pipeline.summary import format_summary
from transforms.specs import ConversionSpec

_LOG = logging.getLogger("imgrec")


def expand_output_template(path: str, now: datetime.datetime) -> str:
    """`{date}` → 2026-12-02 and `{timestamp}` → 20261202T131500 (UTC), for scheduled runs."""
    return path.format(date=now.strftime("%Y-%m-%d"), timestamp=now.strftime("%Y%m%dT%H%M%S"))


@dataclasses.dataclass(frozen=True)
class Conversion:
    result: PipelineResult
    spec: ConversionSpec
    run_id: str
    dry_run: bool = False


def convert(argv: Sequence[str]) -> Conversion:
    """Builds the pipeline from config + flags, runs it to completion."""
    config = read_config(parse_config_flag(argv))
    options = ImgrecOptions(beam_args_from_config(config) + list(argv))
    spec = build_spec(config, options.view_as(ImgrecOptions))
    started = datetime.datetime.now(datetime.timezone.utc)
    spec = dataclasses.replace(spec, output=dataclasses.replace(
        spec.output, path=expand_output_template(spec.output.path, started)))
    _LOG.info("effective config: %s", json.dumps(spec.to_dict(), sort_keys=True))
    pipeline = beam.Pipeline(options=options)
    # DataflowRunner --dry_run=True only builds the job: leave the output (maybe gs://) alone.
    dry_run = bool(options.view_as(TestOptions).dry_run) and type(pipeline.runner).__name__ == "DataflowRunner"
    previous_fingerprint = None if dry_run else prepare_output(
        spec.output.path, spec.output.overwrite, spec.output.skip_unchanged)
    run_info = {"run_id": uuid.uuid4().hex, "started": started.isoformat(timespec="seconds"),
                "runner": options.get_all_options()["runner"] or "DirectRunner"}
    _ = pipeline | "ConvertToTFRecords" >> ConvertToTFRecords(
        spec, new_staging_dir(spec.output.path), run_info, previous_fingerprint)
    result = pipeline.run()
    result.wait_until_finish()
    return Conversion(result, spec, run_info["run_id"], dry_run)


def run(argv: Optional[Sequence[str]] = None) -> PipelineResult:
    """Runs the conversion to completion and returns Beam's result."""
    return convert(list(sys.argv[1:] if argv is None else argv)).result


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    # Worker start-up chatter relayed by the DirectRunner's in-process job service.
    logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(logging.ERROR)
    conversion = convert(list(sys.argv[1:] if argv is None else argv))
    if conversion.result.state != PipelineState.DONE:
        _LOG.error("pipeline ended in state %s", conversion.result.state)
        return 1
    output = conversion.spec.output.path
    if conversion.dry_run:
        print(f"dry run: built the Dataflow job for {output}; nothing was staged, submitted or written")
        return 0
    metadata = read_json(FileSystems.join(output, METADATA_FILE))
    if metadata["run"]["run_id"] != conversion.run_id:
        print(f"unchanged: inputs and config match the dataset in {output} "
              f"(written by run {metadata['run']['run_id']} at {metadata['run']['started']}); kept it")
        return 0
    print(format_summary(metadata, output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
