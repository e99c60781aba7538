"""The small values that flow between the pipeline's steps: references to images, never pixels.

Beam-free, so the processes that convert images can unpickle them without importing Beam.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Union

from transforms.dataset_format import RecordLocation
from transforms.images.image_header import ImageHeader
from transforms.inputs.annotations import AnnotatedImage


class Batch(tuple):
    """References that travel together (transforms/batches.py), encoded by Beam in one piece.

    Beam's default coder writes a plain tuple item by item and pickles each dataclass in it
    separately: ~20 µs per reference at every stage boundary, in the driver. A tuple of its own
    type is pickled whole, sharing the class references: a sixth of that.
    """

    __slots__ = ()


@dataclasses.dataclass(frozen=True)
class Candidate:
    """An input file and its label text, before anything is read; a COCO or VOC image carries
    its objects (label text "": it has no image-level class)."""

    path: str
    label: str
    annotations: Optional[AnnotatedImage] = None


@dataclasses.dataclass(frozen=True)
class SourceImage:
    """A readable image file: where it is, its label text, what it holds, and what its header
    says (read once, by the first pass; the conversion decodes with it)."""

    path: str
    label: str
    content_hash: str
    header: ImageHeader
    annotations: Optional[AnnotatedImage] = None  # a COCO or VOC image's objects, on the stored grid


@dataclasses.dataclass(frozen=True)
class PlannedImage:
    """An image with everything decided except its pixels: label id and split."""

    source: SourceImage
    label_id: Union[int, tuple[int, ...]]  # a multi-label image's: one per label
    split: str
    reuse: Optional[RecordLocation] = None  # the same content's record in a previous dataset
