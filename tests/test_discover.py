"""transforms.inputs.discover without a pipeline: which names are inputs, manifest headers and lines, and
walking local class folders (nested, symlinked, hidden, broken) so that every path is accounted for.
DiscoverImages itself runs in tests/test_transforms.py."""
from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Iterator

import apache_beam as beam
import pytest

from tests.helpers import split_found, write_image, write_text
from transforms.batches import BATCH, batched
from transforms.inputs.discover import (
    LOOP,
    ClassFolder,
    OutputFolder,
    classify_glob_match,
    classify_remote,
    glob_candidates,
    glob_matches,
    glob_root,
    label_from_parent,
    list_local_root,
    manifest_rows,
    match_glob,
    reject,
    resolve_listings,
    skip_reason,
    walk_class_folder,
)
from transforms.inputs.manifests import (
    LABEL_COLUMNS,
    MAX_LINE_BYTES,
    PATH_COLUMNS,
    ManifestError,
    ManifestLayout,
    csv_layout,
    first_line,
    header_text,
    jsonl_layout,
    manifest_layout,
    manifest_lines,
    parse_manifest_line,
)
from transforms.refs import Candidate
from transforms.rejections import BadManifestLine, SkippedFile
from transforms.specs import InputSpec

pytestmark = pytest.mark.unit

EXTENSIONS = tuple(InputSpec("x").extensions)
MANIFEST = "/data/manifests/train.csv"
CSV = ManifestLayout("csv", 0, 1)
JSONL = jsonl_layout(None)  # no first line to choose from: "path" and "label"


@pytest.mark.parametrize("name,reason", [
    ("a.jpg", None), ("B.PNG", None), ("c.JpEg", None), ("d.tiff", None), ("e.gif", None),
    ("._a.jpg", "macOS AppleDouble metadata file, not an image"),
    (".hidden.jpg", "hidden file"), (".DS_Store", "hidden file"),
    ("README.md", "extension not in"), ("photo.jpg.txt", "extension not in"), ("jpg", "extension not in"),
])
def test_skip_reason(name, reason):
    found = skip_reason(name, EXTENSIONS)
    assert found == reason if reason is None else found.startswith(reason)


@pytest.mark.parametrize("path,label", [
    ("/data/cat/1.jpg", "cat"), ("gs://b/root/dog/x.png", "dog"), ("rel/fish/2.jpg", "fish"),
    ("/data/dog\\v2/e.png", "dog\\v2"), ("/data/cat/b\\c.png", "cat"),  # on POSIX a backslash is a character
])
def test_label_from_parent(path, label):
    assert label_from_parent(path) == label


def test_the_output_owns_only_what_imgrec_wrote():
    output = OutputFolder("/data/out", frozenset({"index", "train-00000-of-00001.tfrecord"}))
    assert output.owns("/data/out/index/train-00000-of-00001.tfrecord.idx")
    assert output.owns("/data/out/train-00000-of-00001.tfrecord")
    assert output.owns("/data/out/metadata.json.tmp-123")
    assert not output.owns("/data/out/cat/x.jpg")  # the user's file: an input
    assert not output.owns("/data/outside/index/x.jpg")
    assert not output.owns("/data/out")


# ----------------------------------------------------------------------------- manifests

@pytest.mark.parametrize("first_line,expected", [
    (None, ManifestLayout("csv", 0, 1)),  # empty file
    ("cat/1.jpg,cat", ManifestLayout("csv", 0, 1)),  # no header: data from the first line
    ("path,label", ManifestLayout("csv", 0, 1, header=("path", "label"))),
    ("filename,class", ManifestLayout("csv", 0, 1, header=("filename", "class"))),
    ("\ufeffFile_Path , Category", ManifestLayout("csv", 0, 1, header=("file_path", "category"))),  # BOM, case
    ("label,path", ManifestLayout("csv", 1, 0, header=("label", "path"))),
    ("id,image,width,class_name", ManifestLayout("csv", 1, 3, header=("id", "image", "width", "class_name"))),
    # Two label-like columns: the preferred name, as for JSONL keys, not the first column.
    ("path,class,label", ManifestLayout("csv", 0, 2, header=("path", "class", "label"))),
    ("image,path,label", ManifestLayout("csv", 1, 2, header=("image", "path", "label"))),
    ("image,image_path,label", ManifestLayout("csv", 1, 2, header=("image", "image_path", "label"))),
    ("path,label,", ManifestLayout("csv", 0, 1, header=("path", "label"))),  # trailing commas name no column
    ("a.jpg,cat,,", ManifestLayout("csv", 0, 1)),  # nor make a first data line a header
    ("a.jpg,", ManifestLayout("csv", 0, 1)),  # a first line naming an image is data (here a bad line)
])
def test_csv_layout_recognises_headers(first_line, expected):
    assert csv_layout(first_line, None, EXTENSIONS) == expected


@pytest.mark.parametrize("first_line", ["foo,bar", "path,name", "a.txt,cat", "x"])
def test_an_unrecognised_csv_header_is_refused_naming_the_accepted_ones(first_line):
    with pytest.raises(ManifestError) as info:
        csv_layout(first_line, None, EXTENSIONS)
    message = str(info.value)
    assert "not recognised" in message and "--manifest_columns" in message
    assert all(name in message for name in (*PATH_COLUMNS, *LABEL_COLUMNS))


@pytest.mark.parametrize("first_line,hint", [("path;label", "separated by tabs or semicolons"),
                                             ("path\tlabel", "separated by tabs or semicolons"),
                                             ("path,label\ra.jpg,cat", "carriage return alone")])
def test_an_unrecognised_header_says_what_the_line_suggests(first_line, hint):
    with pytest.raises(ManifestError, match=hint):
        csv_layout(first_line, None, EXTENSIONS)


def test_a_header_csv_cannot_split_is_unrecognised_and_quoted_short():
    header = "x" * 140_000  # one cell over csv's field size limit (128 KiB)
    with pytest.raises(ManifestError, match="not recognised") as info:
        csv_layout(header, None, EXTENSIONS)
    assert len(str(info.value)) < 1000


@pytest.mark.parametrize("first_line", ["path,path,label", "file,label,Label", "Path,path ,label"])
def test_a_csv_header_naming_its_path_or_label_column_twice_is_refused(first_line):
    """Which file (or label) is meant would be a guess; names compare as JSONL keys do."""
    with pytest.raises(ManifestError, match="has 2 columns named"):
        csv_layout(first_line, None, EXTENSIONS)


