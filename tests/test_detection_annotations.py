"""Reading COCO instances files, Pascal VOC folders and multi-label manifests: what becomes an
object, and the reason for everything that does not."""
from __future__ import annotations

import gzip
import json
import pathlib
import shutil
import tracemalloc

import pytest

from tests.helpers import REPO
from transforms.inputs import coco
from transforms.inputs.annotations import ObjectAnnotation, box_problem
from transforms.inputs.coco import AnnotationFileError, annotated_images, coco_rows
from transforms.inputs.manifests import ManifestError, multilabel_layout, parse_labels_line
from transforms.inputs.voc import labelled_voc_image, one_annotation_file_per_image, parse_voc, voc_label_map
from transforms.rejections import BadManifestLine

pytestmark = pytest.mark.unit

SAMPLE = REPO / "data" / "detection"
CATEGORIES = [{"id": 1, "name": "cat"}, {"id": 18, "name": "dog"}]


def write_coco(folder: pathlib.Path, images, annotations, categories=CATEGORIES) -> str:
    path = folder / "ann" / "instances.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return str(path)


def image(image_id: int, name: str = "", width: int = 100, height: int = 80) -> dict:
    return {"id": image_id, "file_name": name or f"{image_id}.jpg", "width": width, "height": height}


def annotation(ann_id: int, image_id: int, bbox, category: int = 1, **extra) -> dict:
    return {"id": ann_id, "image_id": image_id, "category_id": category, "bbox": bbox, "area": 10.0, "iscrowd": 0,
            **extra}


def reasons(rejections) -> list[tuple[str, str]]:
    return sorted((r.error, r.message) for r in rejections)


def test_the_coco_sample_reads_as_generated():
    label_map, images, rejections = annotated_images(str(SAMPLE / "coco" / "instances.json"), with_masks=True)
    assert label_map == {"disc": 1, "square": 3, "triangle": 7}  # COCO's category ids are the labels
    assert rejections == []
    by_name = {im.file_name: im for im in images}
    assert by_name["images/street.jpg"].path == str(SAMPLE / "coco" / "images" / "street.jpg")
    assert by_name["images/street.jpg"].source_id == "1"
    assert [(o.label, o.text, o.box) for o in by_name["images/street.jpg"].objects] == [
        (3, "square", (8.0, 10.0, 38.0, 34.0)), (7, "triangle", (50.0, 9.0, 90.0, 56.0))]
    assert [o.is_crowd for o in by_name["images/pond.png"].objects] == [0, 1]
    assert by_name["images/empty.jpg"].objects == ()


def test_every_annotation_problem_is_a_rejection_with_its_reason(tmp_path):
    listed = [image(1), image(2), image(3, "3.jpg"), image(4, "3.jpg"), image(5), image(5, "x.jpg")]
    path = write_coco(tmp_path, listed, [
        annotation(10, 1, [10, 10, 20, 20]),             # kept
        annotation(11, 1, [90, 10, 20, 20]),             # past the right edge
        annotation(12, 1, [10, 10, 0, 20]),              # no width
        annotation(13, 1, [10, 10, 5, 5], category=2),   # unknown category
        annotation(14, 9, [10, 10, 5, 5]),               # image 9 is not listed
        annotation(15, 3, [10, 10, 5, 5]),               # 3.jpg is listed as images 3 and 4
        annotation(16, 5, [10, 10, 5, 5]),               # image id 5 is listed twice
        annotation(17, 1, [1, 2, 3]),                    # not a box
        {"id": 18, "image_id": 1},                       # no category, no box
    ])
    _, images, rejections = annotated_images(path)
    assert [(im.source_id, [o.ref for o in im.objects]) for im in images] == [("1", ["annotation 10"]), ("2", [])]
    assert reasons(rejections) == [
        ("AnnotationFileProblem", "annotation 17 (image 1) needs a bbox of 4 numbers [x, y, width, height]; "
                                  "got [1, 2, 3]"),
        ("AnnotationFileProblem", "annotation 18 needs an integer image_id and category_id; "
                                  "got {'id': 18, 'image_id': 1}"),
        ("BoxOutsideImage", "annotation 11 ('cat'): box x 90..110, y 10..30 reaches past the 100x80 image"),
        ("EmptyBox", "annotation 12 ('cat'): box x 10..10, y 10..30 has no area"),
        ("ImageListedTwice", "3.jpg is listed 2 times (image ids 3, 4)"),
        ("ImageListedTwice", "3.jpg is listed 2 times (image ids 3, 4)"),
        ("ImageListedTwice", "annotation 15 refers to image id 3, whose file is listed twice"),
        ("ImageListedTwice", "annotation 16 refers to image id 5, which is listed twice"),
        ("ImageListedTwice", "image id 5 is listed 2 times (5.jpg, x.jpg)"),
        ("ImageListedTwice", "image id 5 is listed 2 times (5.jpg, x.jpg)"),
        ("MissingImage", "annotation 14 refers to image id 9, which the file does not list in a usable images entry"),
        ("UnknownCategory", "annotation 13: category id 2 is not one of the label map's 2 categories"),
    ]
    paths = {r.path for r in rejections if r.error == "MissingImage"}
    assert paths == {str(tmp_path / "ann" / "instances.json#annotations[4]")}


