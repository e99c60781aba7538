"""COCO instances JSON: categories, images and annotations, streamed; one image id's rows → an
`AnnotatedImage` and the rejections of whatever in them cannot be written.

The file is read in one pass of ijson events and each element of `categories`, `images` and
`annotations` is built on its own, so memory holds one element at a time (at most
`MAX_ELEMENT_VALUES` numbers and strings, `MAX_DEPTH` levels deep: a larger one is a rejection,
its events skipped), not the file: COCO's train2017 instances file is 448 MB of JSON, several GB
as Python objects. What groups the rows by image id is the caller's: the pipeline's GroupByKey,
or `annotated_images` in memory for small files. A file that is not JSON, or whose categories cannot be a label map,
is an `AnnotationFileError` (a usage error); a bad image or annotation entry is a rejection
naming its place in the file (`ann/instances.json#annotations[17]`).
"""
from __future__ import annotations

import codecs
import collections
import contextlib
import dataclasses
import posixpath
from typing import BinaryIO, Iterable, Iterator, Mapping, Optional, Union

import ijson

from transforms import files
from transforms.batches import split_by
from transforms.inputs.annotations import (
    AnnotatedImage,
    AnnotationFileProblem,
    BadSegmentation,
    ImageListedTwice,
    MissingImage,
    ObjectAnnotation,
    Polygons,
    RunLengths,
    Segmentation,
    finished_image,
    finite_number,
    object_row,
)
from transforms.inputs.manifests import resolve_path
from transforms.rejections import InputRejected, Rejection

# Numbers and strings in one element: a crowd's uncompressed RLE of a 4000x3000 photo has at
# most 12 M runs, real ones a few thousand; 4 M values take ~200 MB as Python objects.
MAX_ELEMENT_VALUES = 4 * 2**20
MAX_DEPTH = 16  # the file's levels an element may reach: a polygon's numbers are at 5 (root, array, element, ...)


class AnnotationFileError(ValueError):
    """The annotation file cannot be read as COCO: not JSON, or categories that are no label map."""


class ElementTooLarge(AnnotationFileProblem):
    """An element with more than MAX_ELEMENT_VALUES values, or nested past MAX_DEPTH: skipped, not built."""


@dataclasses.dataclass(frozen=True)
class CocoImage:
    id: int
    file_name: str
    width: int
    height: int
    path: str  # the file, resolved


@dataclasses.dataclass(frozen=True)
class CocoAnnotation:
    """An annotation entry; its object's `label` is the category id, its `text` filled in when joined."""

    image_id: int
    place: str  # where in the file: "ann/instances.json#annotations[17]"
    obj: ObjectAnnotation
    # Its position in `annotations`: an image's objects keep the file's order, as in the scripts (a
    # stable sort: entries made without one keep the order they come in).
    index: int = 0


CocoRow = Union[CocoImage, CocoAnnotation, Rejection]


def coco_elements(path: str, arrays: tuple[str, ...] = ("images", "annotations")) -> Iterator[tuple[str, int, object]]:
    """(array name, index, element) for each element of the top-level `arrays`, in file order; an
    element over the size limit, or nested deeper than MAX_DEPTH, comes as an ElementTooLarge.
    From ijson.basic_parse's events: ijson.parse's prefixes keep a string per open level, memory
    growing with the square of the nesting (a 600 kB annotation of brackets took 24 GB)."""
    counts: collections.Counter = collections.Counter()
    with open_coco(path) as handle:
        depth, key, name, builder = 0, None, None, None  # open containers, top-level key, its array
        for event, value in ijson.basic_parse(handle, use_float=True):
            if event == "start_map" or event == "start_array":
                depth += 1
                if depth == 3 and name is not None:  # an element begins
                    builder, values, problem, index = ijson.ObjectBuilder(), 0, None, counts[name]
                    counts[name] += 1
                elif depth == 2:
                    name = key if event == "start_array" and key in arrays else None
            elif event == "end_map" or event == "end_array":
                depth -= 1
            elif depth == 1 and event == "map_key":
                key = value
            elif depth == 2 and name is not None:  # a bare number or string where an object belongs
                counts[name] += 1
                yield name, counts[name] - 1, value
            if builder is not None:
                values += 1
                if problem is None and (values > MAX_ELEMENT_VALUES or depth > MAX_DEPTH):
                    problem = (f"holds more than {MAX_ELEMENT_VALUES} values" if values > MAX_ELEMENT_VALUES
                               else f"nests deeper than {MAX_DEPTH} levels")  # the rest is skipped
                if problem is None:
                    builder.event(event, value)
                if depth == 2:  # the element's end
                    yield name, index, (builder.value if problem is None
                                        else ElementTooLarge(f"{name}[{index}] {problem}"))
                    builder = None


