"""One image's bytes → one serialized record: decode → resize → normalize → encode → Example."""
from __future__ import annotations

from transforms.decode import decode_image
from transforms.example import EncodedRecord, RecordFields, build_example, encode_pixels
from transforms.image_header import ImageHeader
from transforms.normalize import normalize_image
from transforms.resize import resize_image
from transforms.specs import FeatureKeys, ImageSpec


def image_to_record(data: bytes, header: ImageHeader, fields: RecordFields, spec: ImageSpec,
                    keys: FeatureKeys) -> EncodedRecord:
    pixels = normalize_image(resize_image(decode_image(data, header, spec, fields.source_path), spec), spec)
    return build_example(encode_pixels(pixels, spec), fields, spec, keys)
