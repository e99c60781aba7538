"""Pascal VOC: one `Annotations/<stem>.xml` per image, the image in `JPEGImages/`.

XML is parsed by defusedxml with DTDs refused (VOC files have none), so no entity can expand or
reach outside the file. A file that cannot be read as a VOC annotation is a rejection of its
image, not a failed run: one bad file of 10,000 must not stop the others.

VOC boxes are 1-based pixel indices, both ends included (`xmin=1, xmax=10` is the first ten
pixels), so on the continuous grid a box spans [xmin - 1, xmax], as Detectron2 reads them.
create_pascal_tf_record.py divides xmin by the width unshifted, one pixel right of this.
Tools that write 0-based boxes put objects at the left or top edge at 0: that one pixel past
the edge is taken as the edge (as create_pascal_tf_record.py reads it), not a box outside.
"""
from __future__ import annotations

import dataclasses
import posixpath
import xml.etree.ElementTree as ElementTree
from typing import Iterable, Optional, Sequence

import defusedxml
import defusedxml.ElementTree

from transforms.inputs.annotations import (
    AnnotatedImage,
    AnnotationFileProblem,
    ImageListedTwice,
    ObjectAnnotation,
    dropped_with_image,
    finished_image,
    object_row,
)
from transforms.inputs.manifests import resolve_path
from transforms.rejections import Rejection

ANNOTATIONS, IMAGES = "Annotations", "JPEGImages"
MAX_XML_BYTES = 16 * 2**20  # read at most (discover_annotated): a VOC file with hundreds of objects is tens of kB


def voc_label_map(names: Iterable[str], class_names: Optional[Sequence[str]] = None) -> dict[str, int]:
    """`class_names` in their order, else the class names found, sorted, as ids 1..N (0 is the
    background class of TF's detectors): the OD API's pascal_label_map.pbtxt's for the 20 VOC classes."""
    return {name: i for i, name in enumerate(class_names or sorted(set(names)), start=1)}


def _text(element: ElementTree.Element, path: str) -> str:
    found = element.find(path)
    if found is None or found.text is None or not found.text.strip():
        raise AnnotationFileProblem(f"no <{path}>")
    return found.text.strip()


def _number(element: ElementTree.Element, path: str) -> float:
    text = _text(element, path)
    try:
        value = float(text)
    except ValueError:
        raise AnnotationFileProblem(f"<{path}> is {text!r}, not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise AnnotationFileProblem(f"<{path}> is {text!r}, not a finite number")
    return value


def _flag(element: ElementTree.Element, name: str) -> int:
    """0 or 1 (also written false or true); absent or empty is 0."""
    text = (element.findtext(name) or "").strip()
    if text.lower() not in ("", "0", "1", "false", "true"):
        raise AnnotationFileProblem(f"<{name}> is {text!r}, not 0 or 1")
    return int(text.lower() in ("1", "true"))


def voc_image_path(xml_path: str, file_name: str) -> str:
    """`<root>/Annotations/x.xml` names its image `<root>/JPEGImages/<filename>`, resolved as a COCO
    file_name is (`./a.jpg` is `a.jpg`)."""
    root = posixpath.dirname(posixpath.dirname(xml_path))
    return resolve_path(file_name, posixpath.join(root, IMAGES, ""))


def parse_voc(data: bytes, xml_path: str) -> tuple[AnnotatedImage, list[str], tuple[Rejection, ...]]:
    """One XML file → its image (objects labelled 0 until the label map is known), the class
    names it uses, and the rows of its malformed objects (dropped, as a malformed COCO entry is,
    so the image's other objects go on and are counted). A file that is not VOC raises
    AnnotationFileProblem."""
    try:
        root = defusedxml.ElementTree.fromstring(data, forbid_dtd=True)
    except (defusedxml.ElementTree.ParseError, defusedxml.DefusedXmlException) as exc:  # its own ParseError class
        raise AnnotationFileProblem(f"not readable XML: {type(exc).__name__}: {exc}") from None
    if root.tag != "annotation":
        raise AnnotationFileProblem(f"the root element is <{root.tag}>, not <annotation>")
    stem = posixpath.splitext(posixpath.basename(xml_path))[0]
    file_name = root.findtext("filename", "").strip() or f"{stem}.jpg"
    width, height = _number(root, "size/width"), _number(root, "size/height")
    if width != int(width) or height != int(height) or width < 1 or height < 1:
        raise AnnotationFileProblem(f"<size> is {width:g}x{height:g}, not a positive whole number of pixels")
    image_path = voc_image_path(xml_path, file_name)
    objects, malformed = [], []
    for index, element in enumerate(root.findall("object"), start=1):
        ref = f"object {index}"
        try:
            name = _text(element, "name")
            xmin, ymin, xmax, ymax = (_number(element, f"bndbox/{side}") for side in ("xmin", "ymin", "xmax", "ymax"))
            difficult, truncated = _flag(element, "difficult"), _flag(element, "truncated")
        except AnnotationFileProblem as exc:
            malformed.append(object_row(image_path, AnnotationFileProblem(f"{xml_path}: {ref}: {exc}")))
            continue
        box = (one_based_start(xmin), one_based_start(ymin), xmax, ymax)
        objects.append(ObjectAnnotation(ref, box, 0, name, 0, (box[2] - box[0]) * (box[3] - box[1]),
                                        difficult=difficult, truncated=truncated))
    image = AnnotatedImage(image_path, posixpath.splitext(file_name)[0], file_name, int(width), int(height),
                           tuple(objects))
    return image, sorted({obj.text for obj in objects}), tuple(malformed)


def one_based_start(coordinate: float) -> float:
    """A 1-based inclusive start on the continuous grid; 0 (a 0-based tool's edge) is the edge."""
    return coordinate - 1 if coordinate >= 1 or coordinate < 0 else 0.0


def one_annotation_file_per_image(parsed: Sequence[tuple[AnnotatedImage, list[str]]]
                                  ) -> tuple[Optional[tuple[AnnotatedImage, list[str]]], tuple[Rejection, ...]]:
    """One image's parsed XML files: two (a copied annotation file naming the same <filename>)
    leave which boxes are its unknowable, so each listing is refused with its objects, as a COCO
    file listed twice is."""
    if len(parsed) == 1:
        return parsed[0], ()
    rows: list[Rejection] = []
    for image, _ in parsed:
        refused = Rejection.from_exception(image.path, ImageListedTwice(
            f"{image.file_name} is named by {len(parsed)} annotation files (<filename>{image.file_name}</filename>)"))
        rows += (refused, *dropped_with_image(image.objects, refused))
    return None, tuple(rows)


def labelled_voc_image(image: AnnotatedImage, label_map: dict[str, int],
                       keep_empty: bool = True) -> tuple[Optional[AnnotatedImage], tuple[Rejection, ...]]:
    """The image with its objects' label ids (`finished_image`)."""
    def labelled(obj: ObjectAnnotation) -> Optional[ObjectAnnotation]:
        return dataclasses.replace(obj, label=label_map[obj.text]) if obj.text in label_map else None

    return finished_image(image, image.objects, labelled,
                          lambda obj: f"class {obj.text!r} is not one of the {len(label_map)} configured classes",
                          keep_empty)