@contextlib.contextmanager
def open_coco(path: str) -> Iterator[BinaryIO]:
    """The file open for parsing; a read or parse error becomes an AnnotationFileError, in one
    line (yajl's message goes on to show the text and a caret under it on two more lines). A
    UTF-8 BOM (Windows editors save one) is skipped, as manifests skip it."""
    try:
        with files.open_read(path) as handle:
            if handle.read(3) != codecs.BOM_UTF8:
                handle.seek(0)
            yield handle
    except ijson.JSONError as exc:  # yajl's message is bytes when it quotes bytes that are not UTF-8
        text = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        first = (text.strip().splitlines() or [type(exc).__name__])[0]
        raise AnnotationFileError(f"{path} is not valid JSON: {first}") from None
    except OSError as exc:
        raise AnnotationFileError(f"cannot read {path}: {exc}") from None


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def coco_category(element: object, index: int) -> tuple[int, str]:
    """A category → (id, name). Ids are kept as the labels (Model Garden's COCO configs expect
    them); 0 is the background class of TF's detectors, so ids start at 1."""
    if not isinstance(element, dict) or not _integer(element.get("id")) or not isinstance(element.get("name"), str) \
            or not element["name"].strip():
        raise AnnotationFileError(f"categories[{index}] must have an integer id and a name; got {element!r:.200}")
    if element["id"] < 1:
        raise AnnotationFileError(f"categories[{index}] has id {element['id']}: ids start at 1 (0 is the background "
                                  "class of TF's detectors)")
    return element["id"], element["name"].strip()


def coco_label_map(path: str) -> dict[str, int]:
    """The file's categories as {name: id}, refusing what would make names and ids ambiguous.
    Only `categories` is built; the rest of the file is parsed past, as the workers parse it
    (floats: 1e999 is an error there, as for `coco_elements`)."""
    categories = [coco_category(element, index) for _, index, element in coco_elements(path, ("categories",))]
    by_id: dict[int, str] = {}
    by_name: dict[str, int] = {}
    for category_id, name in categories:
        if by_id.setdefault(category_id, name) != name:
            raise AnnotationFileError(f"category id {category_id} is named both {by_id[category_id]!r} and {name!r}")
        if by_name.setdefault(name, category_id) != category_id:
            raise AnnotationFileError(f"category name {name!r} has ids {by_name[name]} and {category_id}")
    if not by_name:
        raise AnnotationFileError("the file lists no categories")
    return by_name


def coco_image(element: dict, place: str, annotation_file: str, images_root: Optional[str]) -> CocoImage:
    image_id, file_name = element.get("id"), element.get("file_name")
    width, height = element.get("width"), element.get("height")
    if not _integer(image_id) or not isinstance(file_name, str) or not file_name or "\0" in file_name:
        raise AnnotationFileProblem(f"{place} needs an integer id and a file_name; got {element!r:.200}")
    if not (_integer(width) and _integer(height) and width > 0 and height > 0):
        raise AnnotationFileProblem(f"{place} (id {image_id}) needs a positive integer width and height; "
                                    f"got {width!r} x {height!r}")
    # A file_name resolves against the annotation file's folder, or `images_root` if given
    # (resolve_path takes a file whose folder relative names are resolved against).
    relative_to = annotation_file if images_root is None else posixpath.join(images_root, "")
    return CocoImage(image_id, file_name, width, height, resolve_path(file_name, relative_to))


