"""What an annotation file says about one image: its objects, on the stored pixel grid.

COCO (transforms/inputs/coco.py) and Pascal VOC (transforms/inputs/voc.py) both parse to these values; the
geometry (transforms/images/geometry.py, boxes.py, masks.py) and the record builder
(transforms/write/detection_example.py) read only these. Every object a check refuses is a
`Rejection` whose stage is `annotation`: the image keeps its other objects.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Callable, Iterable, Optional, Sequence, Union

from transforms.rejections import InputRejected, Rejection


class AnnotationRejected(InputRejected):
    """One object of an image cannot be written; the image keeps the others."""

    stage = "annotation"


class EmptyBox(AnnotationRejected):
    """Zero or negative width or height."""


class BoxOutsideImage(AnnotationRejected):
    """A box reaching past the image's edges (create_coco_tf_record.py drops these too)."""


class UnknownCategory(AnnotationRejected):
    """A category id (COCO) or class name (VOC) that the label map does not hold."""


class BadSegmentation(AnnotationRejected):
    """A polygon or RLE mask that cannot be read (only checked when masks are written)."""


class BoxCroppedAway(AnnotationRejected):
    """center_crop left less than the set fraction of the box in the image: by design, not an error."""


class AnnotationFileProblem(InputRejected):
    """An image the annotation file describes wrongly: listed twice, a bad size, a bad entry."""

    stage = "annotation"


class ImageListedTwice(AnnotationFileProblem):
    """Two listings of one image id or one file: which annotations belong to it is unknowable."""


class MissingImage(AnnotationFileProblem):
    """An annotation whose image the file does not list (or lists only in a refused entry)."""


class NoAnnotations(InputRejected):
    """An image without objects, skipped on request (kept by default): not an error."""

    stage = "annotation"


@dataclasses.dataclass(frozen=True)
class Polygons:
    """COCO polygons: flat (x0, y0, x1, y1, ...) lists, one per part, on the stored grid."""

    parts: tuple[tuple[float, ...], ...]


@dataclasses.dataclass(frozen=True)
class RunLengths:
    """A COCO RLE mask: column-major run lengths (starting with a run of 0s), either as COCO's
    compressed string or as a list of ints, for a `height x width` grid."""

    counts: Union[str, tuple[int, ...]]
    height: int
    width: int


Segmentation = Union[Polygons, RunLengths]


@dataclasses.dataclass(frozen=True)
class ObjectAnnotation:
    """One object: `box` is (x0, y0, x1, y1) on the stored grid, pixel edges at integers."""

    ref: str  # names it in drop reasons: "annotation 17", "object 2"
    box: tuple[float, float, float, float]
    label: int
    text: str
    is_crowd: int = 0
    area: float = 0.0  # on the stored grid: COCO's `area`, VOC: the box's
    segmentation: Optional[Segmentation] = None
    difficult: int = 0  # VOC
    truncated: int = 0  # VOC


@dataclasses.dataclass(frozen=True)
class AnnotatedImage:
    """An image file with its objects; `width x height` is the stored grid the file declares."""

    path: str
    source_id: str  # COCO: the image id as text; VOC: the file stem
    file_name: str
    width: int
    height: int
    objects: tuple[ObjectAnnotation, ...]


