"""Entry point: `python -m pipeline.run --config=configs/local.yaml --input=... --output=...`."""
from __future__ import annotations

import datetime
import json
import logging
import sys
import uuid
from typing import Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.runners.runner import PipelineResult

from pipeline.convert import ConvertToTFRecords
from pipeline.metadata import METADATA_FILE
from pipeline.options import (ImgrecOptions, beam_args_from_config, build_spec, parse_config_flag,
                              read_config)
from pipeline.publish import new_staging_dir, prepare_output, read_json
from pipeline.summary import format_summary

_LOG = logging.getLogger("imgrec")


def run(argv: Optional[Sequence[str]] = None) -> PipelineResult:
    """Builds and runs the pipeline to completion; returns Beam's result."""
    argv = list(sys.argv[1:] if argv is None else argv)
    config = read_config(parse_config_flag(argv))
    options = ImgrecOptions(beam_args_from_config(config) + argv)
    spec = build_spec(config, options.view_as(ImgrecOptions))
    _LOG.info("effective config: %s", json.dumps(spec.to_dict(), sort_keys=True))
    prepare_output(spec.output.path, spec.output.overwrite)
    run_info = {"run_id": uuid.uuid4().hex,
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "runner": options.get_all_options()["runner"] or "DirectRunner"}
    pipeline = beam.Pipeline(options=options)
    _ = pipeline | "ConvertToTFRecords" >> ConvertToTFRecords(spec, new_staging_dir(spec.output.path), run_info)
    result = pipeline.run()
    result.wait_until_finish()
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    # Worker start-up chatter relayed by the DirectRunner's in-process job service.
    logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(logging.ERROR)
    argv = list(sys.argv[1:] if argv is None else argv)
    result = run(argv)
    if result.state != beam.runners.runner.PipelineState.DONE:
        _LOG.error("pipeline ended in state %s", result.state)
        return 1
    output = build_spec(read_config(parse_config_flag(argv)), ImgrecOptions(argv)).output.path
    print(format_summary(read_json(FileSystems.join(output, METADATA_FILE)), output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
