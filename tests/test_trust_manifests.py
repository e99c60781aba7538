"""Issue 8, "Empty and malformed inputs must fail loudly": empty inputs, non-UTF-8 manifest lines,
CSV headers, conflicting labels. Black-box: each run is the command's `main(argv)` in this process
(`imgrec_here`: its exit code, its one-line error, the files it publishes), as in test_trust_cli.py;
what only a process shows (bounded memory, a FIFO that must not block) is `python -m pipeline.run`
in a subprocess.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil

import pytest

from tests.helpers import (
    GiB,
    bytes_feature,
    check_complete,
    error_line,
    feature_key,
    imgrec_here,
    make_tree,
    nothing_published,
    read_examples,
    run_imgrec,
    write_csv,
    write_photo,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PERMISSIVE = "--max_error_fraction=1"


def names(rows) -> list[str]:
    return sorted(pathlib.PurePosixPath(r["path"]).name for r in rows)


@pytest.fixture
def images(tmp_path) -> list[pathlib.Path]:
    """tmp_path/imgs/{cat,dog}/...: 3 + 3 distinct images."""
    return make_tree(tmp_path / "imgs", {"cat": 3, "dog": 3})


def rel(path: pathlib.Path, base: pathlib.Path) -> str:
    return str(path.relative_to(base))


# ------------------------------------------------------------------------------------------
# Empty inputs


def make_empty_input(kind: str, tmp_path: pathlib.Path) -> pathlib.Path:
    if kind == "empty_folder":
        (tmp_path / "data").mkdir()
        return tmp_path / "data"
    if kind == "empty_class_folders":
        for name in ("cat", "dog"):
            (tmp_path / "data" / name).mkdir(parents=True)
        return tmp_path / "data"
    if kind == "only_non_images":
        (tmp_path / "data" / "cat").mkdir(parents=True)
        (tmp_path / "data" / "cat" / "readme.txt").write_text("no images here")
        (tmp_path / "data" / "cat" / "labels.csv").write_text("a,b\n")
        return tmp_path / "data"
    if kind == "header_only_csv":
        return write_csv(tmp_path / "list.csv", "path,label", [])
    if kind == "empty_jsonl":
        (tmp_path / "list.jsonl").write_bytes(b"\n")
        return tmp_path / "list.jsonl"
    raise AssertionError(kind)


# empty_class_folders: the --allow_empty tests below; an empty CSV: tests/test_discover.py
@pytest.mark.parametrize("kind", ["empty_folder", "only_non_images", "header_only_csv", "empty_jsonl"])
def test_an_input_without_images_fails_loudly_unless_allow_empty(tmp_path, capsys, kind):
    source = make_empty_input(kind, tmp_path)
    out = tmp_path / "out"
    run = imgrec_here(capsys, source, out, PERMISSIVE)
    assert run.returncode == 1, run.brief()
    line = error_line(run)
    assert "--allow_empty" in line, line
    assert nothing_published(out), sorted(p.name for p in out.iterdir())
    allowed = imgrec_here(capsys, source, out, PERMISSIVE, "--allow_empty")
    assert allowed.returncode == 0, allowed.brief()
    metadata, records, rows = check_complete(out)
    assert records == [] and metadata["inputs"]["written"] == 0
    assert all(r["error"] == "SkippedFile" for r in rows), rows


@pytest.mark.parametrize("flag", ["--overwrite", "--skip_unchanged"])
def test_a_dataset_without_shards_can_be_replaced_when_images_arrive(tmp_path, capsys, flag):
    """An --allow_empty dataset has an empty index/ folder, which lists no file: it was taken for
    somebody else's, and every later run into the folder was refused (exit 2)."""
    source, out = make_empty_input("empty_class_folders", tmp_path), tmp_path / "out"
    assert imgrec_here(capsys, source, out, PERMISSIVE, "--allow_empty").returncode == 0
    write_photo(source / "cat" / "a.png", seed=1)
    again = imgrec_here(capsys, source, out, PERMISSIVE, flag)
    assert again.returncode == 0, again.brief()
    metadata, records, _ = check_complete(out)
    assert len(records) == 1 and metadata["inputs"]["written"] == 1