def finite_number(value: object) -> bool:
    """A JSON or XML number imgrec can use: not a bool, not NaN or infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def box_problem(box: tuple[float, float, float, float], width: int, height: int) -> Optional[AnnotationRejected]:
    """Why a box on a `width x height` grid cannot be written, or None."""
    x0, y0, x1, y1 = box
    # `:g`, but in full where it would round (x 50..80 cannot reach past an 80-wide image)
    shown = "box x {}..{}, y {}..{}".format(*(f"{v:g}" if float(f"{v:g}") == v else repr(float(v))
                                               for v in (x0, x1, y0, y1)))
    if not x1 > x0 or not y1 > y0:
        return EmptyBox(f"{shown} has no area")
    if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
        return BoxOutsideImage(f"{shown} reaches past the {width}x{height} image")
    return None


# The stage of a dead-letter row about one object or annotation entry, not about an input image:
# such rows are counted as objects dropped, apart from the images (pipeline/metadata.py).
OBJECT_STAGE = "object"


def object_row(place: str, problem: Exception) -> Rejection:
    """The dead-letter row of an object or annotation entry that is dropped while its image (if
    any) goes on."""
    return dataclasses.replace(Rejection.from_exception(place, problem), stage=OBJECT_STAGE)


def object_name(obj: ObjectAnnotation) -> str:
    """How a dead-letter message names an object: `annotation 17 ('square')`."""
    return f"{obj.ref} ({obj.text!r})" if obj.text else obj.ref


def object_rejection(path: str, obj: ObjectAnnotation, problem: AnnotationRejected) -> Rejection:
    """A dropped object's dead-letter row: the image's path, the object named in the message."""
    return object_row(path, type(problem)(f"{object_name(obj)}: {problem}"))


def dropped_with_image(objects: Iterable[ObjectAnnotation], image: Rejection) -> tuple[Rejection, ...]:
    """The dead-letter rows of the objects of an image rejected after discovery (unreadable, a
    size the file does not declare, a dropped duplicate, ...): one per object, under the image's
    reason, so objects written + dropped still equal the objects annotated."""
    return tuple(dataclasses.replace(image, stage=OBJECT_STAGE,
                                     message=f"{object_name(obj)}: dropped with its image: {image.message}")
                 for obj in objects)


def annotation_digest(image: Optional[AnnotatedImage]) -> str:
    """What the image's annotations say, as a short hash ("" for an image without any): part of
    the inputs' fingerprint and of a part's digest, so changed annotations convert again."""
    if image is None:
        return ""
    return hashlib.sha256(repr(image).encode("utf-8", "surrogateescape")).hexdigest()[:32]


def no_objects_reason(dropped: int, how: str = "annotations were dropped") -> str:
    """Why an image without objects is skipped: asked for, and how to get it written instead;
    `how` its objects went."""
    why = f"all {dropped} of its {how}" if dropped else "it has no annotations"
    return (f"image skipped: {why} (--keep_empty_images=false; pass --keep_empty_images to write it as an "
            "image without objects)")


def finished_image(image: AnnotatedImage, objects: Iterable[ObjectAnnotation],
                   labelled: Callable[[ObjectAnnotation], Optional[ObjectAnnotation]],
                   unknown: Callable[[ObjectAnnotation], str],
                   keep_empty: bool) -> tuple[Optional[AnnotatedImage], tuple[Rejection, ...]]:
    """The image with those of `objects` that `labelled` gives a label id and whose boxes fit
    it, and a rejection naming each other object (`unknown` says why its label is unknown). An
    image left without objects is kept (a negative example) or skipped as asked: a skipped one
    is a NoAnnotations rejection, so the counts still add up."""
    kept, rejected = [], []
    for obj in objects:
        known = labelled(obj)
        problem = UnknownCategory(unknown(obj)) if known is None else box_problem(known.box, image.width, image.height)
        if problem is None:
            kept.append(known)
        else:
            rejected.append(object_rejection(image.path, known or obj, problem))
    if not kept and not keep_empty:
        rejected.append(Rejection.from_exception(image.path, NoAnnotations(no_objects_reason(len(rejected)))))
        return None, tuple(rejected)
    return dataclasses.replace(image, objects=tuple(kept)), tuple(rejected)


def emptied_image(image: AnnotatedImage, kept: int, dropped: Sequence[Rejection],
                  keep_empty: bool) -> Optional[Rejection]:
    """The NoAnnotations row of an image that had objects and kept none once converted (a center
    crop cut them all off), when images without objects are skipped; None if it is written.
    `dropped` are its objects' rows, which count the objects: the image's row does not take
    them again (transforms/inputs/rejected_objects.py)."""
    if kept or not image.objects or keep_empty:
        return None
    errors = sorted({row.error for row in dropped})
    how = ("objects were cut off by the center crop" if errors == [BoxCroppedAway.__name__]
           else f"objects were dropped as it was converted ({', '.join(errors)})")
    return Rejection.from_exception(image.path, NoAnnotations(no_objects_reason(len(dropped), how)))
