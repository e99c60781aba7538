"""COCO and VOC inputs through the whole pipeline: the records TF reads back hold boxes where the
objects' pixels are, every annotation problem is a dead letter, and the counts reconcile."""
from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest

from tests.helpers import dead_letters, run_pipeline, run_verify

pytestmark = pytest.mark.e2e

DETECTION = pathlib.Path(__file__).resolve().parent.parent / "data" / "detection"
SQUARE = (230, 40, 40)  # data/make_detection_sample.py: a square fills its box exactly
BOX_KEYS = [f"image/object/bbox/{side}" for side in ("xmin", "ymin", "xmax", "ymax")]


def records(output: pathlib.Path) -> list[dict]:
    """Every record of every split, parsed by TensorFlow as TF's detection decoders parse them."""
    import tensorflow as tf

    spec = {"image/encoded": tf.io.FixedLenFeature((), tf.string),
            "image/source_id": tf.io.FixedLenFeature((), tf.string),
            "image/height": tf.io.FixedLenFeature((), tf.int64), "image/width": tf.io.FixedLenFeature((), tf.int64),
            **{key: tf.io.VarLenFeature(tf.float32) for key in [*BOX_KEYS, "image/object/area"]},
            "image/object/class/label": tf.io.VarLenFeature(tf.int64),
            "image/object/class/text": tf.io.VarLenFeature(tf.string),
            "image/object/is_crowd": tf.io.VarLenFeature(tf.int64)}
    parsed = []
    for shard in sorted(output.glob("*.tfrecord")):
        for raw in tf.data.TFRecordDataset(str(shard)):
            example = tf.io.parse_single_example(raw, spec)
            parsed.append({key: (tf.sparse.to_dense(value) if isinstance(value, tf.SparseTensor) else value).numpy()
                           for key, value in example.items()} | {
                "pixels": tf.io.decode_image(example["image/encoded"], channels=3).numpy()})
    return parsed


