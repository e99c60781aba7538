"""The objects of annotated images rejected after discovery, as dead-letter rows of their own.

An image read, planned or converted and then rejected (unreadable, `SizeMismatch`, too large, a
dropped duplicate, undecodable) takes its objects with it. Only the image's row names the
reason; this step joins those rows with the discovered images' objects by path, so every
object annotated is either written or dropped with a reason (transforms/inputs/annotations.py
`dropped_with_image`), and metadata's `objects` reconciles with the annotation file.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator

import apache_beam as beam

from transforms.inputs.annotations import OBJECT_STAGE, NoAnnotations, ObjectAnnotation, dropped_with_image
from transforms.refs import Batch
from transforms.rejections import Rejection


def objects_by_path(batch: Batch) -> Iterator[tuple[str, tuple[ObjectAnnotation, ...]]]:
    """A batch of discovered Candidates → (path, its objects) for each image that has some;
    segmentations are left behind: the rows only name the objects."""
    for candidate in batch:
        objects = candidate.annotations.objects if candidate.annotations is not None else ()
        if objects:
            yield candidate.path, tuple(dataclasses.replace(obj, segmentation=None) for obj in objects)


def takes_its_objects(rejection: Rejection) -> bool:
    """Whether a rejection is an image's whose objects go with it. An image skipped for having
    no objects left (`emptied_image`) had each object dropped with its own row already."""
    return rejection.stage != OBJECT_STAGE and rejection.error != NoAnnotations.__name__


def rows_of_rejected(element: tuple[str, dict[str, Iterable]]) -> Iterator[Rejection]:
    """One path's objects and rejections → its objects' rows (none unless it was rejected). An
    image is rejected once, so its objects are dropped once."""
    _, grouped = element
    rejection = next(iter(grouped["rejected"]), None)
    if rejection is not None:
        for objects in grouped["objects"]:
            yield from dropped_with_image(objects, rejection)


class ObjectsOfRejectedImages(beam.PTransform):
    """(batches of Candidate, Rejection) → a Rejection of stage "object" per object of each
    rejected image."""

    def expand(self, inputs) -> beam.PCollection:
        candidates, rejected = inputs
        objects = candidates | "ObjectsByPath" >> beam.FlatMap(objects_by_path)
        images = (rejected
                  | "ImageRejections" >> beam.Filter(takes_its_objects)
                  | "ByPath" >> beam.Map(lambda r: (r.path, r)))
        return ({"objects": objects, "rejected": images}
                | "JoinOnPath" >> beam.CoGroupByKey()
                | "ObjectRows" >> beam.FlatMap(rows_of_rejected))
