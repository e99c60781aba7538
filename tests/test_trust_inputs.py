"""Issue 8, "Inputs that must never hang, exhaust memory or vanish": only regular files are read,
reads and decodes are bounded, and every path under the input is accounted for.

Black-box: `python -m pipeline.run` in a subprocess whose process tree is sampled for RSS and
killed on a timeout, so a hang or a memory blow-up fails the test instead of the machine; a run
with nothing to bound is imgrec's `main(argv)` in this process (`imgrec_here`).
"""
from __future__ import annotations

import os
import pathlib
import shutil

import cv2
import numpy as np
import pytest

from tests.helpers import (
    IN_MEMORY,
    MULTI_PROCESSING,
    GiB,
    Watched,
    check_complete,
    imgrec_argv,
    imgrec_here,
    make_tree,
    run_imgrec,
    tile_bomb,
    write_photo,
    write_png_rows,
)

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


def test_a_fifo_or_device_named_like_an_image_is_a_dead_letter_not_a_hang_nor_memory(tmp_path):
    """Opening a FIFO blocks, and /dev/zero never ends: neither is read, each is a dead letter."""
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    os.mkfifo(data / "cat" / "x.jpg")
    os.symlink("/dev/zero", data / "dog" / "zero.jpg")
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE, timeout=60, rss_limit=GiB)
    assert not run.timed_out, f"the run hangs on a FIFO: {run.brief()}"
    assert not run.killed_for_memory, f"reading /dev/zero grew past 1 GiB: {run.brief()}"
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    named = by_name(rows)
    for name in ("x.jpg", "zero.jpg"):
        assert named[name]["error"] == "UnreadableFile" and "regular" in named[name]["message"].lower(), named[name]
    assert len(records) == 6 and metadata["inputs"]["total"] == 8


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


def test_max_decoded_bytes_counts_width_height_channels_and_depth(tmp_path, capsys):
    """Refused by the header (no decode, nothing to bound): imgrec's main() in this process."""
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})                         # 32x32x3x1 = 3 KiB decoded
    write_photo(data / "dog" / "wide.png", seed=5, size=(512, 512))  # 512x512x3x1 = 768 KiB decoded
    run = imgrec_here(capsys, data, tmp_path / "out", PERMISSIVE, "--max_decoded_bytes=200000", "--height=16",
                      "--width=16")
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    named = by_name(rows)
    assert set(named) == {"wide.png"}, rows
    assert (named["wide.png"]["error"], named["wide.png"]["stage"]) == ("ImageTooLarge", "header")
    assert len(records) == 6


# ------------------------------------------------------------------------------------------
# Discovery accounts for every path