def square_pixels_box(pixels: np.ndarray) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) of the pixels coloured as a square, found in the decoded record image."""
    ys, xs = np.nonzero(np.abs(pixels.astype(int) - SQUARE).max(axis=2) < 40)
    return xs.min(), ys.min(), xs.max() + 1, ys.max() + 1


def square_boxes(record: dict) -> list[np.ndarray]:
    width, height = record["image/width"], record["image/height"]
    return [np.array([record[BOX_KEYS[0]][i] * width, record[BOX_KEYS[1]][i] * height,
                      record[BOX_KEYS[2]][i] * width, record[BOX_KEYS[3]][i] * height])
            for i, text in enumerate(record["image/object/class/text"]) if text == b"square"]


def test_coco_records_hold_the_files_objects_where_their_pixels_are(tmp_path):
    """Original size (the detection scripts' way): COCO ids as labels and source ids, the classes,
    crowd flags and areas pycocotools reads, and each square's box on its pixels, the EXIF-turned
    JPEG's too."""
    from pycocotools.coco import COCO

    metadata = run_pipeline(DETECTION / "coco" / "instances.json", tmp_path / "out", "--input_kind=coco")
    coco = COCO(str(DETECTION / "coco" / "instances.json"))
    found = records(tmp_path / "out")
    assert sorted(int(r["image/source_id"]) for r in found) == sorted(coco.getImgIds())
    for record in found:
        annotations = coco.loadAnns(coco.getAnnIds(imgIds=[int(record["image/source_id"])]))
        assert sorted(record["image/object/class/label"]) == sorted(a["category_id"] for a in annotations)
        assert sorted(record["image/object/is_crowd"]) == sorted(a["iscrowd"] for a in annotations)
        np.testing.assert_allclose(sorted(record["image/object/area"]), sorted(a["area"] for a in annotations),
                                   rtol=1e-5)
        pixels = record["pixels"]
        assert pixels.shape[:2] == (record["image/height"], record["image/width"])
        for box in square_boxes(record):
            np.testing.assert_allclose(box, square_pixels_box(pixels), atol=1.5)
    assert (tmp_path / "out" / "label_map.csv").read_text() == "1,disc\n3,square\n7,triangle\n"
    assert 'item {\n  id: 7\n  name: "triangle"\n}' in (tmp_path / "out" / "label_map.pbtxt").read_text()
    assert metadata.label_map == {"disc": 1, "square": 3, "triangle": 7}
    assert metadata.objects.written == {"disc": 3, "square": 2, "triangle": 1} and metadata.objects.dropped == {}
    assert metadata.inputs.total == metadata.inputs.written == 4  # the image without objects is kept


@pytest.mark.parametrize("mode", ["stretch", "center_crop", "pad"])
def test_boxes_follow_the_pixels_in_every_resize_mode(tmp_path, mode):
    """PNG records (lossless), so the square's pixels are exact: its box is where they are."""
    keep_every_box = ("--min_visible=0",) if mode == "center_crop" else ()  # the others keep boxes whole
    metadata = run_pipeline(DETECTION / "coco" / "instances.json", tmp_path / "out", f"--resize_mode={mode}",
                            "--height=40", "--width=56", "--encoding=png", *keep_every_box)
    squares = 0
    for record in records(tmp_path / "out"):
        assert record["pixels"].shape == (40, 56, 3)
        for box in square_boxes(record):
            np.testing.assert_allclose(box, square_pixels_box(record["pixels"]), atol=1.0)
            squares += 1
    assert squares == metadata.objects.written["square"] == 2


def test_center_crop_drops_boxes_it_leaves_too_little_of_counted(tmp_path):
    """A 48x48 crop of the 96x64 street scene leaves 73% of its square and 75% of its triangle."""
    metadata = run_pipeline(DETECTION / "coco" / "instances.json", tmp_path / "out", "--resize_mode=center_crop",
                            "--height=48", "--width=48", "--min_visible=0.8", "--split_ratios=1,0,0")
    rows = [row for row in dead_letters(tmp_path / "out") if row["error"] == "BoxCroppedAway"]
    assert metadata.objects.dropped["BoxCroppedAway"] == len(rows) >= 2
    assert any(row["path"].endswith("street.jpg") for row in rows)
    annotations = len(json.loads((DETECTION / "coco" / "instances.json").read_text())["annotations"])
    assert sum(metadata.objects.written.values()) + sum(metadata.objects.dropped.values()) == annotations
    assert metadata.inputs.written == 4 and metadata.inputs.rejected == 0  # objects dropped, no image


def test_an_image_the_crop_leaves_no_objects_is_skipped_when_asked_and_counted(tmp_path):
    """At min_visible=0.8 the 48x48 crop drops both of street.jpg's objects: under
    --no_keep_empty_images it is skipped like empty.jpg, and images and objects still reconcile."""
    from pipeline.summary import inputs_line

    metadata = run_pipeline(DETECTION / "coco" / "instances.json", tmp_path / "out", "--resize_mode=center_crop",
                            "--height=48", "--width=48", "--min_visible=0.8", "--no_keep_empty_images",
                            "--split_ratios=1,0,0")
    rows = dead_letters(tmp_path / "out")
    skipped = {pathlib.Path(row["path"]).name: row["message"] for row in rows if row["error"] == "NoAnnotations"}
    assert skipped["street.jpg"].startswith("image skipped: all 2 of its objects were cut off by the center crop")
    assert sorted(skipped) == ["empty.jpg", "street.jpg"]
    assert sorted(record["image/source_id"].decode() for record in records(tmp_path / "out")) == ["2", "3"]
    assert metadata.inputs.total == 4 and (metadata.inputs.written, metadata.inputs.rejected) == (2, 2)
    assert metadata.inputs.errors == 0 and "2 without objects skipped" in inputs_line(metadata)
    cropped = [row for row in rows if row["error"] == "BoxCroppedAway"]
    assert metadata.objects.dropped == {"BoxCroppedAway": len(cropped)} and len(cropped) >= 2  # no row twice
    annotations = len(json.loads((DETECTION / "coco" / "instances.json").read_text())["annotations"])
    assert sum(metadata.objects.written.values()) + len(cropped) == annotations


def broken_coco(tmp_path: pathlib.Path) -> pathlib.Path:
    """The sample's images under an annotation file with one of each problem."""
    folder = tmp_path / "coco"
    shutil.copytree(DETECTION / "coco" / "images", folder / "images")
    shutil.copy(folder / "images" / "street.jpg", folder / "images" / "again.jpg")
    images = [{"id": 1, "file_name": "images/street.jpg", "width": 96, "height": 64},
              {"id": 2, "file_name": "images/pond.png", "width": 80, "height": 80},
              {"id": 3, "file_name": "images/pond.png", "width": 80, "height": 80},  # listed twice
              {"id": 4, "file_name": "images/empty.jpg", "width": 72, "height": 48},  # no objects
              {"id": 5, "file_name": "images/tall_exif6.jpg", "width": 96, "height": 64},  # its upright size
              {"id": 6, "file_name": "images/gone.jpg", "width": 10, "height": 10},  # no such file
              {"id": 7, "file_name": "images/again.jpg", "width": 96, "height": 64}]  # a copy of image 1
    box = {"iscrowd": 0, "area": 100.0}
    annotations = [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [8, 10, 30, 24], **box},
                   {"id": 2, "image_id": 1, "category_id": 3, "bbox": [90, 10, 30, 24], **box},  # past the edge
                   {"id": 3, "image_id": 1, "category_id": 3, "bbox": [8, 10, 0, 24], **box},  # no width
                   {"id": 4, "image_id": 1, "category_id": 99, "bbox": [8, 10, 30, 24], **box},  # unknown
                   {"id": 5, "image_id": 42, "category_id": 3, "bbox": [8, 10, 30, 24], **box},  # no image 42
                   {"id": 6, "image_id": 2, "category_id": 1, "bbox": [10, 10, 20, 20], **box},  # image refused
                   {"id": 7, "image_id": 1, "category_id": 3},  # no bbox
                   {"id": 8, "image_id": 5, "category_id": 3, "bbox": [10, 10, 20, 20], **box},
                   {"id": 9, "image_id": 7, "category_id": 3, "bbox": [8, 10, 30, 24], **box},
                   {"id": 10, "image_id": 6, "category_id": 3, "bbox": [1, 1, 2, 2], **box}]
    categories = [{"id": 1, "name": "disc"}, {"id": 3, "name": "square"}]
    path = folder / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


