"""Issue 8, "Inputs that must never hang, exhaust memory or vanish": only regular files are read,
reads and decodes are bounded, and every path under the input is accounted for.

Black-box: `python -m pipeline.run` in a subprocess whose process tree is sampled for RSS and
killed on a timeout, so a hang or a memory blow-up fails the test instead of the machine.
"""
from __future__ import annotations

import os
import pathlib

import cv2
import numpy as np
import pytest

from tests.helpers import IN_MEMORY, MULTI_PROCESSING, tile_bomb
from tests.trust_helpers import GiB, check_complete, make_tree, metadata_of, run_imgrec, write_image, write_png_rows

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PERMISSIVE = "--max_error_fraction=1"


def by_name(rows: list[dict]) -> dict[str, dict]:
    named = {}
    for row in rows:
        name = pathlib.PurePosixPath(row["path"]).name
        assert name not in named, f"{name} has two dead letters: {named[name]}, {row}"
        named[name] = row
    return named


def record_names(records) -> list[str]:
    return [pathlib.PurePosixPath(path).name for path, _, _ in records]


# ------------------------------------------------------------------------------------------
# Special files


def test_a_fifo_named_like_an_image_is_a_dead_letter_not_a_hang(tmp_path):
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    os.mkfifo(data / "cat" / "x.jpg")
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE, timeout=30, rss_limit=GiB)
    assert not run.timed_out, f"the run hangs on a FIFO: {run.brief()}"
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    row = by_name(rows)["x.jpg"]
    assert row["error"] == "UnreadableFile" and "regular" in row["message"].lower(), row
    assert len(records) == 6 and metadata["inputs"]["total"] == 7


def test_a_symlink_to_dev_zero_is_a_dead_letter_with_bounded_memory(tmp_path):
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    os.symlink("/dev/zero", data / "dog" / "zero.jpg")
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE, timeout=60, rss_limit=GiB)
    assert not run.killed_for_memory, f"reading /dev/zero grew past 1 GiB: {run.brief()}"
    assert not run.timed_out, run.brief()
    assert run.returncode == 0, run.brief()
    assert run.peak_rss < GiB
    metadata, records, rows = check_complete(tmp_path / "out")
    row = by_name(rows)["zero.jpg"]
    assert row["error"] == "UnreadableFile" and "regular" in row["message"].lower(), row
    assert len(records) == 6 and metadata["inputs"]["total"] == 7


def test_files_larger_than_max_file_bytes_are_rejected_without_being_read(tmp_path):
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    noise = np.random.default_rng(77).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    assert cv2.imwrite(str(data / "cat" / "big.png"), noise)
    assert (data / "cat" / "big.png").stat().st_size > 100_000
    with open(data / "dog" / "huge.jpg", "wb") as handle:  # 3 GiB, sparse: reading it whole would show
        handle.write(b"\xff\xd8\xff\xe0")
        handle.truncate(3 * GiB)
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE, "--max_file_bytes=100000", timeout=90, rss_limit=GiB)
    assert not run.killed_for_memory, f"a 3 GiB file was read whole: {run.brief()}"
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    named = by_name(rows)
    for name in ("big.png", "huge.jpg"):
        assert (named[name]["error"], named[name]["stage"]) == ("FileTooLarge", "read"), named[name]
    assert len(records) == 6 and set(named) == {"big.png", "huge.jpg"}


# ------------------------------------------------------------------------------------------
# Decoded size