def test_every_path_under_the_input_is_a_record_or_a_dead_letter(tmp_path):
    """What discovery must account for (each kind in detail: tests/test_discover.py), in one real
    run: a symlinked class folder, nested folders, a folder named like an image, a file outside
    any class folder, a text file, hidden and AppleDouble files, a dangling symlink and symlink
    loops. Every path is a record with its class folder's label or a dead letter; only the
    dangling symlink is an error; the loops neither hang nor multiply inputs."""
    data = tmp_path / "data"
    expected = {p.name: p.parent.name for p in make_tree(data, {"cat": 3, "dog": 3})}
    make_tree(tmp_path / "elsewhere", {"bird": 2})
    os.symlink(tmp_path / "elsewhere" / "bird", data / "bird", target_is_directory=True)
    expected |= {p.name: "bird" for p in (tmp_path / "elsewhere" / "bird").iterdir()}
    for seed, (path, label) in enumerate({data / "cat" / "sub" / "deeper" / "nested_a.jpg": "cat",
                                          data / "dog" / "z.jpg" / "in_folder.png": "dog"}.items()):
        write_photo(path, seed=seed)
        expected[path.name] = label
    write_photo(data / "stray_root.jpg", seed=2)
    (data / "cat" / "readme.txt").write_text("hi")
    appledouble = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + bytes(64)
    (data / "cat" / "._cat_0000.png").write_bytes(appledouble)
    (data / "dog" / ".hidden.jpg").write_bytes(b"editor swap file, not pixels")
    (data / "cat" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1" + bytes(32))
    os.symlink(tmp_path / "nowhere.jpg", data / "dog" / "dangling.jpg")
    os.symlink(data / "cat", data / "cat" / "again", target_is_directory=True)
    os.symlink(data, data / "dog" / "up", target_is_directory=True)
    run = run_imgrec(data, tmp_path / "out", PERMISSIVE, timeout=60, rss_limit=GiB)
    assert not run.timed_out and not run.killed_for_memory, run.brief()
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    assert metadata["label_map"] == {"bird": 0, "cat": 1, "dog": 2}
    assert dict(zip(record_names(records), (text for _, text, _ in records))) == expected
    assert len(records) == len(expected)
    assert {name: row["error"] for name, row in by_name(rows).items()} == {
        "stray_root.jpg": "SkippedFile", "readme.txt": "SkippedFile", "._cat_0000.png": "SkippedFile",
        ".hidden.jpg": "SkippedFile", ".DS_Store": "SkippedFile", "again": "SkippedFile", "up": "SkippedFile",
        "dangling.jpg": "UnreadableFile"}
    assert metadata["inputs"]["total"] == len(records) + len(rows) and metadata["inputs"]["errors"] == 1


def test_a_file_name_that_is_not_utf8_is_accounted_for_and_may_name_a_duplicate(tmp_path, capsys):
    """A Latin-1 file name (an old zip extracted on Linux) crashed the whole run; as a duplicate
    its name goes into metadata.json, where it once failed the publish with a UnicodeEncodeError.
    Nothing here is bounded: imgrec's main() in this process."""
    data = tmp_path / "data"
    make_tree(data, {"cat": 3, "dog": 3})
    write_photo(tmp_path / "tmp.jpg", seed=61)
    os.rename(tmp_path / "tmp.jpg", os.fsencode(data / "cat") + b"/caf\xe9.jpg")
    original = data / "dog" / "dog_0000.png"
    (data / "copy").mkdir()
    pathlib.Path(os.fsdecode(os.fsencode(data / "copy") + b"/caf\xe9.png")).write_bytes(original.read_bytes())
    run = imgrec_here(capsys, data, tmp_path / "out", PERMISSIVE)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.brief()
    metadata, records, rows = check_complete(tmp_path / "out")
    assert metadata["inputs"]["total"] == 8 == len(records) + len(rows)
    others = [n for n in record_names(records) + [pathlib.PurePosixPath(r["path"]).name for r in rows]
              if not n.startswith(("cat_", "dog_"))]
    assert sorted(n[:3] for n in others) == ["caf", "caf"], others
    assert metadata["duplicates"]["groups"] == 1, metadata["duplicates"]


def test_a_folder_a_glob_cannot_list_is_a_dead_letter(tmp_path):
    """A shell's glob passes over a folder it cannot list, and so did imgrec's: its images were
    neither written nor reported. A class-folder walk already said so. Root lists any folder, so
    as root the command runs without the capabilities that override permissions."""
    data, out = tmp_path / "in", tmp_path / "out"
    make_tree(data, {"cat": 2, "dog": 2})
    prefix = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("root lists any folder, and setpriv is not installed to drop that")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    (data / "dog").chmod(0o000)
    try:
        run = Watched([*prefix, *imgrec_argv(f"{data}/*/*.*", out, PERMISSIVE)]).finish(120)
    finally:
        (data / "dog").chmod(0o755)
    assert run.returncode == 0, run.brief()
    metadata, records, rows = check_complete(out)
    assert sorted(pathlib.Path(path).name for path, _, _ in records) == ["cat_0000.png", "cat_0001.jpg"]
    assert [(row["path"], row["error"]) for row in rows] == [(str(data / "dog"), "UnreadableFile")], rows
    assert "cannot list folder" in rows[0]["message"] and "Permission denied" in rows[0]["message"]