def test_every_annotation_problem_is_a_dead_letter_and_the_counts_reconcile(tmp_path):
    metadata = run_pipeline(broken_coco(tmp_path), tmp_path / "out", "--no_keep_empty_images",
                            "--max_error_fraction=1", "--split_ratios=1,0,0")
    rows = dead_letters(tmp_path / "out")
    by_error = {}
    for row in rows:
        by_error.setdefault(row["error"], []).append(row)
    assert metadata.objects.dropped == {"BoxOutsideImage": 1, "EmptyBox": 1, "UnknownCategory": 1,
                                        "MissingImage": 1, "ImageListedTwice": 1, "AnnotationFileProblem": 1,
                                        "SizeMismatch": 1, "UnreadableFile": 1}  # the last two with their image
    assert metadata.inputs.rejected_by_error == {"ImageListedTwice": 2, "NoAnnotations": 1, "SizeMismatch": 1,
                                                 "UnreadableFile": 1}
    assert "upright size after EXIF orientation 6" in by_error["SizeMismatch"][0]["message"]
    (empty,) = by_error["NoAnnotations"]
    assert empty["path"].endswith("empty.jpg")
    assert empty["message"].startswith("image skipped: it has no annotations (--keep_empty_images=false; pass "
                                       "--keep_empty_images to write it")
    assert metadata.inputs.total == 7 == metadata.inputs.written + metadata.inputs.rejected
    assert metadata.inputs.errors == 4  # skipping an image without objects is by request, not an error
    assert metadata.objects.written == {"square": 2}  # street.jpg's good square and its copy's
    assert metadata.duplicates.groups == 1  # the copy is reported, as for class folders
    assert len(rows) == sum(metadata.objects.dropped.values()) + metadata.inputs.rejected
    with_image = [row for row in by_error["SizeMismatch"] if row["stage"] == "object"]
    assert len(with_image) == 1 and "annotation 8 ('square'): dropped with its image: the annotation file declares" \
        in with_image[0]["message"]
    annotations = json.loads(broken_coco(tmp_path / "again").read_text())["annotations"]
    assert sum(metadata.objects.written.values()) + sum(metadata.objects.dropped.values()) == len(annotations)