@pytest.mark.parametrize("columns", [("path", "path"), ("path", " PATH")])
def test_manifest_columns_naming_one_column_twice_are_refused(columns):
    """Every file would be labelled by its own path."""
    for layout in (lambda: csv_layout("path,label", columns, EXTENSIONS), lambda: jsonl_layout(None, columns)):
        with pytest.raises(ManifestError, match="names the same column for the path and the label"):
            layout()


def test_a_space_before_a_quoted_cell_is_no_part_of_it():
    """`a.png, "cat"` is the label cat (not '"cat"', a second class), `b.png, "dog, big"` one label."""
    assert parse_manifest_line('a.png, "cat"', CSV, MANIFEST) == Candidate("/data/manifests/a.png", "cat")
    assert parse_manifest_line('b.png, "dog, big"', CSV, MANIFEST) == Candidate("/data/manifests/b.png", "dog, big")


@pytest.mark.parametrize("first_line,expected", [
    ('{"path": "a.jpg", "label": "cat", "category": "animal"}', ("path", "label")),
    ('{"category": "animal", "Image": "a.jpg", "file_path": "b.jpg"}', ("file_path", "category")),
    ('{" Path ": "a.jpg", "Label": "cat"}', (" Path ", "Label")),
    ("not json", ("path", "label")), ("[1]", ("path", "label")), (None, ("path", "label")),
])
def test_jsonl_keys_are_chosen_once_per_file_from_its_first_line(first_line, expected):
    assert jsonl_layout(first_line) == ManifestLayout("jsonl", *expected)


def test_a_jsonl_line_without_the_files_label_key_is_a_bad_line_not_labelled_by_another():
    """Chosen line by line, a line without "label" was labelled by its "category" (a new class)."""
    layout = jsonl_layout('{"path": "a.jpg", "label": "cat", "category": "animal"}')
    with pytest.raises(BadManifestLine):
        parse_manifest_line('{"path": "c.jpg", "category": "animal"}', layout, MANIFEST)
    with pytest.raises(BadManifestLine):
        parse_manifest_line('{"image": "c.jpg", "label": "cat"}', layout, MANIFEST)


@pytest.mark.parametrize("line", [b",,\n", b" , ,\r\n", b"\xef\xbb\xbf,,\n"])
def test_a_row_of_empty_cells_is_blank(line):
    """A spreadsheet's empty row: no file, so no input (it was a BadManifestLine, and before a
    header it turned the header off)."""
    lines = [line, b"path,label\n", line, b"cat/a.jpg,cat\n", line]
    assert header_text(line) == ""
    rows, rejected = split_found(manifest_rows(lines, ManifestLayout("csv", 0, 1, header=("path", "label")), MANIFEST))
    assert rows == [("/data/manifests/cat/a.jpg", ("cat", 4, "/data/manifests/cat/a.jpg"))] and rejected == []


def test_manifest_columns_pick_named_columns():
    assert csv_layout("a,Pic,b,Kind", ("pic", "kind"), EXTENSIONS) == ManifestLayout(
        "csv", 1, 3, header=("a", "pic", "b", "kind"))
    with pytest.raises(ManifestError, match="has no column kind"):
        csv_layout("a,pic,b", ("pic", "kind"), EXTENSIONS)
    assert jsonl_layout(None, ("file", "y")) == ManifestLayout("jsonl", "file", "y")


@pytest.mark.parametrize("layout,line,expected", [
    (CSV, "cat/1.jpg,cat", Candidate("/data/manifests/cat/1.jpg", "cat")),
    (CSV, "../img/1.jpg, dog ", Candidate("/data/img/1.jpg", "dog")),  # normalized
    (CSV, "/abs/1.jpg,cat", Candidate("/abs/1.jpg", "cat")),
    (CSV, "gs://bucket/a/1.jpg,cat", Candidate("gs://bucket/a/1.jpg", "cat")),
    (CSV, '"my dir/a,b.jpg",cat', Candidate("/data/manifests/my dir/a,b.jpg", "cat")),
    (CSV, '"q.jpg","lab,el"', Candidate("/data/manifests/q.jpg", "lab,el")),
    (ManifestLayout("csv", 2, 0, header=("class", "n", "path", "notes")), "dog,7,x.jpg,extra",
     Candidate("/data/manifests/x.jpg", "dog")),
    (ManifestLayout("csv", 0, 1, header=("path", "label", "notes")), "x.jpg,dog",  # trailing cells may be left out
     Candidate("/data/manifests/x.jpg", "dog")),
    # empty cells past the header's (a spreadsheet's export) moved nothing
    (ManifestLayout("csv", 0, 1, header=("path", "label")), "x.jpg,dog,,", Candidate("/data/manifests/x.jpg", "dog")),
    (CSV, "x.jpg,dog,", Candidate("/data/manifests/x.jpg", "dog")),
    (JSONL, '{"path": "cat/1.jpg", "label": "cat"}', Candidate("/data/manifests/cat/1.jpg", "cat")),
    (JSONL, '{"path": "/abs/1.jpg", "label": 0}', Candidate("/abs/1.jpg", "0")),
    (JSONL, '{"path": "gs://b/1.jpg", "label": 12, "x": 1}', Candidate("gs://b/1.jpg", "12")),
    (JSONL, '{"path": "a,b.jpg", "label": "猫"}', Candidate("/data/manifests/a,b.jpg", "猫")),
    (JSONL, '{"path": "a.jpg", "label": " cat\\t"}', Candidate("/data/manifests/a.jpg", "cat")),  # as CSV strips
    (JSONL, '{" Path ": "a.jpg", "label ": "cat"}', Candidate("/data/manifests/a.jpg", "cat")),  # as CSV names
    (jsonl_layout('{"Filename": "x.jpg", "Class": "dog"}'), '{"Filename": "a.jpg", "Class": "cat"}',
     Candidate("/data/manifests/a.jpg", "cat")),
    (jsonl_layout(None, ("file", "y")), '{"file": "a.jpg", "y": "cat", "label": "no"}',
     Candidate("/data/manifests/a.jpg", "cat")),
    # --manifest_columns in any case, as for a CSV header; the exact spelling first
    (jsonl_layout(None, ("file", "y")), '{"File": "a.jpg", "Y": "cat"}', Candidate("/data/manifests/a.jpg", "cat")),

    # A key given twice only matters where it is used.
    (JSONL, '{"path": "a.jpg", "label": "cat", "meta": {"x": 1, "x": 2}, "n": 1, "n": 2}',
     Candidate("/data/manifests/a.jpg", "cat")),
])
def test_parse_manifest_line(layout, line, expected):
    assert parse_manifest_line(line, layout, MANIFEST) == expected