def test_a_box_past_the_image_by_less_than_g_shows_says_by_how_much():
    """x 50.0000001 + w 30 on an 80-wide image: `:g` printed 'box x 50..80 reaches past the 80x60
    image', which reads as false."""
    assert str(box_problem((50.0000001, 40, 80.0000001, 60), 80, 60)) == \
        "box x 50.0000001..80.0000001, y 40..60 reaches past the 80x60 image"
    assert str(box_problem((10, 10.5, 10, 30.0), 80, 60)) == "box x 10..10, y 10.5..30 has no area"


def test_the_annotations_of_a_refused_images_entry_are_not_said_to_be_unlisted(tmp_path):
    """Image 2 is listed, with a width of 80.0: its entry is refused, and its annotations' rows
    said 'refers to image id 2, which the file does not list'."""
    path = write_coco(tmp_path, [image(1), {**image(2), "width": 80.0}], [annotation(1, 2, [1, 1, 5, 5])])
    assert reasons(annotated_images(path)[2]) == [
        ("AnnotationFileProblem", f"{path}#images[1] (id 2) needs a positive integer width and height; got 80.0 x 80"),
        ("MissingImage", "annotation 1 refers to image id 2, which the file does not list in a usable images entry")]


def test_images_without_objects_are_kept_or_skipped_and_counted(tmp_path):
    path = write_coco(tmp_path, [image(1), image(2)], [annotation(1, 1, [0, 0, 100, 80]),
                                                       annotation(2, 2, [0, 0, 101, 80])])
    _, kept, rejected = annotated_images(path, keep_empty=True)
    assert [len(im.objects) for im in kept] == [1, 0] and reasons(rejected)[0][0] == "BoxOutsideImage"
    _, kept, rejected = annotated_images(path, keep_empty=False)
    assert [im.source_id for im in kept] == ["1"]
    assert [r.error for r in rejected] == ["BoxOutsideImage", "NoAnnotations"]
    assert rejected[1].message == ("image skipped: all 1 of its annotations were dropped (--keep_empty_images=false; "
                                   "pass --keep_empty_images to write it as an image without objects)")
    path = write_coco(tmp_path, [image(1)], [])
    _, kept, rejected = annotated_images(path, keep_empty=False)
    assert not kept and [(r.error, r.message) for r in rejected] == [(
        "NoAnnotations", "image skipped: it has no annotations (--keep_empty_images=false; pass --keep_empty_images "
        "to write it as an image without objects)")]


def test_coco_images_take_the_category_names_made_once_for_every_image():
    from transforms.inputs.discover_annotated import category_names, coco_image

    names = category_names({"cat": 1, "dog": 18})
    assert names == {1: "cat", 18: "dog"}
    listing = coco.CocoImage(7, "a.jpg", 100, 80, "/d/a.jpg")
    objects = [coco.CocoAnnotation(7, f"f#annotations[{i}]", ObjectAnnotation(f"annotation {i}", (1, 1, 9, 9),
                                                                              label, ""))
               for i, label in enumerate((18, 5))]
    rejection, candidate = coco_image((7, {"listings": [("image", listing)], "annotations": objects}), names, True)
    assert [obj.text for obj in candidate.annotations.objects] == ["dog"]
    assert rejection.value.error == "UnknownCategory"


