"""The driver's garbage collector, kept off the objects that live as long as the process.

Beam's, OpenCV's and NumPy's imports leave about 160,000 objects that live until the process
ends, and every full collection walks all of them. Frozen (`gc.freeze`), they are left out:
a 2,000-image run (benchmarks/corpus/2000, default settings) took 1.08x the CPU time of the run's
process tree without it (median of 5 interleaved rounds, 10.5 against 9.7 s). `pipeline.read.verify`
freezes TensorFlow's the same way, and `pipeline.interrupts.exit_quietly` everything before the exit.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def imports_frozen() -> Iterator[None]:
    """What exists when a run starts is out of the collector's reach while it goes on; a caller
    in the same process (a test) gets every object back in reach after it."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
