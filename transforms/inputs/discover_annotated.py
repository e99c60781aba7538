"""Discover the images of a COCO instances file or a Pascal VOC folder, with their objects.

The annotation parsing is transforms/inputs/coco.py's and transforms/inputs/voc.py's; here it becomes Beam
steps whose output is what `DiscoverImages` gives for class folders: batches of `Candidate`s
(each carrying its `AnnotatedImage`, label text "") and rejections, plus the label map itself.

COCO: one worker streams the file (JSON cannot be split), images are grouped by file (a file
listed twice is refused), then images and annotations by image id. The label map is the
file's categories, ids kept, read by the driver before the pipeline (`coco_categories`), so a
bad category is a usage error. VOC: every `Annotations/*.xml` (any case) is parsed on the workers, and an image two
files name is refused; the label map is the distinct class names of every file, ids 1..N in
sorted order (or `class_names`' order).
"""
from __future__ import annotations

import functools
import posixpath
from typing import Iterable, Mapping, Optional

import apache_beam as beam

from transforms import files
from transforms.batches import BATCH
from transforms.inputs.annotations import AnnotatedImage, AnnotationFileProblem
from transforms.inputs.coco import (
    AnnotationFileError,
    CocoAnnotation,
    CocoImage,
    coco_label_map,
    coco_rows,
    file_listings,
    image_of_id,
)
from transforms.inputs.discover import REJECTED, reject, skip_reason
from transforms.inputs.voc import (
    ANNOTATIONS,
    MAX_XML_BYTES,
    labelled_voc_image,
    one_annotation_file_per_image,
    parse_voc,
    voc_image_path,
    voc_label_map,
)
from transforms.plan.assign import distinct
from transforms.refs import Batch, Candidate
from transforms.rejections import InputRejected, Rejection, SkippedFile
from transforms.specs import InputSpec

LABEL_MAP = "label_map"


@functools.lru_cache(maxsize=4)
def coco_categories(path: str, class_names: Optional[tuple[str, ...]] = None) -> dict[str, int]:
    """The COCO file's label map {name: category id}, read by the driver (only `categories` is
    built; the rest of the file is parsed past). `class_names` keeps those classes, with their
    ids; a name the file lacks is an AnnotationFileError."""
    label_map = coco_label_map(path)
    if not class_names:
        return label_map
    missing = [name for name in class_names if name not in label_map]
    if missing:
        raise AnnotationFileError(f"class_names {missing} are not categories of {path}; it has "
                                  f"{', '.join(sorted(label_map))}")
    return {name: label_map[name] for name in class_names}


def read_coco(path: str, images_root: Optional[str], with_masks: bool):
    """The file → annotations keyed by image id (main), images keyed by file ("images"), and the
    rejections of entries that are neither."""
    for row in coco_rows(path, images_root, with_masks):
        if isinstance(row, CocoAnnotation):
            yield row.image_id, row
        elif isinstance(row, CocoImage):
            yield beam.pvalue.TaggedOutput("images", (row.path, row))
        elif isinstance(row, Rejection):
            yield beam.pvalue.TaggedOutput(REJECTED, row)


def one_file(element: tuple[str, Iterable[CocoImage]]):
    """One file's listings keyed by image id (`file_listings`), and their rejections."""
    keyed, refused = file_listings(element[1])
    yield from _tagged(refused)
    yield from keyed


def category_names(label_map: Mapping[str, int]) -> dict[int, str]:
    """A COCO label map {name: category id} → {category id: name}: made once, when the pipeline
    is built, and shipped with `coco_image` to each worker."""
    return {category_id: name for name, category_id in label_map.items()}


def coco_image(element: tuple[int, dict], names: Mapping[int, str], keep_empty: bool):
    """One image id's listings and annotations → a Candidate and the rejections (`image_of_id`).
    `names`: category_names."""
    _, grouped = element
    yield from _found(*image_of_id(grouped["listings"], grouped["annotations"], names, keep_empty))


def _found(image: Optional[AnnotatedImage], rejections: Iterable[Rejection]):
    """An image with its objects, if it is kept, as a Candidate (label text ""), and its rejections."""
    yield from _tagged(rejections)
    if image is not None:
        yield Candidate(image.path, "", image)


def _tagged(rejections: Iterable[Rejection]):
    return (beam.pvalue.TaggedOutput(REJECTED, rejection) for rejection in rejections)