def test_an_object_of_a_category_class_names_left_out_is_not_said_to_be_missing_from_the_file(tmp_path):
    """--class_names=dog on a file of 2 categories: a cat is not in the label map, which the file's
    categories are not the whole of."""
    from transforms.inputs.discover_annotated import category_names, coco_categories

    names = category_names(coco_categories(write_coco(tmp_path, [], []), ("dog",)))
    _, refused = coco.image_of_id([("image", coco.CocoImage(7, "a.jpg", 100, 80, "/d/a.jpg"))], [coco.CocoAnnotation(
        7, "f#annotations[0]", ObjectAnnotation("annotation 3", (1, 1, 9, 9), 1, ""))], names, True)
    assert reasons(refused) == [("UnknownCategory", "annotation 3: category id 1 is not one of the label map's 1 "
                                                    "categories")]


def test_file_names_resolve_against_the_file_or_the_images_root(tmp_path):
    path = write_coco(tmp_path, [image(1, "a/1.jpg"), image(2, "/abs/2.jpg")], [])
    assert [im.path for im in annotated_images(path)[1]] == [str(tmp_path / "ann" / "a" / "1.jpg"), "/abs/2.jpg"]
    assert [im.path for im in annotated_images(path, images_root=str(tmp_path / "imgs"))[1]] == [
        str(tmp_path / "imgs" / "a" / "1.jpg"), "/abs/2.jpg"]


@pytest.mark.parametrize("text, message", [
    ('{"images": [', "is not valid JSON"),
    ('{"images": [], "categories": [{"id": 0, "name": "bg"}]}', "ids start at 1"),
    ('{"images": [], "categories": [{"id": 1, "name": "a"}, {"id": 1, "name": "b"}]}', "named both 'a' and 'b'"),
    ('{"images": [], "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "a"}]}', "has ids 1 and 2"),
    ('{"images": [], "categories": []}', "lists no categories"),
    ('[1, 2]', "lists no categories"),
])
def test_a_file_that_is_not_coco_is_a_clear_error(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(AnnotationFileError, match=message):
        annotated_images(str(path))


def test_a_file_that_is_not_json_is_named_in_one_line(tmp_path):
    """A CSV given --input_kind=coco: the JSON parser's message spans three lines (the text and a
    caret under it); a usage error is one line."""
    path = tmp_path / "tags.csv"
    path.write_text("path,labels\na.jpg,cat|dog\n")
    from transforms.inputs.discover_annotated import coco_categories  # the driver's read

    for read in (lambda: annotated_images(str(path)), lambda: coco_categories(str(path))):
        with pytest.raises(AnnotationFileError, match="is not valid JSON") as raised:
            read()
        assert "\n" not in str(raised.value), str(raised.value)


def test_a_gzipped_coco_file_is_named_in_one_clear_line(tmp_path):
    """yajl's message about bytes that are not UTF-8 comes as bytes: the line showed their repr,
    "b'lexical error: invalid char in json text.\\n   \\x1f\\x8b..."."""
    path = tmp_path / "instances.json.gz"
    path.write_bytes(gzip.compress(b'{"images": []}'))
    with pytest.raises(AnnotationFileError) as raised:
        coco.coco_label_map(str(path))
    assert str(raised.value) == f"{path} is not valid JSON: lexical error: invalid char in json text."


def test_the_drivers_read_refuses_a_number_the_workers_read_cannot_parse(tmp_path):
    """1e999 overflows a float (the workers' parse) but not a Decimal: the driver's read of the
    categories passed it, and the run failed inside the pipeline with a traceback."""
    path = tmp_path / "big.json"
    path.write_text('{"annotations": [{"id": 1, "bbox": [1e999, 0, 1, 1]}], "categories": [{"id": 1, "name": "a"}]}')
    for read in (lambda: list(coco_rows(str(path))), lambda: coco.coco_label_map(str(path))):
        with pytest.raises(AnnotationFileError, match="is not valid JSON: parse error: numeric"):
            read()


def test_a_coco_file_saved_with_a_utf8_bom_is_coco(tmp_path):
    """Windows editors save JSON with a BOM, and manifests take one: such a COCO file was not
    recognised (converted as a JSONL manifest: 'BadManifestLine: 1') and --input_kind=coco refused
    it as not JSON."""
    plain = write_coco(tmp_path, [image(1)], [annotation(1, 1, [1, 1, 5, 5])])
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + pathlib.Path(plain).read_bytes())
    assert coco.looks_like_coco(str(path))
    assert coco.coco_label_map(str(path)) == {"cat": 1, "dog": 18}
    assert [row.obj.box for row in coco_rows(str(path)) if isinstance(row, coco.CocoAnnotation)] == [(1, 1, 6, 6)]