def test_manifest_paths_on_object_stores_resolve_against_the_manifest_folder():
    assert parse_manifest_line("cat/1.jpg,cat", CSV, "gs://bucket/lists/train.csv") == Candidate(
        "gs://bucket/lists/cat/1.jpg", "cat")


def test_a_dot_segment_in_a_manifest_path_is_tidied_on_a_store_as_on_a_local_disk():
    """`find . -name '*.jpg'` writes ./cat/1.jpg; a COCO file_name may say ./images/x.jpg. An object
    store's key has no ./ in it: the run read gs://bucket/lists/./cat/1.jpg and found nothing."""
    for manifest in (MANIFEST, "gs://bucket/lists/train.csv", "s3://bucket/lists/train.csv"):
        assert parse_manifest_line("./cat/./1.jpg,cat", CSV, manifest) == parse_manifest_line("cat/1.jpg,cat", CSV,
                                                                                               manifest)


@pytest.mark.parametrize("layout,line", [
    (CSV, "only_a_path.jpg"),
    (CSV, "a.jpg,cat,extra"),  # without a header, exactly two columns
    (CSV, ",cat"),
    (CSV, "a.jpg,  "),
    (ManifestLayout("csv", 0, 3, header=("path", "a", "b", "label")), "a.jpg,cat"),  # too few for the header
    (ManifestLayout("csv", 0, 1, header=("path", "label")), "a.jpg,big, cat"),  # an unquoted comma
    (ManifestLayout("csv", 0, 1, header=("path", "label")), "Path , Label"),  # the header again (cat a.csv b.csv)
    (ManifestLayout("csv", 0, 1, header=("path", "label")), "filename,class"),  # another manifest's header
    (ManifestLayout("csv", 0, 1, header=("path", "label", "notes")), "path,label"),  # ... with fewer columns
    (ManifestLayout("csv", 1, 2, header=("id", "img", "y")), "1,img,y"),  # this one's own names
    (CSV, "path,label"),  # a header in a manifest without one
    (ManifestLayout("csv", 0, 1, header=("path", "label")), "a.jpg,cat,note"),  # a cell past the header's
    (ManifestLayout("csv", 0, 1, header=("path", "label")), "label,path"),  # a header with its columns swapped
    (JSONL, '{"path": "a.jpg", "path": "b.jpg", "label": "cat"}'),  # which file? (json keeps the last)
    (JSONL, '{"path": "a.jpg", "label": "cat", "Path ": "b.jpg"}'),  # the same name, as CSV columns compare
    (jsonl_layout(None, ("File", "y")), '{"file": "b.jpg", "File": "a.jpg", "y": "cat"}'),
    (JSONL, '{"path": "a.jpg", "label": " "}'),  # blank, as in CSV
    (JSONL, "not json"),
    (JSONL, '["a.jpg", "cat"]'),
    (JSONL, '{"path": "a.jpg"}'),
    (JSONL, '{"label": "cat"}'),
    (JSONL, '{"path": "", "label": "cat"}'),
    (JSONL, '{"path": "a.jpg", "label": ""}'),
    (JSONL, '{"path": "a.jpg", "label": ["dog"]}'),  # would be the class "['dog']"
    (JSONL, '{"path": "a.jpg", "label": true}'),  # would be "True": a bool is no integer id
    (JSONL, '{"path": "a.jpg", "label": {"a": 1}}'),
    (JSONL, '{"path": "a.jpg", "label": 1.5}'),
    (JSONL, '{"path": 5, "label": "cat"}'),
    (JSONL, '{"path": ["a.jpg"], "label": "cat"}'),
    (JSONL, '{"path": "a.jpg", "label": ' + "1" * 5000 + "}"),  # over Python's int conversion limit
    (JSONL, "[" * 100_000),  # nested deeper than the JSON decoder recurses
    (CSV, "cat/a\0b.jpg,cat"),  # no file name holds a NUL; os calls raise ValueError on one
    (JSONL, '{"path": "a\\u0000b.jpg", "label": "cat"}'),
    (JSONL, '{"path": "a.jpg", "label": "\\ud800"}'),  # valid JSON, but a lone surrogate is no text
    (JSONL, '{"path": "\\ud800.jpg", "label": "cat"}'),
])
def test_bad_manifest_lines(layout, line):
    with pytest.raises(BadManifestLine):
        parse_manifest_line(line, layout, MANIFEST)


@pytest.mark.parametrize("line", ['a.jpg,"dog', '"a.jpg,dog', 'a.jpg,"do""g'])
def test_a_quote_left_open_is_a_bad_line_not_a_cut_short_label(line):
    with pytest.raises(BadManifestLine, match="unbalanced quote; quoted fields cannot span lines"):
        parse_manifest_line(line, CSV, MANIFEST)


def test_messages_quote_only_an_excerpt_of_a_long_line():
    for layout, line in ((CSV, "a" * 300_000), (CSV, f"a.jpg,{'b' * 300_000},c"), (JSONL, "{" * 300_000),
                         (JSONL, '{"path": "a.jpg", "label": "' + "x" * 300_000 + '", "extra": 1, "label": null}')):
        with pytest.raises(BadManifestLine) as info:
            parse_manifest_line(line, layout, MANIFEST)
        assert len(str(info.value)) < 1000, str(info.value)[:300]
    _, rejected = split_found(resolve_listings("/x/a.jpg", [("c" * 300_000, 1, "/x/a.jpg"), ("dog", 2, "/x/a.jpg")]))
    assert all(len(message) < 1000 for _, _, message in rejected)


def test_manifest_rows_number_lines_and_report_bad_ones():
    lines = [b"path,label\n", b"cat/a.jpg,cat\n", b"\n", b"caf\xe9/b.jpg,cat\n",  # Latin-1, not UTF-8
             b"\xef\xbb\xbfdog/c.jpg,dog\n", b"broken\n", b"dog/d.jpg,dog"]
    rows, rejected = split_found(manifest_rows(lines, ManifestLayout("csv", 0, 1, header=("path", "label")), MANIFEST))
    assert rows == [(f"/data/manifests/{p}", (label, n, f"/data/manifests/{p}"))
                    for p, label, n in (("cat/a.jpg", "cat", 2), ("dog/c.jpg", "dog", 5), ("dog/d.jpg", "dog", 7))]
    assert [(path, error) for path, error, _ in rejected] == [(MANIFEST, "BadManifestLine")] * 2
    assert rejected[0][2].startswith("line 4 is not UTF-8") and "caf\\xe9" in rejected[0][2]
    assert rejected[1][2].startswith("line 6: expected a path and a label")


