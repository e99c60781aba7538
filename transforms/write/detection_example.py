"""Detection and multi-label records: the `tf.train.Example` features TF's detection readers take.

The keys and types are those Model Garden's TfExampleDecoder
(official/vision/dataloaders/tf_example_decoder.py) and the TF Object Detection API read, as
their own converters (create_coco_tf_record.py, create_pascal_tf_record.py) write them: boxes
as normalized float lists, class ids as int64, class names, is_crowd as int64, area as float
(in output pixels), masks as one PNG per object, the source id as text. Encoded by
transforms/write/example.py, so the bytes are deterministic and no TensorFlow is imported.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Sequence

import numpy as np

from transforms.images.boxes import crop_problem, normalized, place_boxes
from transforms.images.geometry import Placement
from transforms.images.masks import mask_png, segmentation_mask
from transforms.inputs.annotations import AnnotatedImage, AnnotationRejected, object_rejection
from transforms.rejections import Rejection
from transforms.specs import FeatureKeys, ImageSpec
from transforms.write.example import EncodedRecord, FeatureValue, ListFeature, encode_record

IMAGE_KEY = "image/encoded"
BOX_KEYS = ("image/object/bbox/xmin", "image/object/bbox/ymin", "image/object/bbox/xmax", "image/object/bbox/ymax")
MASK_KEY = "image/object/mask"
VOC_KEYS = {"difficult": "image/object/difficult", "truncated": "image/object/truncated"}  # role → key


@dataclasses.dataclass(frozen=True)
class PlacedObject:
    """An object as its record holds it: `box` is (xmin, ymin, xmax, ymax) in [0, 1]."""

    box: tuple[float, float, float, float]
    label: int
    text: str
    is_crowd: int
    area: float
    difficult: int = 0
    truncated: int = 0
    mask: Optional[bytes] = None  # PNG


def place_objects(image: AnnotatedImage, where: Placement, min_visible: float,
                  with_masks: bool) -> tuple[tuple[PlacedObject, ...], tuple[Rejection, ...]]:
    """The image's objects on the output grid; those cropped away or whose mask cannot be made
    are rejections. `area` shrinks with the part of the box a crop cut off."""
    boxes = place_boxes(np.array([obj.box for obj in image.objects], np.float64).reshape(-1, 4), where)
    placed, rejected = [], []
    for obj, box in zip(image.objects, boxes):
        try:
            problem = crop_problem(box, min_visible)
            if problem is not None:
                raise problem
            mask = mask_png(segmentation_mask(obj.segmentation, where)) if with_masks else None
        except AnnotationRejected as exc:
            rejected.append(object_rejection(image.path, obj, exc))
            continue
        placed.append(PlacedObject(normalized(box.box, where.size), obj.label, obj.text, obj.is_crowd,
                                   obj.area * where.area_scale * box.visible, obj.difficult, obj.truncated, mask))
    return tuple(placed), tuple(rejected)


def detection_feature_spec(spec: ImageSpec, keys: FeatureKeys, masks: bool = False,
                           voc_fields: bool = False) -> dict[str, dict]:
    """metadata.json's parse spec of detection records, every feature `detection_record` writes:
    the image (its own size per record unless resized), and per object lists (`kind: var_len`)
    a reader parses as ragged tensors; with `masks`, the objects' PNG masks; with `voc_fields`,
    VOC's difficult and truncated flags."""
    def objects(role: str, dtype: str) -> dict:
        return {"role": role, "dtype": dtype, "kind": "var_len"}

    described = {
        IMAGE_KEY: {"role": "image", "dtype": "string", "encoding": spec.encoding, "pixel_dtype": spec.dtype,
                    "shape": list(spec.shape), "normalize": spec.normalize},
        "image/format": {"role": "format", "dtype": "string"},
        keys.height: {"role": "height", "dtype": "int64"},
        keys.width: {"role": "width", "dtype": "int64"},
        "image/source_id": {"role": "source_id", "dtype": "string"},
        "image/filename": {"role": "filename", "dtype": "string"},
        **{key: objects(f"bbox/{key.rsplit('/', 1)[1]}", "float32") for key in BOX_KEYS},
        "image/object/class/label": objects("object_label", "int64"),
        "image/object/class/text": objects("object_text", "string"),
        "image/object/is_crowd": objects("is_crowd", "int64"),
        "image/object/area": objects("area", "float32"),
        MASK_KEY: objects("mask", "string") if masks else None,
        **{key: objects(role, "int64") if voc_fields else None for role, key in VOC_KEYS.items()},
        keys.source_path: {"role": "source_path", "dtype": "string"},
        keys.content_hash: {"role": "content_hash", "dtype": "string"},
    }
    return {key: value for key, value in described.items() if key and value}


def masks_recorded(config: Mapping) -> bool:
    """Whether a dataset's recorded config (metadata.json's `config`) wrote masks."""
    return bool((config.get("annotations") or {}).get("masks"))


def voc_fields_recorded(config: Mapping) -> bool:
    """Whether a dataset's recorded config read a VOC folder (ConversionSpec.to_dict records a
    COCO or VOC input's resolved kind), so its records hold VOC's difficult and truncated flags."""
    return (config.get("input") or {}).get("kind") == "voc"


def _text(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


def detection_record(encoded: bytes, image_format: str, size: tuple[int, int], image: AnnotatedImage,
                     objects: Sequence[PlacedObject], with_masks: bool = False, voc_fields: bool = False,
                     extra: Optional[Mapping[str, FeatureValue]] = None) -> EncodedRecord:
    """The record of one image: `encoded` is its JPEG or PNG (`image_format`) of `size` (width,
    height); `voc_fields` adds VOC's difficult and truncated flags (the OD API reads them);
    `extra` holds imgrec's own features (source path, content hash)."""
    width, height = size
    floats = [ListFeature("float", tuple(obj.box[i] for obj in objects)) for i in range(4)]
    features: dict[str, FeatureValue] = {
        **(extra or {}),
        IMAGE_KEY: encoded,
        "image/format": image_format.encode("ascii"),
        "image/height": height,
        "image/width": width,
        "image/source_id": _text(image.source_id),
        "image/filename": _text(image.file_name),
        **dict(zip(BOX_KEYS, floats)),
        "image/object/class/label": ListFeature("int64", tuple(obj.label for obj in objects)),
        "image/object/class/text": ListFeature("bytes", tuple(_text(obj.text) for obj in objects)),
        "image/object/is_crowd": ListFeature("int64", tuple(obj.is_crowd for obj in objects)),
        "image/object/area": ListFeature("float", tuple(obj.area for obj in objects)),
    }
    if with_masks:
        features[MASK_KEY] = ListFeature("bytes", tuple(obj.mask for obj in objects))
    if voc_fields:
        features.update({key: ListFeature("int64", tuple(getattr(obj, role) for obj in objects))
                         for role, key in VOC_KEYS.items()})
    return encode_record(features, IMAGE_KEY)