def coco_segmentation(value: object) -> Optional[Segmentation]:
    """Polygons (a list of flat point lists) or an RLE ({"size": [h, w], "counts": str | [int]})."""
    if value in (None, []):
        return None
    if isinstance(value, list) and all(isinstance(part, list) for part in value):
        return Polygons(tuple(tuple(part) for part in value))
    if isinstance(value, dict):
        size, counts = value.get("size"), value.get("counts")
        if isinstance(size, list) and len(size) == 2 and all(_integer(v) and v > 0 for v in size):
            if isinstance(counts, str):
                return RunLengths(counts, size[0], size[1])
            if isinstance(counts, list) and all(_integer(v) for v in counts):
                return RunLengths(tuple(counts), size[0], size[1])
    raise BadSegmentation(f"segmentation is neither polygons nor an RLE: {value!r:.200}")


def coco_annotation(element: dict, place: str, with_masks: bool, index: int) -> CocoAnnotation:
    """An annotation entry; `segmentation` is read only when masks are written."""
    ref = f"annotation {element['id']}" if _integer(element.get("id")) else place
    image_id, category_id, bbox = element.get("image_id"), element.get("category_id"), element.get("bbox")
    if not _integer(image_id) or not _integer(category_id):
        raise AnnotationFileProblem(f"{ref} needs an integer image_id and category_id; got {element!r:.200}")
    if not isinstance(bbox, list) or len(bbox) != 4 or not all(finite_number(v) for v in bbox):
        raise AnnotationFileProblem(f"{ref} (image {image_id}) needs a bbox of 4 numbers [x, y, width, height]; "
                                    f"got {bbox!r:.200}")
    crowd, area = element.get("iscrowd", 0), element.get("area", bbox[2] * bbox[3])
    if crowd not in (0, 1) or isinstance(crowd, bool) or not finite_number(area) or area < 0:
        raise AnnotationFileProblem(f"{ref} (image {image_id}) needs iscrowd 0 or 1 and a non-negative area; "
                                    f"got {crowd!r}, {area!r}")
    x, y, w, h = (float(v) for v in bbox)
    try:
        segmentation = coco_segmentation(element.get("segmentation")) if with_masks else None
    except BadSegmentation as exc:
        raise BadSegmentation(f"{ref} (image {image_id}): {exc}") from None
    return CocoAnnotation(image_id, place, ObjectAnnotation(ref, (x, y, x + w, y + h), category_id, "", crowd,
                                                            float(area), segmentation), index)


def coco_rows(path: str, images_root: Optional[str] = None, with_masks: bool = False) -> Iterator[CocoRow]:
    """Every image and annotation entry of the file as a CocoImage, a CocoAnnotation, or the
    Rejection of an entry that is neither (categories are `coco_label_map`'s)."""
    for array, index, element in coco_elements(path):
        place = f"{path}#{array}[{index}]"
        try:
            if isinstance(element, InputRejected):
                raise element
            if not isinstance(element, dict):
                raise AnnotationFileProblem(f"{place} is not an object: {element!r:.200}")
            elif array == "images":
                yield coco_image(element, place, path, images_root)
            else:
                yield coco_annotation(element, place, with_masks, index)
        except InputRejected as exc:  # an annotation entry is an object dropped, an image entry an input refused.
            yield (object_row if array == "annotations" else Rejection.from_exception)(place, exc)


def one_listing_per_file(listings: Iterable[CocoImage]) -> tuple[Optional[CocoImage], tuple[Rejection, ...]]:
    """One file's listings: two (under two ids, or the same id twice) leave which annotations
    belong to it unknowable, so every listing is refused."""
    listings = sorted(listings, key=lambda image: image.id)
    if len(listings) == 1:
        return listings[0], ()
    ids, names = sorted({image.id for image in listings}), sorted({image.file_name for image in listings})

    def why(image: CocoImage) -> str:
        if len(ids) == 1:
            return f"image id {image.id} is listed {len(listings)} times ({', '.join(names)})"
        return f"{image.file_name} is listed {len(listings)} times (image ids {', '.join(map(str, ids))})"
    return None, tuple(Rejection.from_exception(image.path, ImageListedTwice(why(image))) for image in listings)


def orphans(annotations: Iterable[CocoAnnotation], problem: type[AnnotationFileProblem],
            why: str) -> tuple[Rejection, ...]:
    """The rejections of annotations whose image is missing or refused."""
    return tuple(object_row(a.place, problem(f"{a.obj.ref} refers to image id {a.image_id}, {why}"))
                 for a in annotations)


