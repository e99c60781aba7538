"""One annotated image's bytes → its detection record: decode → place the objects → resize →
encode → Example (transforms/write/detection_example.py), the detection twin of transforms/images/process.py.

The objects follow the pixels exactly: the map from the stored grid to the record's image
(`placement`) is built from the header's stored size and turn, the decoded size and the resize
plan, so every resize mode and EXIF orientation moves boxes and masks with the pixels. An
incremental run (--reuse_from) takes a previous record's image of the same content and pixel
settings and places the current annotations on the map the decode would have given
(`detection_to_record` with `reused`): changed annotations are honoured without decoding again.
"""
from __future__ import annotations

from typing import Mapping

from transforms.images.decode import decode_image, decoded_size
from transforms.images.geometry import GeometryError, placement, upright_size
from transforms.images.image_header import ImageHeader, read_header
from transforms.images.normalize import normalize_image
from transforms.images.resize import resize_image
from transforms.inputs.annotations import AnnotatedImage, AnnotationFileProblem
from transforms.rejections import Rejection
from transforms.specs import AnnotationSpec, ImageSpec
from transforms.write.detection_example import PlacedObject, detection_record, place_objects
from transforms.write.example import EncodedRecord, FeatureValue, encode_pixels


class SizeMismatch(AnnotationFileProblem):
    """The annotation file declares another size than the image has: its boxes cannot be trusted."""


def check_declared_size(image: AnnotatedImage, header: ImageHeader) -> None:
    """The annotations refer to the stored grid (as COCO's and VOC's tools read images), so the
    declared size must be the stored one; an image annotated on its EXIF-turned grid says so."""
    declared, stored = (image.width, image.height), (header.width, header.height)
    if declared == stored:
        return
    turned = upright_size(*stored, header.turned) == declared
    why = (f"; that is its upright size after EXIF orientation {header.turned}: annotate the stored pixel grid, "
           "as COCO's and VOC's tools read images") if turned else ""
    raise SizeMismatch(f"the annotation file declares {declared[0]}x{declared[1]}, the image is "
                       f"{stored[0]}x{stored[1]}{why}")


Detection = tuple[EncodedRecord, tuple[PlacedObject, ...], tuple[Rejection, ...]]


def detection_to_record(data: bytes, header: ImageHeader, image: AnnotatedImage, spec: ImageSpec,
                        objects_spec: AnnotationSpec, voc_fields: bool, extra: Mapping[str, FeatureValue],
                        reused: bool = False) -> Detection:
    """(record, the objects it holds, the objects dropped) for one image; `extra` holds imgrec's
    own features (source path, content hash).

    `reused`: `data` is a previous record's image of these bytes made with these pixel settings,
    so the record is the same and the objects are placed from `image` as they are now, on the
    map the decode would have given. Raises GeometryError if that image is not the size the map
    gives (then the image is converted afresh)."""
    check_declared_size(image, header)
    if reused:
        encoded = data
        where = placement((header.width, header.height), header.turned, decoded_size(header, spec), spec)
        previous = read_header(encoded)
        if (previous.width, previous.height) != where.size:
            raise GeometryError(f"the previous record's image is {previous.width}x{previous.height}, this run's "
                                f"would be {where.size[0]}x{where.size[1]}")
    else:
        pixels = decode_image(data, header, spec, image.path)
        where = placement((header.width, header.height), header.turned, (pixels.shape[1], pixels.shape[0]), spec)
        if spec.resizes:
            pixels = resize_image(pixels, spec)
        encoded = encode_pixels(normalize_image(pixels, spec), spec)
    objects, dropped = place_objects(image, where, objects_spec.min_visible, objects_spec.masks)
    record = detection_record(encoded, spec.encoding, where.size, image, objects, objects_spec.masks, voc_fields,
                              extra)
    return record, objects, dropped
