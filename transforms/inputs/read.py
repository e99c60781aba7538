"""The first pass as a DoFn: every batch of candidates read, hashed and header-checked
(transforms/inputs/source.py) on a few threads or the converter processes."""
from __future__ import annotations

from typing import Optional

import apache_beam as beam
from apache_beam.metrics import Metrics

from transforms.images.limits import Converter
from transforms.inputs.discover import REJECTED
from transforms.inputs.source import read_batch
from transforms.refs import Candidate
from transforms.specs import ImageSpec
from transforms.write.concurrency import InflightDoFn

READ_THREADS = 4  # reading and hashing release the GIL


class ReadAndCheck(InflightDoFn):
    """Batches of Candidate → batches of SourceImage, and a Rejection for each input that is not
    a readable image, naming the file and the reason.

    With `processes` (runners that execute every step in one process) the batches go to the
    converter processes, which sit idle until the conversion starts; else to a few threads.
    Either way this first pass keeps the cores busy.
    """

    def __init__(self, spec: ImageSpec, max_file_bytes: int, processes: int = 0,
                 converter: Optional[Converter] = None):
        self._converter = converter or Converter.for_spec(spec)
        super().__init__(processes or READ_THREADS, processes=processes > 0, initializer=self._converter)
        self._spec, self._max_file_bytes = spec, max_file_bytes
        self._read = Metrics.counter("imgrec", "files_read")

    def task(self, batch: tuple[Candidate, ...]):
        return read_batch, (batch, self._spec, self._max_file_bytes)

    def setup(self) -> None:
        super().setup()
        self._converter.filesystems.use()  # for the batches read on threads, in this worker

    def emit(self, batch: tuple[Candidate, ...], result):
        images, rejections = result
        self._read.inc(len(images))
        for rejection in rejections:
            yield beam.pvalue.TaggedOutput(REJECTED, rejection)
        if images:
            yield images
