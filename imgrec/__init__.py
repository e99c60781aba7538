"""imgrec: image files and labels → sharded TFRecords of `tf.train.Example`, with Apache Beam; and back.

    import imgrec

    done = imgrec.convert("photos/", "datasets/photos", height=160, overwrite=True)
    train = imgrec.load_dataset("datasets/photos", "train", batch_size=32)
    assert imgrec.verify("datasets/photos")

`convert` takes the command line's settings as keyword arguments (`--resize_mode=pad` is
`resize_mode="pad"`, a switch is `True`, a list is a list), Beam options included. Attributes
load on first use, so a training job that only reads (`load_dataset`) imports TensorFlow but
neither Beam nor OpenCV.
"""
from __future__ import annotations

import importlib
from typing import Any

from pipeline import __version__

_EXPORTS = {
    "convert": "imgrec.api",
    "verify": "imgrec.api",
    "load_dataset": "pipeline.read.reader",
    "read_metadata": "pipeline.read.reader",
    "export_tfds": "imgrec.api",
    "ImgrecError": "pipeline.errors",
    "UsageError": "pipeline.errors",
    "RunFailed": "pipeline.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'imgrec' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)