@pytest.mark.parametrize("images", [0, 1])
@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_a_file_or_symlink_where_the_index_folder_goes_is_refused(tmp_path, capsys, images, kind):
    """A user's file named `index` ended a run in a traceback halfway through its publish (the old
    dataset gone), and so did every run after; a symlink there had the index files written into
    the folder it names."""
    source, out = make_empty_input("empty_class_folders", tmp_path), tmp_path / "out"
    if images:
        write_photo(source / "cat" / "a.png", seed=1)
    assert imgrec_here(capsys, source, out, PERMISSIVE, "--allow_empty").returncode == 0
    shutil.rmtree(out / "index")
    if kind == "file":
        (out / "index").write_text("the user's")
    else:
        (tmp_path / "theirs").mkdir()
        (out / "index").symlink_to(tmp_path / "theirs")
    write_photo(source / "dog" / "b.png", seed=2)
    refused = imgrec_here(capsys, source, out, PERMISSIVE, "--overwrite")
    assert refused.returncode == 2, refused.brief()
    assert f"{out} holds index, which imgrec did not write" in error_line(refused)
    assert (out / "metadata.json").exists()  # the dataset it held is still there
    if kind == "file":
        assert (out / "index").read_text() == "the user's"
    else:
        assert os.listdir(tmp_path / "theirs") == []


def test_skip_unchanged_keeps_an_empty_dataset_only_with_allow_empty(tmp_path, capsys):
    """allow_empty is no part of the fingerprint: without it, the skip kept a dataset of no image
    (exit 0) that a first run with the same flags refuses (exit 1)."""
    source, out = make_empty_input("only_non_images", tmp_path), tmp_path / "out"
    assert imgrec_here(capsys, source, out, PERMISSIVE, "--allow_empty").returncode == 0
    run_id = json.loads((out / "metadata.json").read_text())["run"]["run_id"]
    kept = imgrec_here(capsys, source, out, PERMISSIVE, "--skip_unchanged", "--allow_empty")
    assert kept.returncode == 0 and json.loads((out / "metadata.json").read_text())["run"]["run_id"] == run_id
    refused = imgrec_here(capsys, source, out, PERMISSIVE, "--skip_unchanged")
    assert refused.returncode == 1, refused.brief()
    assert "no image was written" in error_line(refused)
    assert json.loads((out / "metadata.json").read_text())["run"]["run_id"] == run_id  # left as it was


def test_when_every_input_is_rejected_the_reasons_are_kept(tmp_path, capsys, images):
    out = tmp_path / "out"
    run = imgrec_here(capsys, tmp_path / "imgs", out, PERMISSIVE, "--min_side=1000")
    assert run.returncode == 1, run.brief()
    line = error_line(run)
    assert "no image was written" in line and "ImageTooSmall: " in line and "Dead letters: " in line, line
    rows = [json.loads(row) for row in pathlib.Path(line.split("Dead letters: ", 1)[1]).read_text().splitlines()]
    assert rows and {row["error"] for row in rows} == {"ImageTooSmall"}
    assert nothing_published(out)


# ------------------------------------------------------------------------------------------
# Non-UTF-8 manifest lines