@pytest.fixture(scope="module")
def png_16bit_rgba_bomb(tmp_path_factory) -> pathlib.Path:
    """13000x13000 16-bit RGBA: ~1.3 MB on disk, 1.35 GB decoded (169 Mpx: under max_pixels)."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.png"
    write_png_rows(path, 13000, 13000, bit_depth=16, color_type=6)
    assert path.stat().st_size < 4 * 2**20
    return path


def test_a_16bit_rgba_png_is_rejected_by_its_decoded_size_before_decoding(tmp_path, png_16bit_rgba_bomb):
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    os.link(png_16bit_rgba_bomb, data / "cat" / "bomb.png")
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE, timeout=90, rss_limit=GiB)
    assert not run.killed_for_memory, f"decoding the PNG took the run past 1 GiB: {run.brief()}"
    assert run.returncode == 0, run.brief()
    assert run.peak_rss < 0.75 * GiB, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    row = by_name(rows)["bomb.png"]
    assert (row["error"], row["stage"]) == ("ImageTooLarge", "header"), row
    assert "byte" in row["message"].lower(), row
    assert len(records) == 6


@pytest.mark.parametrize("runner", [IN_MEMORY, MULTI_PROCESSING], ids=["in_memory", "multi_processing"])
def test_a_decode_that_needs_more_memory_than_its_header_says_is_a_dead_letter_on_every_runner(tmp_path, runner):
    """Whichever runner converts, it converts in a converter process whose decode memory is
    bounded (the limit itself: tests/test_limits.py)."""
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    (data / "cat" / "tiles.tif").write_bytes(tile_bomb())
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE, "--max_decoded_bytes=32000000", runner=runner, timeout=120,
                     rss_limit=2 * GiB)
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    row = by_name(rows)["tiles.tif"]
    assert (row["error"], row["stage"]) == ("CorruptImage", "decode") and "out of memory" in row["message"], row
    assert len(records) == 6


def test_max_decoded_bytes_counts_width_height_channels_and_depth(tmp_path):
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})                         # 32x32x3x1 = 3 KiB decoded
    write_image(data / "dog" / "wide.png", seed=5, size=(512, 512))  # 512x512x3x1 = 768 KiB decoded
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE, "--max_decoded_bytes=200000", "--height=16",
                     "--width=16", timeout=60)
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    named = by_name(rows)
    assert set(named) == {"wide.png"}, rows
    assert (named["wide.png"]["error"], named["wide.png"]["stage"]) == ("ImageTooLarge", "header")
    assert len(records) == 6


# ------------------------------------------------------------------------------------------
# Discovery accounts for every path


def test_a_symlinked_class_folder_is_followed_and_converted(tmp_path):
    data = tmp_path / "data"
    make_tree(data, {"cat": 3})
    make_tree(tmp_path / "elsewhere", {"dog": 3})
    os.symlink(tmp_path / "elsewhere" / "dog", data / "dog", target_is_directory=True)
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    assert metadata["label_map"] == {"cat": 0, "dog": 1}
    assert sorted(text for _, text, _ in records) == ["cat"] * 3 + ["dog"] * 3
    assert metadata["inputs"]["total"] == 6 and not rows


def test_a_dangling_symlink_is_an_unreadable_file(tmp_path):
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    os.symlink(tmp_path / "gone" / "x.jpg", data / "cat" / "broken.jpg")
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    assert by_name(rows)["broken.jpg"]["error"] == "UnreadableFile"
    assert metadata["inputs"]["total"] == 7 and len(records) == 6


def test_a_file_in_the_input_root_is_reported_as_skipped(tmp_path):
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    write_image(data / "stray.jpg", seed=31)
    run = run_imgrec(data, tmp_path / "out", "--max_error_fraction=0")
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    assert by_name(rows)["stray.jpg"]["error"] == "SkippedFile"
    assert metadata["inputs"]["total"] == 7 and metadata["inputs"]["errors"] == 0
    assert "stray.jpg" not in record_names(records)


def test_files_in_nested_subfolders_get_their_class_folder_label(tmp_path):
    data = tmp_path / "data"
    make_tree(data, {"cat": 2, "dog": 2})
    write_image(data / "cat" / "sub" / "nested_x.jpg", seed=41)
    write_image(data / "cat" / "sub" / "deeper" / "nested_y.png", seed=42)
    write_image(data / "dog" / "2024" / "nested_z.jpg", seed=43)
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    assert metadata["label_map"] == {"cat": 0, "dog": 1}
    labels = {name: text for (path, text, _), name in zip(records, record_names(records))}
    assert {k: v for k, v in labels.items() if k.startswith("nested")} == {
        "nested_x.jpg": "cat", "nested_y.png": "cat", "nested_z.jpg": "dog"}
    assert metadata["inputs"]["total"] == 7 and not rows


def test_a_folder_named_like_an_image_is_descended_into(tmp_path):
    data = tmp_path / "data"
    make_tree(data, {"cat": 2, "dog": 2})
    write_image(data / "cat" / "y.jpg" / "inside.png", seed=51)
    run = run_imgrec(data, tmp_path / "out", "--max_error_fraction=0")
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    assert "y.jpg" not in by_name(rows), "the folder itself was reported"
    assert ("inside.png", "cat") in [(n, t) for n, (_, t, _) in zip(record_names(records), records)]
    assert metadata["inputs"]["total"] == 5


def test_every_path_under_the_input_is_a_record_or_a_dead_letter(tmp_path):
    data = tmp_path / "data"
    expected = {p.name for p in make_tree(data, {"cat": 3, "dog": 3})}
    make_tree(tmp_path / "elsewhere", {"bird": 2})
    os.symlink(tmp_path / "elsewhere" / "bird", data / "bird", target_is_directory=True)
    expected |= {p.name for p in (tmp_path / "elsewhere" / "bird").iterdir()}
    extras = {
        "stray_root.jpg": data / "stray_root.jpg",
        "nested_a.jpg": data / "cat" / "sub" / "nested_a.jpg",
        "in_folder.png": data / "dog" / "z.jpg" / "in_folder.png",
        "readme.txt": data / "cat" / "readme.txt",
    }
    for name, path in extras.items():
        write_image(path, seed=len(name) * 7) if name.endswith((".jpg", ".png")) else path.write_text("hi")
    os.symlink(tmp_path / "nowhere.jpg", data / "dog" / "dangling.jpg")
    expected |= set(extras) | {"dangling.jpg"}
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    seen = record_names(records) + [pathlib.PurePosixPath(r["path"]).name for r in rows]
    assert sorted(seen) == sorted(expected), {"missing": sorted(expected - set(seen)),
                                              "unexpected": sorted(set(seen) - expected)}
    assert metadata["inputs"]["total"] == len(expected) == len(records) + len(rows)


def test_a_file_name_that_is_not_utf8_is_accounted_for(tmp_path):
    """A Latin-1 file name (an old zip extracted on Linux): on main the whole run crashes."""
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    write_image(tmp_path / "tmp.jpg", seed=61)
    os.rename(tmp_path / "tmp.jpg", os.fsencode(data / "cat") + b"/caf\xe9.jpg")
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    assert metadata["inputs"]["total"] == 7 == len(records) + len(rows)
    others = [n for n in record_names(records) + [pathlib.PurePosixPath(r["path"]).name for r in rows]
              if not n.startswith(("cat_", "dog_"))]
    assert len(others) == 1 and others[0].startswith("caf"), others


def test_a_file_name_that_is_not_utf8_may_name_a_duplicate(tmp_path):
    """The duplicate report carries the name into metadata.json: the run must still end with
    exit 0 and one dataset (it once published, then failed with a UnicodeEncodeError)."""
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    original = sorted((data / "cat").iterdir())[0]
    (data / "copy").mkdir()
    (pathlib.Path(os.fsdecode(os.fsencode(data / "copy") + b"/caf\xe9.jpg"))).write_bytes(original.read_bytes())
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    assert metadata["inputs"]["total"] == 7 == len(records) + len(rows)
    assert metadata["duplicates"]["groups"] == 1, metadata["duplicates"]


@pytest.mark.parametrize("pattern", ["", "/*/*"], ids=["class_folders", "glob"])
def test_a_folder_name_that_is_not_utf8_never_merges_into_another_class(tmp_path, pattern):
    """`a` + byte 0xFF reads as label `a\\xff`; a folder really named `a\\xff` must not receive
    its images (they merged into one class, in glob mode until stop 27)."""
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "a\\xff": 2})
    undecodable = pathlib.Path(os.fsdecode(os.fsencode(data) + b"/a\xff"))
    for seed in (71, 72):
        write_image(undecodable / f"{seed}.jpg", seed=seed)
    run = run_imgrec(f"{data}{pattern}", tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    assert metadata["label_map"] == {"a\\xff": 0, "cat": 1}
    assert sorted(record_names(records)) == sorted(os.listdir(data / "a\\xff") + os.listdir(data / "cat"))
    assert sorted((by_name(rows)[f"{seed}.jpg"]["error"] for seed in (71, 72))) == ["AmbiguousLabel"] * 2


def test_a_glob_matches_names_with_backslashes_as_a_shell_does(tmp_path):
    """Beam's `*` stops at a backslash, so `b\\c.png` and everything in `dog\\v2` were left out
    without a dead letter; and the label of `dog\\v2/e.png` was `v2`."""
    data = tmp_path / "data"
    for i, name in enumerate(("cat/a.png", "cat/b\\c.png", "dog/d.png", "dog\\v2/e.png")):
        write_image(data / name, seed=80 + i)
    run = run_imgrec(f"{data}/*/*.png", tmp_path / "out")
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    assert sorted((pathlib.PurePosixPath(path).name, label) for path, label, _ in records) == [
        ("a.png", "cat"), ("b\\c.png", "cat"), ("d.png", "dog"), ("e.png", "dog\\v2")] and not rows


def test_earlier_outputs_inside_the_input_are_not_classes(tmp_path):
    """A schedule writing `--output=IN/{timestamp}`: each earlier dataset became an empty class of
    the next run, shifting the real classes' ids run after run."""
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    first = run_imgrec(data, data / "run1")
    assert first.returncode == 0, first.brief()
    second = run_imgrec(data, data / "run2", f"--reuse_from={data / 'run1'}")
    assert second.returncode == 0, second.brief()
    metadata, records, rows = check_complete(data / "run2")
    assert metadata["label_map"] == metadata_of(data / "run1")["label_map"] == {"cat": 0, "dog": 1}
    assert len(records) == 6 and not rows and metadata["reuse"]["reused"] == 6, metadata.get("reuse")