def test_objects_of_images_dropped_late_are_counted_with_their_reason(tmp_path):
    """A duplicate dropped while planning and an image that fails to decode while converting take
    their objects with them, counted under their reasons: written + dropped = annotated."""
    path = broken_coco(tmp_path)
    png = path.parent / "images" / "pond.png"
    png.write_bytes(png.read_bytes()[:-200])  # the header reads; the pixels do not decode
    coco = json.loads(path.read_text())
    coco["images"] = [im for im in coco["images"] if im["id"] != 3]  # pond.png listed once: it is read
    path.write_text(json.dumps(coco))
    metadata = run_pipeline(path, tmp_path / "out", "--drop_duplicates", "--max_error_fraction=1",
                            "--split_ratios=1,0,0")
    assert metadata.inputs.rejected_by_error["DuplicateImage"] == 1
    assert metadata.inputs.rejected_by_error["CorruptImage"] == 1
    assert metadata.objects.dropped["DuplicateImage"] == 1  # again.jpg's square
    assert metadata.objects.dropped["CorruptImage"] == 1  # pond.png's disc
    assert metadata.objects.written == {"square": 1}
    rows = [row for row in dead_letters(tmp_path / "out") if row["stage"] == "object"]
    assert len(rows) == sum(metadata.objects.dropped.values())
    assert sum(metadata.objects.written.values()) + sum(metadata.objects.dropped.values()) == len(coco["annotations"])