def test_a_latin1_csv_line_is_a_bad_manifest_line_with_its_line_number(tmp_path, capsys, images):
    rows = [f"{rel(p, tmp_path)},{p.parent.name}".encode() for p in images]
    # line 1: header; lines 2-6: five images; line 7: Latin-1; line 8: the sixth image
    lines = [b"path,label", *rows[:5], b"caf\xe9.jpg,cat", rows[5]]
    manifest = tmp_path / "list.csv"
    manifest.write_bytes(b"\n".join(lines) + b"\n")
    run = imgrec_here(capsys, manifest, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, dead = check_complete(tmp_path / "out")
    assert [r["error"] for r in dead] == ["BadManifestLine"], dead
    assert re.search(r"(?<!\d)7(?!\d)", dead[0]["message"]), f"no line number 7 in {dead[0]['message']!r}"
    assert len(records) == 6 and metadata["inputs"]["total"] == 7


def test_a_latin1_jsonl_line_is_a_bad_manifest_line_with_its_line_number(tmp_path, capsys, images):
    rows = [json.dumps({"path": rel(p, tmp_path), "label": p.parent.name}).encode() for p in images]
    lines = [*rows[:4], b'{"path": "caf\xe9.jpg", "label": "cat"}', *rows[4:]]  # line 5 is Latin-1
    manifest = tmp_path / "list.jsonl"
    manifest.write_bytes(b"\n".join(lines) + b"\n")
    run = imgrec_here(capsys, manifest, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, dead = check_complete(tmp_path / "out")
    assert [r["error"] for r in dead] == ["BadManifestLine"], dead
    assert re.search(r"(?<!\d)5(?!\d)", dead[0]["message"]), f"no line number 5 in {dead[0]['message']!r}"
    assert len(records) == 6 and metadata["inputs"]["total"] == 7


# ------------------------------------------------------------------------------------------
# CSV headers


def test_a_common_csv_header_is_recognised(tmp_path, capsys, images):
    """Which headers are recognised: tests/test_discover.py; here one, in case and spacing of its own."""
    manifest = write_csv(tmp_path / "list.csv", "Filename, Class", [(rel(p, tmp_path), p.parent.name) for p in images])
    run = imgrec_here(capsys, manifest, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, dead = check_complete(tmp_path / "out")
    assert metadata["label_map"] == {"cat": 0, "dog": 1}
    assert dead == [] and len(records) == 6 and metadata["inputs"]["total"] == 6


def test_a_recognised_header_does_not_shift_integer_label_ids(tmp_path, capsys, images):
    manifest = write_csv(tmp_path / "list.csv", "image,class",
                         [(rel(p, tmp_path), "3" if p.parent.name == "cat" else "7") for p in images])
    run = imgrec_here(capsys, manifest, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, dead = check_complete(tmp_path / "out")
    assert dead == []
    assert sorted({(text, label) for _, text, label in records}) == [("3", 3), ("7", 7)]


def test_joined_manifests_keep_their_integer_ids_and_a_comma_in_a_label_moves_no_cell(tmp_path, capsys, images):
    """`cat a.csv b.csv` repeats the header as a data row, whose label "label" made every id a
    class-name index (10 became 1); an unquoted comma in a label kept only the text before it."""
    cats, dogs = [p for p in images if p.parent.name == "cat"], [p for p in images if p.parent.name == "dog"]
    first = write_csv(tmp_path / "a.csv", "path,label", [(rel(p, tmp_path), "10") for p in cats])
    second = write_csv(tmp_path / "b.csv", "path,label", [(rel(p, tmp_path), "2") for p in dogs[:2]])
    manifest = tmp_path / "all.csv"
    manifest.write_text(first.read_text() + second.read_text() + f"{rel(dogs[2], tmp_path)},big, dog\n")
    run = imgrec_here(capsys, manifest, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, dead = check_complete(tmp_path / "out")
    assert metadata["label_map"] == {"2": 2, "10": 10}
    assert sorted({(text, label) for _, text, label in records}) == [("10", 10), ("2", 2)] and len(records) == 5
    assert sorted((row["error"], row["message"].split(":")[1].split(",")[0].strip()) for row in dead) == [
        ("BadManifestLine", "3 cells where the header names 2 (quote a path or label that holds a comma)"),
        ("BadManifestLine", "a header line")]


@pytest.mark.parametrize("cat,dog", [("-1", "1"), (str(2**63), "1")], ids=["negative", "over-int64"])
def test_integer_labels_that_are_no_int64_id_are_class_names(tmp_path, capsys, images, cat, dog):
    """-1 used to become id -1, published in a metadata.json no reader accepts (exit 1 after
    publishing); 2**63 wrapped to a negative int64 in the records (exit 0)."""
    manifest = write_csv(tmp_path / "list.csv", "path,label",
                         [(rel(p, tmp_path), cat if p.parent.name == "cat" else dog) for p in images])
    run = imgrec_here(capsys, manifest, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, _ = check_complete(tmp_path / "out")
    assert metadata["label_map"] == {name: i for i, name in enumerate(sorted((cat, dog)))}
    assert sorted({(text, label) for _, text, label in records}) == sorted(metadata["label_map"].items())


def test_dot_dot_after_a_symlink_is_the_file_the_os_opens(tmp_path, capsys):
    """`link/../x.png` beside a symlink to elsewhere/deep is elsewhere/x.png, as open() has it; it
    used to be read as the x.png beside the manifest (another image), and the two x.png files
    listed together were rejected as one path with conflicting labels."""
    beside, elsewhere = tmp_path / "m" / "x.png", tmp_path / "elsewhere" / "x.png"
    expected = {"near": write_photo(beside, seed=7101), "far": write_photo(elsewhere, seed=7102)}
    (tmp_path / "elsewhere" / "deep").mkdir()
    (tmp_path / "m" / "link").symlink_to("../elsewhere/deep", target_is_directory=True)
    manifest = write_csv(tmp_path / "m" / "list.csv", "path,label", [("x.png", "near"), ("link/../x.png", "far")])
    run = imgrec_here(capsys, manifest, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, dead = check_complete(tmp_path / "out")
    assert dead == [] and sorted(text for _, text, _ in records) == ["far", "near"]
    text_key, hash_key = feature_key(metadata, "label_text"), feature_key(metadata, "content_hash")
    hashes = {bytes_feature(e, text_key): bytes_feature(e, hash_key)
              for examples in read_examples(tmp_path / "out", metadata).values() for e in examples}
    assert hashes == {text: hashlib.sha256(data).hexdigest() for text, data in expected.items()}


def test_an_unrecognised_csv_header_is_refused_naming_the_accepted_ones(tmp_path, capsys, images):
    manifest = write_csv(tmp_path / "list.csv", "foo,bar", [(rel(p, tmp_path), p.parent.name) for p in images])
    out = tmp_path / "out"
    run = imgrec_here(capsys, manifest, out, PERMISSIVE)
    assert run.returncode == 2, run.brief()
    line = error_line(run)
    for accepted in ("path", "filename", "label", "class"):
        assert re.search(rf"\b{accepted}\b", line), f"{accepted!r} not named in {line}"
    assert nothing_published(out)


def test_manifest_columns_names_the_path_and_label_columns(tmp_path, capsys, images):
    """The label column first: the flag names which is which, whatever the order."""
    rows = [(p.parent.name, rel(p, tmp_path)) for p in images]
    manifest = write_csv(tmp_path / "list.csv", "bar,foo", rows)
    run = imgrec_here(capsys, manifest, tmp_path / "out", PERMISSIVE, "--manifest_columns=foo,bar")
    assert run.returncode == 0, run.brief()
    metadata, records, dead = check_complete(tmp_path / "out")
    assert metadata["label_map"] == {"cat": 0, "dog": 1}
    assert dead == [] and len(records) == 6


# ------------------------------------------------------------------------------------------
# One path, two labels


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_path_listed_with_two_labels_is_rejected_every_time_and_never_written(tmp_path, capsys, images, kind):
    listing = [(rel(p, tmp_path), p.parent.name) for p in images]
    twice = listing[0][0]  # a cat image, listed again as dog
    listing.insert(3, (twice, "dog"))
    if kind == "csv":
        manifest = write_csv(tmp_path / "list.csv", "path,label", listing)
    else:
        manifest = tmp_path / "list.jsonl"
        manifest.write_text("".join(json.dumps({"path": p, "label": label}) + "\n" for p, label in listing))
    run = imgrec_here(capsys, manifest, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, dead = check_complete(tmp_path / "out")
    name = pathlib.PurePosixPath(twice).name
    assert [(pathlib.PurePosixPath(r["path"]).name, r["error"]) for r in dead] == [(name, "ConflictingLabels")] * 2
    assert name not in [pathlib.PurePosixPath(p).name for p, _, _ in records]
    assert len(records) == 5 and metadata["inputs"]["total"] == 7


# ------------------------------------------------------------------------------------------
# Malformed manifests: not a file, lines that do not parse, lines without end


@pytest.mark.parametrize("kind, what", [("csv", "fifo"), ("jsonl", "device")])
def test_a_manifest_that_is_not_a_regular_file_is_a_usage_error(tmp_path, images, kind, what):
    """A FIFO must not block the run, /dev/zero must not fill memory (a folder, and each kind
    for each format: tests/test_discover.py)."""
    source = {"folder": tmp_path / "imgs", "fifo": tmp_path / "list", "device": pathlib.Path("/dev/zero")}[what]
    if what == "fifo":
        os.mkfifo(source)
    out = tmp_path / "out"
    run = run_imgrec(source, out, PERMISSIVE, f"--input_kind={kind}", timeout=60, rss_limit=4 * GiB)
    assert run.returncode == 2, run.brief()
    assert "not a regular file" in error_line(run)
    assert nothing_published(out)


def test_a_csv_header_over_the_csv_field_limit_is_an_unrecognised_header(tmp_path, capsys, images):
    manifest = write_csv(tmp_path / "list.csv", "x" * 140_000, [(rel(p, tmp_path), p.parent.name) for p in images])
    out = tmp_path / "out"
    run = imgrec_here(capsys, manifest, out, PERMISSIVE)
    assert run.returncode == 2, run.brief()
    line = error_line(run)
    assert "not recognised" in line and len(line) < 1000, line[:300]
    assert nothing_published(out)


def test_a_huge_line_is_one_bad_line_quoted_short_in_bounded_memory(tmp_path, images):
    rows = [json.dumps({"path": rel(p, tmp_path), "label": p.parent.name}).encode() for p in images]
    manifest = tmp_path / "list.jsonl"
    long_line = b'{"path": "' + b"a" * 64 * 2**20  # line 4, far over any line bound
    manifest.write_bytes(b"\n".join([*rows[:3], long_line, *rows[3:]]) + b"\n")
    run = run_imgrec(manifest, tmp_path / "out", PERMISSIVE, rss_limit=GiB)
    assert run.returncode == 0, run.brief()
    metadata, records, dead = check_complete(tmp_path / "out")
    assert [r["error"] for r in dead] == ["BadManifestLine"], dead
    assert re.search(r"(?<!\d)4(?!\d)", dead[0]["message"]) and len(dead[0]["message"]) < 1000, dead[0]["message"][:300]
    assert len(records) == 6 and metadata["inputs"]["total"] == 7


@pytest.mark.parametrize("value", ['["dog"]'])  # every kind of value: tests/test_discover.py
def test_a_jsonl_label_that_is_not_text_or_an_integer_is_a_bad_line_not_a_class(tmp_path, capsys, images, value):
    rows = [json.dumps({"path": rel(p, tmp_path), "label": p.parent.name}) for p in images[1:]]
    manifest = tmp_path / "list.jsonl"
    manifest.write_text("".join(f"{row}\n" for row in [
        f'{{"path": "{rel(images[0], tmp_path)}", "label": {value}}}', '{"path": 5, "label": "cat"}', *rows]))
    run = imgrec_here(capsys, manifest, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, dead = check_complete(tmp_path / "out")
    assert metadata["label_map"] == {"cat": 0, "dog": 1}
    assert [r["error"] for r in dead] == ["BadManifestLine"] * 2, dead
    assert images[0].name not in names({"path": p} for p, _, _ in records)
    assert len(records) == 5 and metadata["inputs"]["total"] == 7


@pytest.mark.parametrize("tail", ["house\"\n"])  # closed on the next line (never closed: tests/test_discover.py)
def test_a_csv_quote_left_open_is_a_bad_line_never_a_cut_short_label(tmp_path, capsys, images, tail):
    listing = [f"{rel(p, tmp_path)},{p.parent.name}\n" for p in images]
    opened = f'{rel(images[3], tmp_path)},"{images[3].parent.name}\n'  # line 5
    manifest = tmp_path / "list.csv"
    manifest.write_text("path,label\n" + "".join(listing[:3]) + opened + tail + "".join(listing[4:]))
    run = imgrec_here(capsys, manifest, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, dead = check_complete(tmp_path / "out")
    assert images[3].name not in names({"path": p} for p, _, _ in records)
    assert dead[0]["error"] == "BadManifestLine" and dead[0]["message"].startswith("line 5: "), dead
    assert "quoted fields cannot span lines" in dead[0]["message"]
    assert [r["error"] for r in dead] == ["BadManifestLine"] * (1 + bool(tail))
    assert len(records) == 5