def test_a_symlink_loop_neither_hangs_nor_multiplies_inputs(tmp_path):
    """Guard for the nested/symlink walk (passes on main, which walks neither): a link back to
    a parent folder must not recurse without end (os.walk(followlinks=True) would)."""
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    os.symlink(data / "cat", data / "cat" / "again", target_is_directory=True)
    os.symlink(data, data / "dog" / "up", target_is_directory=True)
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE, timeout=60, rss_limit=GiB)
    assert not run.timed_out and not run.killed_for_memory, run.brief()
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    assert {n for n in record_names(records)} == {f"{c}_{i:04d}{'.png' if i == 0 else '.jpg'}"
                                                 for c in ("cat", "dog") for i in range(3)}
    assert metadata["inputs"]["total"] < 20, metadata["inputs"]


# ------------------------------------------------------------------------------------------
# Hidden files and macOS AppleDouble files


def test_appledouble_and_hidden_files_are_skipped_not_errors(tmp_path):
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    appledouble = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + bytes(64)
    (data / "cat" / "._cat_0000.png").write_bytes(appledouble)
    (data / "dog" / "._dog_0001.jpg").write_bytes(appledouble)
    (data / "dog" / ".hidden.jpg").write_bytes(b"editor swap file, not pixels")
    (data / "cat" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1" + bytes(32))
    run = run_imgrec(data, tmp_path / "out", "--max_error_fraction=0")
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    named = by_name(rows)
    assert {n: r["error"] for n, r in named.items()} == {
        "._cat_0000.png": "SkippedFile", "._dog_0001.jpg": "SkippedFile", ".hidden.jpg": "SkippedFile",
        ".DS_Store": "SkippedFile"}
    assert metadata["inputs"]["errors"] == 0 and len(records) == 6
