"""One image's bytes → one serialized record: decode → resize → normalize → encode → Example."""
from __future__ import annotations

from transforms.images.decode import decode_image
from transforms.images.image_header import ImageHeader
from transforms.images.normalize import normalize_image
from transforms.images.resize import resize_image
from transforms.specs import FeatureKeys, ImageSpec
from transforms.write.example import EncodedRecord, RecordFields, build_example, encode_pixels


def image_to_record(data: bytes, header: ImageHeader, fields: RecordFields, spec: ImageSpec,
                    keys: FeatureKeys) -> EncodedRecord:
    pixels = decode_image(data, header, spec, fields.source_path)
    pixels = normalize_image(resize_image(pixels, spec) if spec.resizes else pixels, spec)
    return build_example(encode_pixels(pixels, spec), fields, spec, keys, size=(pixels.shape[1], pixels.shape[0]))