def voc_files(root: str) -> list[str]:
    """The files in the folder's `Annotations/` and below, in name order (the root taken
    literally): each an input, converted or skipped (`parse_voc_file`). On a store through
    imgrec's S3 client, so a store gone away fails at once; locally through Beam's match."""
    from transforms import object_stores

    folder = posixpath.join(root, ANNOTATIONS)
    return sorted(path for path in object_stores.objects_under(folder) if not path.endswith("/"))


def parse_voc_file(xml_path: str):
    """One XML file → (its image, its class names) and its malformed objects' rows, or the
    rejection of the image it names."""
    name = posixpath.basename(xml_path)
    stem = posixpath.splitext(name)[0]
    skipped = (f"in a folder inside {ANNOTATIONS}/, which VOC does not nest: not read"
               if posixpath.basename(posixpath.dirname(xml_path)) != ANNOTATIONS
               else skip_reason(name, (".xml",), "an annotation"))  # as in class folders
    if skipped:
        yield reject(xml_path, SkippedFile(skipped))
        return
    try:
        image, names, malformed = parse_voc(files.read_input(xml_path, MAX_XML_BYTES), xml_path)
    except InputRejected as exc:  # not VOC, too large, unreadable: the image it names is refused
        yield reject(voc_image_path(xml_path, f"{stem}.jpg"), AnnotationFileProblem(f"{xml_path}: {exc}"))
        return
    yield image, names
    yield from _tagged(malformed)


def voc_image(element: tuple[str, Iterable[tuple[AnnotatedImage, list[str]]]], label_map: dict[str, int],
              keep_empty: bool):
    """One image file's parsed XML files → the one, labelled (`labelled_voc_image`), or the
    rejections of them all."""
    kept, rejections = one_annotation_file_per_image(list(element[1]))
    yield from _tagged(rejections)
    if kept is not None:
        yield from _found(*labelled_voc_image(kept[0], label_map, keep_empty))


@beam.ptransform_fn
def DiscoverAnnotated(pbegin: beam.pvalue.PBegin, spec: InputSpec, with_masks: bool = False):
    """PBegin → {"candidates": batches of Candidate, "rejected": Rejection, "label_map": one
    {name: id}} for a COCO file or a VOC folder."""
    keep_empty = spec.keep_empty_images
    if spec.resolved_kind == "coco":
        categories = coco_categories(spec.path, spec.class_names)
        label_map = pbegin | "Categories" >> beam.Create([categories])
        rows = (pbegin
                | "AnnotationFile" >> beam.Create([spec.path])
                | "ReadCoco" >> beam.FlatMap(read_coco, spec.images_root, with_masks).with_outputs(
                    REJECTED, "images", main="annotations"))
        listings = (rows.images
                    | "ByFile" >> beam.GroupByKey()
                    | "OneListingPerFile" >> beam.FlatMap(one_file).with_outputs(REJECTED, main="listings"))
        found = ({"listings": listings.listings, "annotations": rows.annotations}
                 | "ByImageId" >> beam.CoGroupByKey()
                 | "Images" >> beam.FlatMap(coco_image, category_names(categories), keep_empty)
                 .with_outputs(REJECTED, main="candidates"))
        rejected = (rows[REJECTED], listings[REJECTED], found[REJECTED]) | "CocoRejections" >> beam.Flatten()
    else:
        parsed = (pbegin
                  | "VocFolder" >> beam.Create([spec.path])
                  | "ListAnnotations" >> beam.FlatMap(voc_files)
                  | "SpreadFiles" >> beam.Reshuffle()
                  | "ParseVoc" >> beam.FlatMap(parse_voc_file).with_outputs(REJECTED, main="parsed"))
        label_map = (parsed.parsed
                     | "ClassNames" >> beam.Map(lambda found: found[1])
                     | "DistinctNames" >> beam.CombineGlobally(distinct)
                     | "VocLabelMap" >> beam.Map(voc_label_map, spec.class_names))
        found = (parsed.parsed
                 | "ByImageFile" >> beam.Map(lambda found: (found[0].path, found))
                 | "ImageFiles" >> beam.GroupByKey()
                 | "Images" >> beam.FlatMap(voc_image, beam.pvalue.AsSingleton(label_map), keep_empty)
                 .with_outputs(REJECTED, main="candidates"))
        rejected = (parsed[REJECTED], found[REJECTED]) | "VocRejections" >> beam.Flatten()
    candidates = (found.candidates
                  | "Batch" >> beam.BatchElements(min_batch_size=1, max_batch_size=BATCH)
                  | "AsBatches" >> beam.Map(Batch))
    return {"candidates": candidates, REJECTED: rejected, LABEL_MAP: label_map}