def test_manifest_rows_skip_only_the_first_nonblank_line_as_header_and_refuse_it_again():
    """A blank line or a byte-order mark alone comes before the header; the header again (two
    manifests joined) is a bad line, so its "label" is no class that shifts every id."""
    lines = [b"\n", b"\xef\xbb\xbf\n", b"path,label\n", b"cat/a.jpg,cat\n", b"path,label\n"]
    assert header_text(lines[1]) == ""
    rows, rejected = split_found(manifest_rows(lines, ManifestLayout("csv", 0, 1, header=("path", "label")), MANIFEST))
    assert rows == [("/data/manifests/cat/a.jpg", ("cat", 4, "/data/manifests/cat/a.jpg"))]
    assert [(error, message.split(",")[0]) for _, error, message in rejected] == [
        ("BadManifestLine", "line 5: a header line")]


@pytest.mark.parametrize("header", [b"path,label,l\xe9gende\n", b"path,label" + b",c" * (MAX_LINE_BYTES // 2) + b"\n"],
                         ids=["not_utf8", "too_long"])
def test_a_header_that_is_not_utf8_or_too_long_is_still_the_header_not_a_lost_row(tmp_path, header):
    """The header check reads the first line with its bad bytes replaced (or cut); the rows must
    skip that same line, not the next one. Before, the header was a dead letter and the first data
    row was skipped in its place: lost, while the counts still added up."""
    manifest = tmp_path / "list.csv"
    manifest.write_bytes(b"\n" + header + b"cat/a.jpg,cat\ndog/b.jpg,dog\n")
    layout = csv_layout(first_line(str(manifest)), None, EXTENSIONS)
    assert layout.header
    with open(manifest, "rb") as handle:
        rows, rejected = split_found(manifest_rows(manifest_lines(handle), layout, str(manifest)))
    assert [(n, label) for _, (label, n, _) in rows] == [(3, "cat"), (4, "dog")] and rejected == []


def test_a_line_over_the_bound_is_one_bad_line_read_in_bounded_pieces(tmp_path):
    """Cut to MAX_LINE_BYTES + 1 bytes (the rest skipped, not kept), then rejected; a line of
    exactly MAX_LINE_BYTES, with a CRLF, is parsed; the lines after keep their numbers."""
    manifest = tmp_path / "list.csv"
    exact = b"a.jpg,cat" + b" " * (MAX_LINE_BYTES - 9)
    manifest.write_bytes(b"cat/a.jpg,cat\n" + b"y" * (3 * MAX_LINE_BYTES) + b"\n" + exact + b"\r\n"
                         + b"z" * (MAX_LINE_BYTES + 1) + b"\r\ndog/b.jpg,dog")
    with open(manifest, "rb") as handle:
        lines = list(manifest_lines(handle))
        rows, rejected = split_found(manifest_rows(lines, CSV, str(manifest)))
    assert max(len(line) for line in lines) == MAX_LINE_BYTES + 1
    assert [(n, label) for _, (label, n, _) in rows] == [(1, "cat"), (3, "cat"), (5, "dog")]
    assert [message.split(":")[0] for _, _, message in rejected] == [
        f"line {n} is longer than {MAX_LINE_BYTES} bytes" for n in (2, 4)]
    assert all(len(message) < 1000 for _, _, message in rejected)


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_manifest_that_is_not_a_regular_file_is_refused_before_it_is_read(tmp_path, kind):
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would block
    for path, what in ((tmp_path, "a folder"), (tmp_path / "fifo", "a FIFO"), ("/dev/zero", "a character device")):
        with pytest.raises(ManifestError, match=re.escape(f"cannot read the manifest {path}: {what}, not a regular")):
            manifest_layout(InputSpec(str(path), kind=kind), kind)


def test_manifest_rows_key_one_file_by_one_spelling(tmp_path):
    """`imgs/a.jpg`, `./imgs/a.jpg`, the absolute path and a path through a symlinked folder are
    one file: keyed alike, so repeats and conflicts are found; each line keeps its own path."""
    write_image(tmp_path / "imgs" / "a.jpg")
    (tmp_path / "link").symlink_to(tmp_path / "imgs")
    manifest = str(tmp_path / "list.csv")
    lines = [b"imgs/a.jpg,cat\n", b"./imgs/a.jpg,cat\n", f"{tmp_path}/imgs/a.jpg,cat\n".encode(),
             b"link/a.jpg,dog\n"]
    rows, _ = split_found(manifest_rows(lines, CSV, manifest))
    assert {key for key, _ in rows} == {str(tmp_path / "imgs" / "a.jpg")}
    assert [path for _, (_, _, path) in rows] == [f"{tmp_path}/imgs/a.jpg"] * 3 + [f"{tmp_path}/link/a.jpg"]


def test_a_path_listed_twice_with_one_label_is_one_candidate():
    listings = [("cat", 9, "/x/./a.jpg"), ("cat", 2, "/x/a.jpg"), ("cat", 5, "/y/a.jpg")]
    found, rejected = split_found(resolve_listings("/x/a.jpg", listings))
    assert found == [Candidate("/x/a.jpg", "cat")]  # the first listing's path
    assert rejected == [("/y/a.jpg", "DuplicateListing", "listed again on line 5 (first on line 2)"),
                        ("/x/./a.jpg", "DuplicateListing", "listed again on line 9 (first on line 2)")]


def test_a_path_listed_with_two_labels_is_rejected_on_every_line():
    found, rejected = split_found(resolve_listings("/x/a.jpg", [("dog", 7, "/x/a.jpg"), ("cat", 3, "/l/a.jpg")]))
    assert found == []
    message = "listed with different labels (line 3: 'cat', line 7: 'dog')"
    assert rejected == [("/l/a.jpg", "ConflictingLabels", message), ("/x/a.jpg", "ConflictingLabels", message)]


def test_conflicting_listings_quote_a_few_lines_however_many_there_are():
    listings = [("cat" if n % 2 else "dog", n, "/x/a.jpg") for n in range(1, 1001)]
    _, rejected = split_found(resolve_listings("/x/a.jpg", listings))
    assert len(rejected) == 1000
    message = rejected[0][2]
    assert message.endswith("line 5: 'cat' and 995 more lines)") and len(message) < 300, message


# ----------------------------------------------------------------------------- local class folders

@pytest.fixture
def tree(tmp_path) -> pathlib.Path:
    """A class-folder tree with every kind of entry discovery must account for."""
    root = tmp_path / "root"
    write_image(root / "cat" / "a.jpg")
    write_image(root / "cat" / "sub" / "deeper" / "b.png")  # nested: belongs to cat (as in Keras)
    write_image(root / "cat" / "folder.jpg" / "c.jpg")  # a folder named like an image
    write_text(root / "cat" / "notes.txt", "x")
    write_text(root / "cat" / "._a.jpg", "AppleDouble")
    write_text(root / "cat" / ".secret.jpg", "hidden")
    write_image(root / "cat" / ".thumbs" / "t.jpg")  # hidden folder: not walked
    (root / "cat" / "dangling.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (root / "cat" / "loop").symlink_to(root / "cat")  # a folder that contains itself
    write_image(tmp_path / "elsewhere" / "dog" / "d.jpg")
    (root / "dog").symlink_to(tmp_path / "elsewhere" / "dog")  # symlinked class folder: followed
    (root / "empty").mkdir()  # an empty class still gets an id
    write_image(root / "top.jpg")  # outside any class folder
    write_text(root / ".hidden" / "x.jpg", "x")
    write_text(root / "__MACOSX" / "cat" / "._a.jpg", "AppleDouble")  # unzipped from macOS
    write_text(root / "cat" / "__MACOSX" / "._a.jpg", "AppleDouble")
    (root / "broken").symlink_to(tmp_path / "gone")
    return root


def test_list_local_root(tree):
    classes, rejected = split_found(list_local_root(str(tree)))
    assert classes == [ClassFolder("cat", f"{tree}/cat"), ClassFolder("dog", f"{tree}/dog"),
                       ClassFolder("empty", f"{tree}/empty")]
    assert rejected == [(f"{tree}/.hidden", "SkippedFile", "hidden folder, not a class"),
                        (f"{tree}/__MACOSX", "SkippedFile", "macOS archive metadata folder, not a class"),
                        (f"{tree}/broken", "UnreadableFile",
                         f"{tree}/broken is a broken symlink (to {tree.parent}/gone)"),
                        (f"{tree}/top.jpg", "SkippedFile", "not inside a class folder")]


def test_a_folder_holding_an_imgrec_dataset_is_no_class(tmp_path):
    """A dated output of a scheduled run inside its input (`--output=IN/{timestamp}`): as a
    class it shifted every real class's id on each run. With a file imgrec did not write, it is
    a class again, so that file is not left out."""
    write_image(tmp_path / "cat" / "a.jpg")
    metadata = {"format_version": 3, "versions": {"imgrec": "1"},
                "splits": {"train": {"files": ["train-00000-of-00001.tfrecord"]}}}
    for dated in ("20261204T000000", "20261205T000000"):
        write_text(tmp_path / dated / "metadata.json", json.dumps(metadata))
        write_text(tmp_path / dated / "train-00000-of-00001.tfrecord", "records")
        write_text(tmp_path / dated / "index" / "train-00000-of-00001.index", "index")
        write_text(tmp_path / dated / "contact_sheet.png", "drawn by imgrec verify")
    write_image(tmp_path / "20261205T000000" / "mine.jpg")
    classes, rejected = split_found(list_local_root(str(tmp_path)))
    assert [c.label for c in classes] == ["20261205T000000", "cat"] and not rejected
    os.mkfifo(tmp_path / "cat" / "metadata.json")  # no dataset: never opened (it would block)
    classes, _ = split_found(list_local_root(str(tmp_path)))
    assert [c.label for c in classes] == ["20261205T000000", "cat"]


def test_a_folder_holding_only_a_runs_lock_and_staging_is_no_class(tmp_path):
    """`--output=IN/{timestamp}`: the folder of a run under way or killed, before it publishes,
    became a class of the next run, shifting every real class's id (a killed run's for good)."""
    write_image(tmp_path / "cat" / "a.jpg")
    write_text(tmp_path / "20261204T000000" / ".imgrec.lock", "")
    write_text(tmp_path / "20261204T000000" / ".imgrec-staging" / "parts" / "x.records", "records")
    write_text(tmp_path / "20261205T000000" / ".imgrec-staging" / "parts" / "x.records", "records")
    write_image(tmp_path / "20261205T000000" / "mine.jpg")
    classes, rejected = split_found(list_local_root(str(tmp_path)))
    assert [c.label for c in classes] == ["20261205T000000", "cat"] and not rejected


def test_a_top_level_symlink_loop_is_a_dead_letter_not_a_crash(tmp_path):
    write_image(tmp_path / "cat" / "a.jpg")
    (tmp_path / "spin").symlink_to(tmp_path / "spin")
    classes, rejected = split_found(list_local_root(str(tmp_path)))
    assert classes == [ClassFolder("cat", f"{tmp_path}/cat")]
    assert [(path, error) for path, error, _ in rejected] == [(f"{tmp_path}/spin", "UnreadableFile")]
    assert "Too many levels of symbolic links" in rejected[0][2]


@pytest.mark.parametrize("target", ["..", "../..", "../../.."])
def test_a_symlink_to_the_input_root_or_above_is_a_loop_not_every_class_again(tree, target):
    """`cat/up -> ..` leads to the input root: walked, it gave class cat every dog image."""
    (tree / "cat" / "up").symlink_to(target)
    found, rejected = split_found(walk_class_folder(f"{tree}/cat", "cat", EXTENSIONS))
    assert not [c for c in found if "/up/" in c.path]
    assert (f"{tree}/cat/up", "SkippedFile", LOOP) in rejected


def test_a_symlink_above_a_symlinked_class_folder_is_a_loop_too(tree, tmp_path):
    """dog is a symlink to elsewhere/dog: `..` inside it is elsewhere, which holds dog."""
    (tmp_path / "elsewhere" / "dog" / "up").symlink_to("..")
    found, rejected = split_found(walk_class_folder(f"{tree}/dog", "dog", EXTENSIONS))
    assert found == [Candidate(f"{tree}/dog/d.jpg", "dog")]
    assert rejected == [(f"{tree}/dog/up", "SkippedFile", LOOP)]


@pytest.mark.parametrize("target", [".", "..", "/"])
def test_a_class_folder_that_leads_to_the_input_root_or_above_is_a_loop_not_a_class(tree, target):
    """`IN/all -> .` as a class would hold every other class's files again."""
    (tree / "all").symlink_to(target)
    classes, rejected = split_found(list_local_root(str(tree)))
    assert "all" not in [c.label for c in classes]
    assert (f"{tree}/all", "SkippedFile", LOOP) in rejected


def test_loops_are_found_when_the_input_path_has_dot_dot_after_a_symlink(tmp_path):
    """`lnk/../IN` is `real/IN` to the OS (lnk -> real/deep), not `IN` as text reads it."""
    write_image(tmp_path / "real" / "IN" / "cat" / "a.jpg")
    (tmp_path / "real" / "deep").mkdir()
    (tmp_path / "real" / "IN" / "cat" / "up").symlink_to("..")
    (tmp_path / "lnk").symlink_to(tmp_path / "real" / "deep")
    root = f"{tmp_path}/lnk/../IN"
    (folder,) = [c for c in list_local_root(root) if isinstance(c, ClassFolder)]
    found, rejected = split_found(walk_class_folder(folder.path, "cat", EXTENSIONS))
    assert found == [Candidate(f"{root}/cat/a.jpg", "cat")]
    assert rejected == [(f"{root}/cat/up", "SkippedFile", LOOP)]


@pytest.fixture
def deep_image(tmp_path) -> Iterator[pathlib.Path]:
    """tmp_path/cat/d/d/.../a.jpg, 1,200 folders deep: more than Python's recursion limit."""
    made = [tmp_path / "cat"]
    try:
        made[0].mkdir()
        for _ in range(1200):  # one by one: pathlib's mkdir(parents=True) recurses too
            made.append(made[-1] / "d")
            made[-1].mkdir()
        write_image(made[-1] / "a.jpg")
        yield made[-1] / "a.jpg"
    finally:  # bottom up: pytest's clean-up of old temporary folders recurses, and would fail on these
        (made[-1] / "a.jpg").unlink(missing_ok=True)
        for folder in reversed(made):
            if folder.exists():
                folder.rmdir()


def test_folders_nested_deeper_than_pythons_recursion_limit_are_walked(tmp_path, deep_image):
    found, rejected = split_found(walk_class_folder(str(tmp_path / "cat"), "cat", EXTENSIONS))
    assert found == [Candidate(str(deep_image), "cat")] and not rejected


def test_a_glob_goes_deeper_than_pythons_recursion_limit(tmp_path, deep_image):
    assert list(match_glob(f"{tmp_path}/**/*.jpg")) == [str(deep_image)]


def rejected_in_root_and_class_folder(tree, name: str) -> dict[str, tuple[str, str]]:
    """The rejections of `name` in the input root and of `name`.jpg in class folder cat."""
    _, in_root = split_found(list_local_root(str(tree)))
    _, in_class = split_found(walk_class_folder(f"{tree}/cat", "cat", EXTENSIONS))
    return {path: (error, message) for path, error, message in [*in_root, *in_class]
            if path in (f"{tree}/{name}", f"{tree}/cat/{name}.jpg")}


def test_a_symlink_through_a_file_is_a_broken_symlink(tree):
    """In the input root as in a class folder (ENOTDIR, not ENOENT)."""
    for link in (tree / "through", tree / "cat" / "through.jpg"):
        link.symlink_to(tree / "cat" / "a.jpg" / "x.jpg")
    assert rejected_in_root_and_class_folder(tree, "through") == {
        path: ("UnreadableFile", f"{path} is a broken symlink (to {tree}/cat/a.jpg/x.jpg)")
        for path in (f"{tree}/through", f"{tree}/cat/through.jpg")}


def test_an_entry_that_cannot_be_read_is_not_called_a_broken_symlink(tree):
    for link in (tree / "spin", tree / "cat" / "spin.jpg"):
        link.symlink_to(link)
    assert rejected_in_root_and_class_folder(tree, "spin") == {
        path: ("UnreadableFile", f"cannot read {path}: Too many levels of symbolic links")
        for path in (f"{tree}/spin", f"{tree}/cat/spin.jpg")}


def test_walk_class_folder_accounts_for_every_entry(tree):
    cat = f"{tree}/cat"
    found, rejected = split_found(walk_class_folder(cat, "cat", EXTENSIONS))
    assert sorted(found, key=lambda c: c.path) == [Candidate(f"{cat}/a.jpg", "cat"),
                                                   Candidate(f"{cat}/folder.jpg/c.jpg", "cat"),
                                                   Candidate(f"{cat}/sub/deeper/b.png", "cat")]
    reasons = {pathlib.Path(path).name: (error, message) for path, error, message in rejected}
    assert reasons.keys() == {"._a.jpg", ".secret.jpg", ".thumbs", "__MACOSX", "dangling.jpg", "loop", "notes.txt"}
    assert reasons["._a.jpg"] == ("SkippedFile", "macOS AppleDouble metadata file, not an image")
    assert reasons[".secret.jpg"] == ("SkippedFile", "hidden file")
    assert reasons[".thumbs"] == ("SkippedFile", "hidden folder, not walked")
    assert reasons["__MACOSX"] == ("SkippedFile", "macOS archive metadata folder, not walked")
    assert reasons["dangling.jpg"][0] == "UnreadableFile" and "broken symlink" in reasons["dangling.jpg"][1]
    assert reasons["loop"] == ("SkippedFile", LOOP)
    assert reasons["notes.txt"][0] == "SkippedFile" and reasons["notes.txt"][1].startswith("extension not in")


def test_walk_follows_a_symlinked_class_folder(tree):
    found, rejected = split_found(walk_class_folder(f"{tree}/dog", "dog", EXTENSIONS))
    assert found == [Candidate(f"{tree}/dog/d.jpg", "dog")] and rejected == []


def test_walk_passes_over_only_what_imgrec_wrote_into_its_output(tree):
    output = tree / "cat" / "out"
    write_image(output / "contact_sheet.png")
    write_image(output / "index" / "x.png")  # inside a folder imgrec wrote
    write_image(output / "mine.jpg")  # the user's file: an input like any other
    folder = OutputFolder(os.path.realpath(output), frozenset({"contact_sheet.png", "index"}))
    found, _ = split_found(walk_class_folder(f"{tree}/cat", "cat", EXTENSIONS, folder))
    assert [c.path for c in found if "/out/" in c.path] == [f"{tree}/cat/out/mine.jpg"]


def test_the_output_is_a_class_folder_only_if_it_holds_inputs(tree):
    only_imgrecs = OutputFolder(os.path.realpath(tree / "empty"), frozenset({"metadata.json"}))
    (tree / "empty" / "metadata.json").write_text("{}")
    classes, _ = split_found(list_local_root(str(tree), only_imgrecs))
    assert [folder.label for folder in classes] == ["cat", "dog"]
    write_image(tree / "empty" / "mine.jpg")
    classes, _ = split_found(list_local_root(str(tree), only_imgrecs))
    assert [folder.label for folder in classes] == ["cat", "dog", "empty"]


@pytest.mark.parametrize("path,expected", [
    ("gs://b/root/cat/1.jpg", Candidate("gs://b/root/cat/1.jpg", "cat")),
    ("gs://b/root/cat/sub/2.png", Candidate("gs://b/root/cat/sub/2.png", "cat")),
    ("gs://b/root/cat/", None),  # a folder placeholder object
    ("gs://b/root/top.jpg", ("SkippedFile", "not inside a class folder")),
    ("gs://b/root/cat/.cache/x.jpg", ("SkippedFile", "inside hidden folder .cache")),
    ("gs://b/root/__MACOSX/cat/._x.jpg", ("SkippedFile", "inside macOS archive metadata folder __MACOSX")),
    ("gs://b/root/__MACOSX/cat/x.jpg", ("SkippedFile", "inside macOS archive metadata folder __MACOSX")),
    ("gs://b/root/cat/._x.jpg", ("SkippedFile", "macOS AppleDouble metadata file, not an image")),
    ("gs://b/root/cat/notes.txt", ("SkippedFile", "extension not in")),
])
def test_classify_remote(path, expected):
    found = classify_remote("gs://b/root/", path, EXTENSIONS)
    if expected is None or isinstance(expected, Candidate):
        assert found == expected
    else:
        (_, error, message), = split_found([found])[1]
        assert error == expected[0] and message.startswith(expected[1])


def test_batches_fill_as_the_listing_goes_and_rejections_pass_at_once():
    """A DoFn that lists a million files holds one batch, not the listing."""
    listed = []

    def listing():
        for i in range(BATCH * 3):
            listed.append(i)
            yield reject(f"/r/cat/{i}.txt", SkippedFile("extension")) if i == 1 else Candidate(f"/r/cat/{i}.jpg", "cat")

    stream = batched(listing())
    assert isinstance(next(stream), beam.pvalue.TaggedOutput) and len(listed) == 2
    first = next(stream)
    assert len(first) == BATCH and len(listed) == BATCH + 1
    assert [len(batch) for batch in stream] == [BATCH, BATCH - 1]


@pytest.mark.parametrize("pattern,root", [("/data/*/*.jpg", "/data"), ("data/**", "data"),
                                          ("/home/u/.sets/pets/[ab]*/x.png", "/home/u/.sets/pets"),
                                          ("gs://b/imgs/*/*.jpg", "gs://b/imgs")])
def test_glob_root_is_where_the_wildcards_start(pattern, root):
    assert glob_root(pattern) == root


@pytest.mark.parametrize("pattern,matched,unmatched", [
    ("/d/*/*.png", ["/d/cat/a.png", "/d/cat/b\\c.png", "/d/dog\\v2/e.png"], ["/d/a/b/c.png", "/d/x.png"]),
    ("/d/**/*.png", ["/d/x.png", "/d/a/b/c.png"], ["/d/x.jpg"]),  # `**` stands for no folder too
    ("/d/**.png", ["/d/x.png"], ["/d/a/b/c.png"]),  # only a whole segment crosses folders
    ("/d/?.png", ["/d/a.png", "/d/\\.png"], ["/d//.png", "/d/ab.png"]),
    ("/d/[a-c]*.jpg", ["/d/b1.jpg"], ["/d/d1.jpg"]),
    ("/d/[!a]*.jpg", ["/d/b.jpg"], ["/d/a.jpg"]),
    ("/d/[]x].jpg", ["/d/].jpg", "/d/x.jpg"], ["/d/y.jpg"]),
    ("/d/[z-a].jpg", [], ["/d/z.jpg", "/d/a.jpg"]),  # a reversed range matches nothing (it crashed)
    ("/d/a[.jpg", ["/d/a[.jpg"], ["/d/a.jpg"]),  # an unclosed `[` is itself
    ("/d/x[1/y]/*.png", ["/d/x[1/y]/a.png"], ["/d/x1/a.png"]),  # no class spans a `/`
    ("/d/*[!/]/*.png", [], ["/d/ab/a.png"]),
    ("/d/(x)+.jpg", ["/d/(x)+.jpg"], ["/d/xx.jpg"]),
])
def test_glob_matches_as_a_shell_does(pattern, matched, unmatched):
    """Beam's `*` stops at a backslash: `b\\c.png` and the folder `dog\\v2` were never inputs."""
    assert [p for p in matched if not glob_matches(pattern, p)] == []
    assert [p for p in unmatched if glob_matches(pattern, p)] == []


def test_a_glob_passes_over_what_imgrec_wrote_beside_an_earlier_dataset(tmp_path):
    """`IN/*/*.png` reaching an earlier output inside IN: the pictures `imgrec verify` drew there
    became a class of their own; a photo the user put there is still an input."""
    metadata = {"format_version": 3, "versions": {"imgrec": "1"}, "splits": {}}
    write_text(tmp_path / "20261204T000000" / "metadata.json", json.dumps(metadata))
    for name in ("contact_sheet.png", "class_counts.png"):
        write_image(tmp_path / "20261204T000000" / name)
    write_image(tmp_path / "20261204T000000" / "mine.png")
    write_image(tmp_path / "cat" / "a.png")
    batches = list(glob_candidates(f"{tmp_path}/*/*.png", EXTENSIONS))
    found, rejected = split_found(x for item in batches for x in (item if isinstance(item, tuple) else [item]))
    assert sorted(c.path for c in found) == [f"{tmp_path}/20261204T000000/mine.png", f"{tmp_path}/cat/a.png"]
    assert not rejected


def test_a_glob_passes_over_the_record_index_of_an_earlier_dataset(tmp_path):
    """`IN/**/*` with a schedule's `--output=IN/{timestamp}`: the earlier datasets' index/*.idx
    were SkippedFile inputs, one dataset's more each run, so `--skip_unchanged` never matched."""
    metadata = {"format_version": 2, "versions": {"imgrec": "1"},
                "splits": {"train": {"files": ["train-00000-of-00001.tfrecord"]}}}
    write_text(tmp_path / "20261204T000000" / "metadata.json", json.dumps(metadata))
    write_text(tmp_path / "20261204T000000" / "train-00000-of-00001.tfrecord", "")
    write_text(tmp_path / "20261204T000000" / "index" / "train-00000-of-00001.tfrecord.idx", "")
    write_image(tmp_path / "cat" / "a.png")
    batches = list(glob_candidates(f"{tmp_path}/**/*", EXTENSIONS))
    found, rejected = split_found(x for item in batches for x in (item if isinstance(item, tuple) else [item]))
    assert [c.path for c in found] == [f"{tmp_path}/cat/a.png"]
    assert not rejected


@pytest.mark.parametrize("target", ["..", "../..", "/"])
def test_a_glob_does_not_follow_a_symlink_out_to_a_folder_above_its_root(tmp_path, target):
    """`IN/cat/up -> ../..` leads above IN: walked, `IN/**` would match files outside IN."""
    write_image(tmp_path / "IN" / "cat" / "a.png")
    write_image(tmp_path / "other" / "dog" / "b.png")
    (tmp_path / "IN" / "cat" / "up").symlink_to(target)
    assert list(match_glob(f"{tmp_path}/IN/**/*.png")) == [f"{tmp_path}/IN/cat/a.png"]


def test_match_glob_lists_names_with_backslashes_symlinks_and_dangling_links(tmp_path):
    for name in ("cat/a.png", "cat/b\\c.png", "dog\\v2/e.png", "deep/x/y.png", "elsewhere/f.png"):
        write_text(tmp_path / name, "x")
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")  # followed, as a shell's glob does
    (tmp_path / "cat" / "gone.png").symlink_to(tmp_path / "nothing")  # listed: reading reports it
    (tmp_path / "deep" / "x" / "loop").symlink_to(tmp_path / "deep")  # walked once
    assert sorted(match_glob(f"{tmp_path}/*/*.png")) == [
        f"{tmp_path}/cat/a.png", f"{tmp_path}/cat/b\\c.png", f"{tmp_path}/cat/gone.png",
        f"{tmp_path}/dog\\v2/e.png", f"{tmp_path}/elsewhere/f.png", f"{tmp_path}/linked/f.png"]
    assert sorted(match_glob(f"{tmp_path}/deep/**/*.png")) == [f"{tmp_path}/deep/x/y.png"]
    assert list(match_glob(f"{tmp_path}/cat/a.png")) == [f"{tmp_path}/cat/a.png"]


@pytest.mark.parametrize("path,expected", [
    ("/home/u/.sets/cat/a.jpg", Candidate("/home/u/.sets/cat/a.jpg", "cat")),  # the pattern names .sets
    ("/home/u/.sets/.thumbs/a.jpg", ("SkippedFile", "inside hidden folder .thumbs")),
    ("/home/u/.sets/__MACOSX/cat/._a.jpg", ("SkippedFile", "inside macOS archive metadata folder __MACOSX")),
    ("/home/u/.sets/cat/._a.jpg", ("SkippedFile", "macOS AppleDouble metadata file, not an image")),
])
def test_a_glob_into_a_hidden_folder_finds_no_inputs_there(path, expected):
    """As in Python's glob and imgrec's class folders: `.thumbs` would otherwise be a class."""
    found = classify_glob_match(glob_root("/home/u/.sets/*/*.jpg"), path, EXTENSIONS)
    if isinstance(expected, Candidate):
        assert found == expected
    else:
        (_, error, message), = split_found([found])[1]
        assert (error, message) == expected


def test_folders_whose_names_are_not_utf8_stay_distinct_classes(tmp_path):
    """Each undecodable byte shows as \\xNN: one replacement character for every such byte
    made `a\\xff` and `a\\xfe` one class, and their images one label."""
    for name in (b"a\xff", b"a\xfe", b"caf\xc3\xa9"):
        write_text(pathlib.Path(os.fsdecode(os.fsencode(tmp_path) + b"/" + name)) / "x.png", "x")
    classes, rejected = split_found(list_local_root(str(tmp_path)))
    assert [c.label for c in classes] == ["a\\xfe", "a\\xff", "café"] and not rejected
    assert all(c.label.encode("utf-8") for c in classes)
    glob_match = os.fsdecode(os.fsencode(tmp_path) + b"/a\xff/x.png")
    assert label_from_parent(glob_match) == "a\\xff"


def test_a_folder_name_that_is_not_utf8_never_merges_into_another_class(tmp_path):
    """`a` + byte 0xFF reads as label `a\\xff`, which is also a folder's real name: its files
    are AmbiguousLabel dead letters, and the folder that is named so keeps its class."""
    for name in (b"a\xff", b"a\\xff"):
        write_text(pathlib.Path(os.fsdecode(os.fsencode(tmp_path) + b"/" + name)) / "x.png", "x")
    classes, rejected = split_found(list_local_root(str(tmp_path)))
    undecodable = os.fsdecode(os.fsencode(tmp_path) + b"/a\xff")
    assert classes == [ClassFolder("a\\xff", f"{tmp_path}/a\\xff"),
                       ClassFolder("a\\xff", undecodable, same_label_as=f"{tmp_path}/a\\xff")] and not rejected
    walked = [split_found(walk_class_folder(c.path, c.label, EXTENSIONS, same_label_as=c.same_label_as))
              for c in classes]
    assert walked[0] == ([Candidate(f"{tmp_path}/a\\xff/x.png", "a\\xff")], [])
    [], [(path, error, message)] = walked[1]
    assert (path, error) == (f"{undecodable}/x.png", "AmbiguousLabel")
    assert message.endswith(f"as folder {tmp_path}/a\\xff does; rename one")


def test_a_glob_never_merges_two_folder_names_that_are_not_utf8_and_read_alike(tmp_path):
    """`\\xff` + byte 0xFF and two bytes 0xFF both read `\\xff\\xff`: both folders' files were one class."""
    for name in (b"\\xff\xff", b"\xff\xff"):
        for where in (b"", b"deep/"):  # the same name in two places is one class, as globs go
            write_text(pathlib.Path(os.fsdecode(os.fsencode(tmp_path) + b"/" + where + name)) / "x.png", "x")
    batches = list(glob_candidates(f"{tmp_path}/**/*.png", EXTENSIONS))
    found, rejected = split_found(x for item in batches for x in (item if isinstance(item, tuple) else [item]))
    assert not found and sorted(error for _, error, _ in rejected) == ["AmbiguousLabel"] * 4


def test_a_glob_never_merges_a_folder_name_that_is_not_utf8_into_another_class(tmp_path):
    """As class folders: `*/*.png` labelled both folders' files `a\\xff` (exit 0, one class)."""
    for name in (b"a\xff", b"a\\xff", b"b\xfe"):
        write_text(pathlib.Path(os.fsdecode(os.fsencode(tmp_path) + b"/" + name)) / "x.png", "x")
    write_text(tmp_path / "b" / "y.png", "x")
    batches = list(glob_candidates(f"{tmp_path}/*/*.png", EXTENSIONS))
    found, rejected = split_found(x for item in batches for x in (item if isinstance(item, tuple) else [item]))
    undecodable = os.fsdecode(os.fsencode(tmp_path) + b"/a\xff")
    assert sorted((c.path, c.label) for c in found) == sorted([
        (f"{tmp_path}/a\\xff/x.png", "a\\xff"), (f"{tmp_path}/b/y.png", "b"),
        (os.fsdecode(os.fsencode(tmp_path) + b"/b\xfe/x.png"), "b\\xfe")])
    [(path, error, message)] = rejected
    assert (path, error) == (f"{undecodable}/x.png", "AmbiguousLabel")
    assert message.endswith(f"as folder {tmp_path}/a\\xff does; rename one")