def test_voc_folder_records(tmp_path):
    """VOC (found as such): class names get 1..N sorted, boxes are the 1-based inclusive pixel
    ranges, the source id is the file stem; difficult and truncated are listed in metadata like
    the other object features, so load_dataset gives them and verify checks them."""
    import imgrec

    voc = pathlib.Path(shutil.copytree(DETECTION / "voc", tmp_path / "voc"))
    xml = voc / "Annotations" / "000001.xml"
    xml.write_text(xml.read_text().replace("<difficult>0</difficult>", "<difficult>1</difficult>", 1)
                   .replace("<truncated>0</truncated>", "<truncated>1</truncated>", 1))
    metadata = run_pipeline(voc, tmp_path / "out", "--split_ratios=1,0,0")
    assert metadata.label_map == {"square": 1, "triangle": 2} and metadata.config["input"]["kind"] == "voc"
    found = records(tmp_path / "out")
    assert sorted(r["image/source_id"] for r in found) == [b"000001", b"000002", b"000003"]
    for record in found:
        for box in square_boxes(record):
            np.testing.assert_allclose(box, square_pixels_box(record["pixels"]), atol=1.5)
    assert (tmp_path / "out" / "label_map.csv").read_text() == "1,square\n2,triangle\n"
    flags = {}
    for _, _, extras in imgrec.load_dataset(str(tmp_path / "out"), "train", batch_size=None, with_metadata=True):
        flags[extras["source_id"].numpy().decode()] = [extras[role].numpy().tolist() for role in
                                                        ("difficult", "truncated")]
    assert flags["000001"][0][0] == flags["000001"][1][0] == 1 and not any(flags["000002"][0] + flags["000003"][1])
    done = run_verify(tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr


def test_voc_objects_reconcile_when_one_is_malformed(tmp_path):
    """Objects in the XML files = objects written + objects dropped, a malformed <object> included:
    it is dropped with its reason and its image's other objects are written."""
    voc = tmp_path / "voc"
    shutil.copytree(DETECTION / "voc", voc)
    xml = voc / "Annotations" / "000003.xml"
    xml.write_text(xml.read_text().replace("<xmin>21</xmin>", "<xmin>twenty</xmin>", 1))
    metadata = run_pipeline(voc, tmp_path / "out", "--split_ratios=1,0,0")
    annotated = sum(path.read_text().count("<object>") for path in (voc / "Annotations").glob("*.xml"))
    assert metadata.inputs.rejected == 0 and metadata.objects.dropped == {"AnnotationFileProblem": 1}
    assert sum(metadata.objects.written.values()) + 1 == annotated == 5
    (row,) = [row for row in dead_letters(tmp_path / "out") if row["stage"] == "object"]
    assert row["path"].endswith("000003.jpg") and "object 1: <bndbox/xmin> is 'twenty'" in row["message"]


def test_a_voc_image_named_by_two_annotation_files_is_refused(tmp_path):
    """Two XML files naming one image (a copied annotation file) are two listings of one file, as
    in COCO: which boxes are its is unknowable, so both are refused with their objects, not written
    as two records of one image with different boxes and one source id."""
    voc = tmp_path / "voc"
    shutil.copytree(DETECTION / "voc", voc)
    original = (voc / "Annotations" / "000001.xml").read_text()
    (voc / "Annotations" / "000001_copy.xml").write_text(original.replace("<xmin>9</xmin>", "<xmin>12</xmin>", 1))
    metadata = run_pipeline(voc, tmp_path / "out", "--max_error_fraction=1", "--split_ratios=1,0,0")
    assert sorted(r["image/source_id"] for r in records(tmp_path / "out")) == [b"000002", b"000003"]
    assert metadata.inputs.total == 4 and metadata.inputs.rejected_by_error == {"ImageListedTwice": 2}
    assert metadata.objects.dropped == {"ImageListedTwice": 4}  # two objects in each file
    annotated = sum(path.read_text().count("<object>") for path in (voc / "Annotations").glob("*.xml"))
    assert sum(metadata.objects.written.values()) + 4 == annotated


def test_detection_usage_errors_exit_2(tmp_path, capsys):
    from pipeline.run import main

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"images": [], "annotations": [], "categories": [{"id": 0, "name": "bg"}]}))
    assert main([f"--input={bad}", f"--output={tmp_path / 'out'}", "--input_kind=coco"]) == 2
    assert "ids start at 1" in capsys.readouterr().err
    assert main([f"--input={DETECTION / 'voc'}", f"--output={tmp_path / 'out'}", "--encoding=raw"]) == 2
    assert "jpeg or png" in capsys.readouterr().err


@pytest.mark.parametrize("root", ["typo", "instances.json"], ids=["missing", "a file"])
def test_an_images_root_that_is_no_folder_is_a_usage_error(tmp_path, capsys, root):
    """Before, a mistyped --images_root read every image in vain: exit 1, '4 of 4 images were
    rejected (UnreadableFile: 4)'. It is refused up front, as a missing --input folder is."""
    from pipeline.run import main

    images_root = DETECTION / "coco" / root
    code = main([f"--input={DETECTION / 'coco' / 'instances.json'}", f"--output={tmp_path / 'out'}",
                 f"--images_root={images_root}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith(f"imgrec: error: --images_root={images_root}: "), err
    assert not (tmp_path / "out").exists()
