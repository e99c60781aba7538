"""Detection records: list features byte-identical to TensorFlow's own serialization, masks as
pycocotools makes them, the features TF's detection decoders parse, and the label map files."""
from __future__ import annotations

import csv
import io

import cv2
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from pycocotools import mask as coco_mask

from transforms.images.geometry import Placement, placement
from transforms.images.masks import mask_png, polygons_mask, rle_counts, rle_mask
from transforms.inputs.annotations import AnnotatedImage, ObjectAnnotation, Polygons, RunLengths
from transforms.inputs.label_map_files import label_map_csv, label_map_pbtxt
from transforms.specs import DETECTION_KEYS, ImageSpec
from transforms.write.detection_example import detection_feature_spec, detection_record, place_objects
from transforms.write.example import ListFeature, serialize_example

pytestmark = pytest.mark.unit


def tf_feature(value) -> tf.train.Feature:
    if isinstance(value, ListFeature):
        kind = {"bytes": "bytes_list", "int64": "int64_list", "float": "float_list"}[value.kind]
        list_type = {"bytes_list": tf.train.BytesList, "int64_list": tf.train.Int64List,
                     "float_list": tf.train.FloatList}[kind]
        return tf.train.Feature(**{kind: list_type(value=list(value.values))})
    if isinstance(value, bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    if isinstance(value, int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
    return tf.train.Feature(float_list=tf.train.FloatList(value=[value]))


def test_list_features_serialize_as_tensorflow_does():
    features = {
        "boxes": ListFeature("float", (0.25, 1e-8, 1.0, -3.5)),
        "empty_floats": ListFeature("float", ()),
        "empty_ints": ListFeature("int64", ()),
        "empty_bytes": ListFeature("bytes", ()),
        "ids": ListFeature("int64", (1, 90, -1, 2**63 - 1, 0)),
        "names": ListFeature("bytes", (b"cat", b"", "h\u00e9".encode())),
        "scalar": 7,
        "image": b"\x00\x01",
    }
    expected = tf.train.Example(features=tf.train.Features(feature={k: tf_feature(v) for k, v in features.items()}))
    assert serialize_example(features) == expected.SerializeToString(deterministic=True)
    with pytest.raises(TypeError):
        serialize_example({"x": ListFeature("int64", (True,))})
    with pytest.raises(ValueError, match="kind"):
        ListFeature("string", ())


def random_polygon(rng: np.random.Generator, width: int, height: int) -> list[float]:
    """A star-shaped polygon with fractional vertices."""
    angles = np.sort(rng.uniform(0, 2 * np.pi, 9))
    radius = rng.uniform(4, min(width, height) / 2 - 1, 9)
    cx, cy = width / 2 + rng.uniform(-2, 2), height / 2 + rng.uniform(-2, 2)
    return [round(float(v), 2) for a, r in zip(angles, radius) for v in (cx + r * np.cos(a), cy + r * np.sin(a))]


IDENTITY = Placement(1, (61, 47), (1.0, 1.0), (0.0, 0.0), (61, 47))


def test_rle_masks_decode_as_pycocotools_decodes_them():
    rng = np.random.default_rng(3)
    for _ in range(20):
        mask = (rng.random((47, 61)) < rng.uniform(0.05, 0.95)).astype(np.uint8)
        encoded = coco_mask.encode(np.asfortranarray(mask))
        runs = rle_counts(encoded["counts"].decode("ascii"))
        reference = coco_mask.decode(coco_mask.frPyObjects({"size": [47, 61], "counts": runs}, 47, 61))
        np.testing.assert_array_equal(rle_mask(RunLengths(encoded["counts"].decode("ascii"), 47, 61)), mask)
        np.testing.assert_array_equal(rle_mask(RunLengths(tuple(runs), 47, 61)), reference)


def test_polygon_masks_differ_from_pycocotools_only_on_the_outline():
    rng = np.random.default_rng(5)
    for _ in range(20):
        polygon = random_polygon(rng, 61, 47)
        reference = coco_mask.decode(coco_mask.merge(coco_mask.frPyObjects([polygon], 47, 61))).astype(bool)
        ours = polygons_mask(Polygons((tuple(polygon),)), IDENTITY).astype(bool)
        differ = ours ^ reference
        outline = cv2.dilate(reference.astype(np.uint8), np.ones((3, 3))) != cv2.erode(
            reference.astype(np.uint8), np.ones((3, 3)))
        assert not (differ & ~outline).any()
        assert differ.sum() <= 0.1 * outline.sum()  # 200 such polygons: at most 6.5 %, 2 % on average


@pytest.mark.parametrize("bad", [RunLengths("0;", 2, 2), RunLengths("1", 3, 3), RunLengths((1, 2), 2, 2),
                                 RunLengths((5, -1), 2, 2), Polygons(((1, 2, 3, 4),)),
                                 Polygons(((1, 2, 3, 4, float("nan"), 6),)),
                                 # finite, but the crossings overflow (inf - inf): the run failed on an IndexError
                                 Polygons(((-1e308, -1e308, 1e308, 1e308, 0, 1),))])
def test_a_bad_segmentation_drops_only_its_object(bad):
    image = AnnotatedImage("a.png", "1", "a.png", 2, 2, (
        ObjectAnnotation("annotation 1", (0, 0, 1, 1), 3, "cat", segmentation=RunLengths((0, 4), 2, 2)),
        ObjectAnnotation("annotation 2", (0, 0, 2, 2), 3, "cat", segmentation=bad)))
    placed, rejected = place_objects(image, Placement(1, (2, 2), (1, 1), (0, 0), (2, 2)), 0.5, with_masks=True)
    assert len(placed) == 1 and [(r.error, r.message.split(":")[0]) for r in rejected] == [
        ("BadSegmentation", "annotation 2 ('cat')")]


def test_mask_pngs_hold_zeros_and_ones():
    mask = np.zeros((5, 7), np.uint8)
    mask[1:3, 2:6] = 1
    decoded = tf.io.decode_png(mask_png(mask), channels=1).numpy()[..., 0]
    np.testing.assert_array_equal(decoded, mask)


def test_verify_decodes_each_mask_and_says_what_is_wrong_with_it():
    from PIL import Image

    from pipeline.read.verify import mask_problem

    def encoded(image: np.ndarray, ext: str = ".png") -> bytes:
        return cv2.imencode(ext, image)[1].tobytes()

    def palette_png() -> bytes:
        out = io.BytesIO()
        Image.fromarray(np.zeros((5, 7), np.uint8)).convert("P").save(out, "PNG")
        return out.getvalue()

    good = mask_png(np.eye(5, 7, dtype=np.uint8))
    assert mask_problem(good, 5, 7) is None
    assert mask_problem(good, 7, 5) == "is 7x5, its image 5x7"
    assert mask_problem(encoded(np.zeros((5, 7, 3), np.uint8)), 5, 7) == "has 3 channels, not one"
    assert mask_problem(palette_png(), 5, 7) == "has 3 channels, not one"  # TF decodes a palette to RGB
    assert mask_problem(encoded(np.zeros((5, 7), np.uint8), ".jpg"), 5, 7) == "is not a PNG"
    assert mask_problem(good[:-12], 5, 7) == f"does not decode (Invalid PNG data, size {len(good) - 12})"  # no IEND


def parse_detection(record: bytes) -> dict:
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/format": tf.io.FixedLenFeature([], tf.string),
            "image/height": tf.io.FixedLenFeature([], tf.int64), "image/width": tf.io.FixedLenFeature([], tf.int64),
            "image/source_id": tf.io.FixedLenFeature([], tf.string),
            "image/filename": tf.io.FixedLenFeature([], tf.string)}
    for key in ("xmin", "ymin", "xmax", "ymax"):
        spec[f"image/object/bbox/{key}"] = tf.io.VarLenFeature(tf.float32)
    spec.update({"image/object/class/label": tf.io.VarLenFeature(tf.int64),
                 "image/object/class/text": tf.io.VarLenFeature(tf.string),
                 "image/object/is_crowd": tf.io.VarLenFeature(tf.int64),
                 "image/object/area": tf.io.VarLenFeature(tf.float32),
                 "image/object/mask": tf.io.VarLenFeature(tf.string),
                 "image/object/difficult": tf.io.VarLenFeature(tf.int64)})
    parsed = tf.io.parse_single_example(record, spec)
    return {k: (tf.sparse.to_dense(v) if isinstance(v, tf.SparseTensor) else v).numpy() for k, v in parsed.items()}


def test_a_detection_record_holds_what_tf_detection_decoders_read():
    image = AnnotatedImage("/d/a.jpg", "42", "a.jpg", 100, 50, (
        ObjectAnnotation("annotation 1", (10, 5, 30, 25), 18, "dog", 0, 300.0, Polygons(((10, 5, 30, 5, 30, 25),))),
        ObjectAnnotation("annotation 2", (0, 0, 100, 50), 1, "cat", 1, 900.0,
                         RunLengths((0, 5000), 50, 100))))
    where = placement((100, 50), 1, (100, 50), ImageSpec(height=25, width=50, normalize="none", encoding="png"))
    placed, rejected = place_objects(image, where, 0.5, with_masks=True)
    assert rejected == ()
    record = detection_record(b"PNGDATA", "png", where.size, image, placed, with_masks=True, voc_fields=True,
                              extra={"image/sha256": b"ab"})
    assert record.data[record.image_offset:record.image_offset + record.image_length] == b"PNGDATA"
    got = parse_detection(record.data)
    assert (got["image/height"], got["image/width"], got["image/source_id"], got["image/format"]) == (
        25, 50, b"42", b"png")
    np.testing.assert_allclose(got["image/object/bbox/xmin"], [0.1, 0.0])
    np.testing.assert_allclose(got["image/object/bbox/ymax"], [0.5, 1.0])
    assert list(got["image/object/class/label"]) == [18, 1] and list(got["image/object/is_crowd"]) == [0, 1]
    assert list(got["image/object/class/text"]) == [b"dog", b"cat"]
    np.testing.assert_allclose(got["image/object/area"], [75.0, 225.0])  # areas scale by 1/4
    masks = [tf.io.decode_png(png).numpy() for png in got["image/object/mask"]]
    assert [m.shape for m in masks] == [(25, 50, 1)] * 2 and masks[1].min() == 1
    assert list(got["image/object/difficult"]) == [0, 0]
    empty = parse_detection(detection_record(b"x", "jpeg", (4, 4), image, ()).data)
    assert empty["image/object/bbox/xmin"].shape == (0,) and empty["image/object/mask"].shape == (0,)


@pytest.mark.parametrize("masks, voc_fields", [(False, False), (True, False), (False, True)])
def test_metadata_lists_every_feature_a_detection_record_holds(masks, voc_fields):
    """metadata.json's feature list (what load_dataset and verify know) names each feature
    detection_record writes, VOC's difficult and truncated flags included, with its list type."""
    image = AnnotatedImage("/d/a.jpg", "a", "a.jpg", 100, 50, (
        ObjectAnnotation("object 1", (10, 5, 30, 25), 1, "dog", segmentation=Polygons(((10, 5, 30, 5, 30, 25),)),
                         difficult=1, truncated=1),))
    where = placement((100, 50), 1, (100, 50), None)
    placed, _ = place_objects(image, where, 0.5, with_masks=masks)
    record = detection_record(b"PNG", "png", where.size, image, placed, masks, voc_fields,
                              {"image/source_path": b"a.jpg", "image/sha256": b"ab"})
    written = tf.train.Example.FromString(record.data).features.feature
    listed = detection_feature_spec(ImageSpec(resize_mode="none", encoding="png"), DETECTION_KEYS, masks, voc_fields)
    kinds = {"string": "bytes_list", "int64": "int64_list", "float32": "float_list"}
    assert {key: kinds[described["dtype"]] for key, described in listed.items()} == {
        key: feature.WhichOneof("kind") for key, feature in written.items()}
    if voc_fields:
        assert {listed[key]["role"]: list(written[key].int64_list.value) for key in
                ("image/object/difficult", "image/object/truncated")} == {"difficult": [1], "truncated": [1]}


def string_int_label_map():
    """The OD API's StringIntLabelMap message (object_detection/protos/string_int_label_map.proto),
    built here: the OD API itself is not installed."""
    proto = descriptor_pb2.FileDescriptorProto(name="string_int_label_map.proto", package="object_detection.protos")
    item = proto.message_type.add(name="StringIntLabelMapItem")
    for name, number, kind in (("name", 1, "TYPE_STRING"), ("id", 2, "TYPE_INT32"), ("display_name", 3, "TYPE_STRING")):
        item.field.add(name=name, number=number, type=getattr(descriptor_pb2.FieldDescriptorProto, kind),
                       label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    whole = proto.message_type.add(name="StringIntLabelMap")
    whole.field.add(name="item", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                    type_name=".object_detection.protos.StringIntLabelMapItem",
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("object_detection.protos.StringIntLabelMap"))


def test_label_map_files_read_back():
    label_map = {"person": 1, "traffic light": 10, 'say "hi", \\ café': 3}
    parsed = text_format.Parse(label_map_pbtxt(label_map), string_int_label_map()())
    assert [(item.id, item.name) for item in parsed.item] == [(1, "person"), (3, 'say "hi", \\ café'),
                                                               (10, "traffic light")]
    rows = list(csv.reader(io.StringIO(label_map_csv(label_map))))
    assert {name: int(label_id) for label_id, name in rows} == label_map