def test_an_element_nested_past_max_depth_is_refused_in_bounded_memory(tmp_path):
    """ijson.parse keeps a prefix string per open level: 300,000 nested brackets in one annotation
    (a 600 kB file) took 24 GB in the driver's read of the categories, and 20,000 failed the run
    on a RecursionError where Beam pickled the annotation."""
    nested = "[" * 5000 + "]" * 5000
    path = tmp_path / "deep.json"
    path.write_text('{"images": [], "annotations": [{"id": 1, "segmentation": %s}, 7], '
                    '"categories": [{"id": 1, "name": "a"}]}' % nested)
    tracemalloc.start()
    try:
        rows = list(coco_rows(str(path)))
        assert coco.coco_label_map(str(path)) == {"a": 1} and coco.looks_like_coco(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak
    assert [(row.error, row.message) for row in rows] == [
        ("ElementTooLarge", "annotations[0] nests deeper than 16 levels"),
        ("AnnotationFileProblem", f"{path}#annotations[1] is not an object: 7")]


def test_an_oversized_element_is_skipped_not_built(tmp_path, monkeypatch):
    monkeypatch.setattr(coco, "MAX_ELEMENT_VALUES", 50)
    big = annotation(2, 1, [1, 1, 5, 5], segmentation=[list(range(60))])
    path = write_coco(tmp_path, [image(1)], [annotation(1, 1, [1, 1, 5, 5]), big, annotation(3, 1, [2, 2, 5, 5])])
    rows = list(coco_rows(path))
    assert [r.obj.ref for r in rows if isinstance(r, coco.CocoAnnotation)] == ["annotation 1", "annotation 3"]
    (rejected,) = [r for r in rows if not isinstance(r, (tuple, coco.CocoImage, coco.CocoAnnotation))]
    assert (rejected.error, rejected.message) == ("ElementTooLarge", "annotations[1] holds more than 50 values")


def test_segmentations_are_read_only_for_masks(tmp_path):
    path = write_coco(tmp_path, [image(1)], [
        annotation(1, 1, [1, 1, 5, 5], segmentation=[[1, 1, 6, 1, 6, 6]]),
        annotation(2, 1, [1, 1, 5, 5], segmentation={"size": [80, 100], "counts": "abc"}),
        annotation(3, 1, [1, 1, 5, 5], segmentation={"size": [80, 100], "counts": [8000]}),
        annotation(4, 1, [1, 1, 5, 5], segmentation="nonsense"),
    ])
    assert [o.segmentation for o in annotated_images(path)[1][0].objects] == [None] * 4
    _, (img,), rejected = annotated_images(path, with_masks=True)
    assert [type(o.segmentation).__name__ for o in img.objects] == ["Polygons", "RunLengths", "RunLengths"]
    assert reasons(rejected) == [("BadSegmentation", "annotation 4 (image 1): segmentation is neither polygons "
                                                     "nor an RLE: 'nonsense'")]


def voc_file(tmp_path, text: str) -> tuple[bytes, str]:
    path = tmp_path / "VOC" / "Annotations" / "x1.xml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path.read_bytes(), str(path)


def test_voc_boxes_are_one_based_and_inclusive():
    xml = SAMPLE / "voc" / "Annotations" / "000003.xml"
    parsed, names, malformed = parse_voc(xml.read_bytes(), str(xml))
    assert names == ["square", "triangle"] and malformed == ()
    assert parsed.path == str(SAMPLE / "voc" / "JPEGImages" / "000003.jpg") and parsed.source_id == "000003"
    assert [(o.text, o.box) for o in parsed.objects] == [("triangle", (20.0, 12.0, 60.0, 52.0)),
                                                          ("square", (62.0, 2.0, 78.0, 18.0))]
    label_map = voc_label_map(["triangle", "square", "square"])
    assert label_map == {"square": 1, "triangle": 2}
    labelled, rejected = labelled_voc_image(parsed, {"triangle": 2})
    assert [(o.label, o.text) for o in labelled.objects] == [(2, "triangle")]
    assert reasons(rejected) == [("UnknownCategory", "object 2 ('square'): class 'square' is not one of the 1 "
                                                     "configured classes")]


def test_a_voc_box_at_a_zero_based_edge_is_at_the_edge_and_one_past_it_is_outside(tmp_path):
    """0-based tools write 0 for objects touching the left or top edge; -1 is outside either way."""
    objects = "".join(f"<object><name>cat</name><bndbox><xmin>{x}</xmin><ymin>0</ymin><xmax>9</xmax>"
                      f"<ymax>9</ymax></bndbox></object>" for x in (0, -1))
    data, path = voc_file(tmp_path, f"<annotation><size><width>20</width><height>10</height></size>{objects}"
                                    "</annotation>")
    parsed, _, _ = parse_voc(data, path)
    assert [o.box for o in parsed.objects] == [(0.0, 0.0, 9.0, 9.0), (-2.0, 0.0, 9.0, 9.0)]
    labelled, rejected = labelled_voc_image(parsed, {"cat": 1})
    assert [o.box for o in labelled.objects] == [(0.0, 0.0, 9.0, 9.0)]
    assert [error for error, _ in reasons(rejected)] == ["BoxOutsideImage"]


def test_a_malformed_voc_object_is_dropped_and_the_others_go_on(tmp_path):
    """As a malformed COCO entry is: one <object> without a numeric box is a row of its own, and
    the file's other objects are kept (refusing the image lost them from the object counts)."""
    obj = "<object><name>cat</name><bndbox><xmin>{}</xmin><ymin>2</ymin><xmax>9</xmax><ymax>9</ymax></bndbox></object>"
    data, xml_path = voc_file(tmp_path, "<annotation><filename>a.jpg</filename><size><width>20</width><height>20"
                                        "</height></size>" + obj.format(2) + obj.format("x") + obj.format(3)
                                        + "<object><bndbox/></object></annotation>")
    parsed, names, malformed = parse_voc(data, xml_path)
    assert [o.ref for o in parsed.objects] == ["object 1", "object 3"] and names == ["cat"]
    assert [(r.error, r.stage, r.path, r.message) for r in malformed] == [
        ("AnnotationFileProblem", "object", parsed.path, f"{xml_path}: object 2: <bndbox/xmin> is 'x', not a number"),
        ("AnnotationFileProblem", "object", parsed.path, f"{xml_path}: object 4: no <name>")]


def test_hidden_and_macos_dot_underscore_voc_files_are_skipped_as_in_class_folders(tmp_path):
    """A VOC folder copied from a Mac to a FAT or SMB disk has a binary ._x1.xml beside each file:
    each was an AnnotationFileProblem (an error, so the run failed its error budget) naming an
    image JPEGImages/._x1.jpg that no one wrote."""
    from transforms.inputs.discover_annotated import parse_voc_file

    folder = tmp_path / "VOC" / "Annotations"
    folder.mkdir(parents=True)
    for name in ("._x1.xml", ".x1.xml"):
        (folder / name).write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        ")
        (found,) = parse_voc_file(str(folder / name))
        assert found.tag == "rejected" and (found.value.error, found.value.path) == ("SkippedFile", str(folder / name))


def test_a_voc_filename_resolves_as_a_coco_file_name_does():
    """<filename>./a.jpg</filename> was JPEGImages/./a.jpg: another listing than a.jpg (the image
    written once per XML file, not refused as named twice), and no key on an object store."""
    for root in ("/data/VOC", "s3://bucket/VOC"):
        parsed = [parse_voc(f"<annotation><filename>{name}</filename><size><width>9</width><height>9</height></size>"
                            "</annotation>".encode(), f"{root}/Annotations/{i}.xml")[0]
                  for i, name in enumerate(("a.jpg", "./a.jpg", "sub/../a.jpg" if root[0] == "/" else "a.jpg"))]
        assert {image.path for image in parsed} == {f"{root}/JPEGImages/a.jpg"}


def test_every_file_in_annotations_is_an_input_an_upper_case_xml_one_too(tmp_path):
    """Annotations/*.xml was matched case-sensitively: 000001.XML, a README and a folder's files
    there were neither converted nor reported (a folder of .XML files: '0 inputs found')."""
    from transforms.inputs.discover_annotated import parse_voc_file, voc_files

    root = tmp_path / "voc"
    shutil.copytree(SAMPLE / "voc", root)
    (root / "Annotations" / "000001.xml").rename(root / "Annotations" / "000001.XML")
    (root / "Annotations" / "README.txt").write_text("labelled with LabelImg")
    (root / "Annotations" / "old").mkdir()
    shutil.copy(root / "Annotations" / "000002.xml", root / "Annotations" / "old" / "000002.xml")
    listed = voc_files(str(root))
    assert [str(pathlib.Path(path).relative_to(root / "Annotations")) for path in listed] == [
        "000001.XML", "000002.xml", "000003.xml", "README.txt", "old/000002.xml"]
    found = [row for path in listed for row in parse_voc_file(path)]
    assert sorted(row[0].source_id for row in found if isinstance(row, tuple)) == ["000001", "000002", "000003"]
    skipped = [(r.value.error, r.value.path, r.value.message) for r in found if not isinstance(r, tuple)]
    nested = "in a folder inside Annotations/, which VOC does not nest: not read"
    assert skipped == [("SkippedFile", listed[-2], "extension not in .xml"), ("SkippedFile", listed[-1], nested)]


def test_voc_difficult_and_truncated_flags_are_read_as_written_or_refused(tmp_path):
    """<difficult>false</difficult> was kept as difficult 1 (any text but 0), which evaluators skip."""
    obj = "<object><name>cat</name>{}<bndbox><xmin>2</xmin><ymin>2</ymin><xmax>9</xmax><ymax>9</ymax></bndbox></object>"
    flags = ["", "<difficult>1</difficult><truncated>0</truncated>", "<difficult> False </difficult>",
             "<truncated>true</truncated>", "<difficult>yes</difficult>"]
    data, xml_path = voc_file(tmp_path, "<annotation><size><width>20</width><height>20</height></size>"
                                        + "".join(obj.format(flag) for flag in flags) + "</annotation>")
    parsed, _, malformed = parse_voc(data, xml_path)
    assert [(o.difficult, o.truncated) for o in parsed.objects] == [(0, 0), (1, 0), (0, 0), (0, 1)]
    assert [r.message for r in malformed] == [f"{xml_path}: object 5: <difficult> is 'yes', not 0 or 1"]


def test_a_voc_image_two_files_name_is_refused_with_each_files_objects(tmp_path):
    one = parse_voc(*voc_file(tmp_path, "<annotation><filename>a.jpg</filename><size><width>20</width><height>20"
                                        "</height></size><object><name>cat</name><bndbox><xmin>2</xmin><ymin>2</ymin>"
                                        "<xmax>9</xmax><ymax>9</ymax></bndbox></object></annotation>"))[:2]
    assert one_annotation_file_per_image([one]) == (one, ())
    kept, rows = one_annotation_file_per_image([one, one])
    message = "a.jpg is named by 2 annotation files (<filename>a.jpg</filename>)"
    assert kept is None and [(r.error, r.stage, r.path, r.message) for r in rows] == [
        ("ImageListedTwice", "annotation", one[0].path, message),
        ("ImageListedTwice", "object", one[0].path, f"object 1 ('cat'): dropped with its image: {message}")] * 2


BOMB = """<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>
<annotation><filename>&lol2;</filename></annotation>"""
EXTERNAL = """<?xml version="1.0"?><!DOCTYPE a [<!ENTITY e SYSTEM "file:///etc/passwd">]><annotation>&e;</annotation>"""


@pytest.mark.parametrize("text, message", [
    (BOMB, "DTDForbidden"),
    (EXTERNAL, "DTDForbidden"),
    ("<annotation><size>", "not readable XML: ParseError"),
    ("<notvoc/>", "the root element is <notvoc>"),
    ("<annotation><size><width>10</width></size></annotation>", "no <size/height>"),
])
def test_a_voc_file_that_cannot_be_read_is_refused_with_its_reason(tmp_path, text, message):
    from transforms.inputs.annotations import AnnotationFileProblem

    with pytest.raises(AnnotationFileProblem, match=message):
        parse_voc(*voc_file(tmp_path, text))


def test_multilabel_csv_and_jsonl_lines(tmp_path):
    manifest = str(tmp_path / "m.csv")
    layout = multilabel_layout("path,tags", "csv")
    candidate, labels = parse_labels_line("a.jpg, dog | cat|dog", layout, manifest)
    assert (candidate.path, candidate.label, labels) == (str(tmp_path / "a.jpg"), "cat|dog", ("cat", "dog"))
    for blank in ("a.jpg,|", "a.jpg, | "):  # a cell must name a label, as an empty one does not (JSONL [] for none)
        with pytest.raises(BadManifestLine, match="names no label"):
            parse_labels_line(blank, layout, manifest)
    layout = multilabel_layout('{"image": "a.jpg", "labels": ["x"]}', "jsonl")
    assert parse_labels_line('{"image": "b.jpg", "labels": ["y", 3, "y"]}', layout, manifest)[1] == ("3", "y")
    assert parse_labels_line('{"image": "b.jpg", "labels": []}', layout, manifest)[1] == ()
    for bad in ('{"image": "b.jpg", "labels": "y"}', '{"image": "b.jpg", "labels": ["a|b"]}', "{"):
        with pytest.raises(BadManifestLine):
            parse_labels_line(bad, layout, manifest)
    with pytest.raises(ManifestError, match="names no path column"):
        multilabel_layout("path,label", "csv")


def test_manifest_columns_name_a_multilabel_manifests_columns(tmp_path):
    """--manifest_columns was ignored with --multi_label: a header 'img_file,lbls' was refused as
    naming no path column even when the flag named both."""
    from transforms.inputs.manifests import manifest_layout
    from transforms.specs import InputSpec

    for name, first, line in (("m.csv", "img_file,lbls,other", "a.jpg,cat|dog,x"),
                              ("m.jsonl", '{"img_file": "a.jpg", "lbls": ["x"]}', '{"img_file": "a.jpg", "lbls": '
                                                                                    '["dog", "cat"]}')):
        manifest = tmp_path / name
        manifest.write_text(f"{first}\n{line}\n")
        spec = InputSpec(str(manifest), multi_label=True, manifest_columns=("img_file", "lbls"))
        layout = manifest_layout(spec, spec.resolved_kind)
        candidate, labels = parse_labels_line(line, layout, str(manifest))
        assert (candidate.path, labels) == (str(tmp_path / "a.jpg"), ("cat", "dog"))
    (tmp_path / "m.csv").write_text("img_file,labels\n")
    with pytest.raises(ManifestError, match="no column lbls"):
        manifest_layout(InputSpec(str(tmp_path / "m.csv"), multi_label=True, manifest_columns=("img_file", "lbls")),
                        "csv")


def test_an_images_objects_keep_the_files_order_past_ten_annotations(tmp_path):
    """create_coco_tf_record.py writes objects in the file's order; sorting entries by their place's
    text put annotations[10] before annotations[8]."""
    boxes = [[i * 8, 0, 4, 4] for i in range(12)]
    path = write_coco(tmp_path, [image(1)], [annotation(100 + i, 1, box) for i, box in enumerate(boxes)])
    (only,) = annotated_images(path)[1]
    assert [o.ref for o in only.objects] == [f"annotation {100 + i}" for i in range(12)]


def test_a_voc_folder_whose_path_has_wildcard_characters_lists_its_files(tmp_path):
    """Beam reads `[`, `*` and `?` in a match pattern as wildcards: `data[1]/Annotations/*.xml`
    matched nothing, so such a VOC folder converted no image."""
    from transforms.inputs.discover_annotated import voc_files

    root = tmp_path / "voc[2012]?"
    shutil.copytree(SAMPLE / "voc", root)
    assert voc_files(str(root)) == [str(root / "Annotations" / f"00000{i}.xml") for i in (1, 2, 3)]