def file_listings(listings: Iterable[CocoImage]) -> tuple[list[tuple[int, tuple[str, CocoImage]]],
                                                         tuple[Rejection, ...]]:
    """One file's listings → (image id, ("image", listing)), or ("refused", listing) for each
    listing of a file listed twice, and their rejections."""
    listings = list(listings)
    _, refused = one_listing_per_file(listings)
    kind = "refused" if refused else "image"
    return [(listing.id, (kind, listing)) for listing in listings], refused


def image_of_id(listings: Iterable[tuple[str, CocoImage]], annotations: Iterable[CocoAnnotation],
                names: Mapping[int, str], keep_empty: bool) -> tuple[Optional[AnnotatedImage], tuple[Rejection, ...]]:
    """One image id's `file_listings` and annotations → the image with its objects (or None), and
    the rejections: the image listed twice, annotations without an image (or whose file was
    refused), unknown categories, boxes that do not fit the image."""
    listings, annotations = list(listings), list(annotations)
    images = [listing for kind, listing in listings if kind == "image"]
    dropped: tuple[Rejection, ...] = ()
    if len(images) < len(listings):  # a file of this id is listed twice: its annotations are dropped as such
        dropped, annotations = orphans(annotations, ImageListedTwice, "whose file is listed twice"), []
    annotations.sort(key=lambda a: a.index)
    if not images:
        return None, (*dropped, *orphans(annotations, MissingImage,
                                         "which the file does not list in a usable images entry"))
    image, refused = one_listing_per_file(images)
    if image is None:
        return None, (*dropped, *refused, *orphans(annotations, ImageListedTwice, "which is listed twice"))

    def labelled(obj: ObjectAnnotation) -> Optional[ObjectAnnotation]:
        return dataclasses.replace(obj, text=names[obj.label]) if obj.label in names else None

    found, rejections = finished_image(
        AnnotatedImage(image.path, str(image.id), image.file_name, image.width, image.height, ()),
        (a.obj for a in annotations), labelled,
        lambda obj: f"category id {obj.label} is not one of the label map's {len(names)} categories",
        keep_empty)
    return found, (*dropped, *rejections)


def annotated_images(path: str, images_root: Optional[str] = None, with_masks: bool = False,
                     keep_empty: bool = True) -> tuple[dict[str, int], list[AnnotatedImage], list[Rejection]]:
    """The whole file grouped in memory: (label map, images, rejections), for small files (tests,
    the sample); the pipeline groups `coco_rows` by image id instead."""
    label_map = coco_label_map(path)
    rows = list(coco_rows(path, images_root, with_masks))
    rejections = [row for row in rows if isinstance(row, Rejection)]
    annotations = split_by((row for row in rows if isinstance(row, CocoAnnotation)), lambda row: row.image_id)
    by_id = collections.defaultdict(list)
    for listings in split_by((row for row in rows if isinstance(row, CocoImage)), lambda row: row.path).values():
        keyed, refused = file_listings(listings)
        rejections += refused
        for image_id, listing in keyed:
            by_id[image_id].append(listing)
    names = {category_id: name for name, category_id in label_map.items()}
    found = [image_of_id(by_id.get(image_id, ()), annotations.get(image_id, ()), names, keep_empty)
             for image_id in sorted(by_id.keys() | annotations.keys())]
    rejections += [rejection for _, refused in found for rejection in refused]
    return label_map, [image for image, _ in found if image is not None], rejections


COCO_KEYS = ("info", "licenses", "images", "annotations", "categories", "type")  # "type": older exports


def looks_like_coco(path: str) -> bool:
    """Whether a `.json` file's top level is an object whose first key is one of COCO's (a JSON
    manifest of image records is not): read with ijson up to that key, not the whole file."""
    try:
        with open_coco(path) as handle:
            events = ijson.basic_parse(handle)  # without ijson.parse's prefixes (coco_elements)
            first, second = next(events, None), next(events, None)
    except Exception:  # unreadable or not JSON: not COCO; the input check says what is wrong
        return False
    return first == ("start_map", None) and second is not None and second[0] == "map_key" and second[1] in COCO_KEYS
