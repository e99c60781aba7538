"""Scheduled reprocessing: incremental runs (--reuse_from), resumed runs, and --skip_unchanged
against dated siblings. Every incremental or resumed output must equal a from-scratch run's."""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest
import tensorflow as tf

from pipeline import prepare
from pipeline.errors import UsageError
from pipeline.run import run
from tests.helpers import IN_MEMORY, REPO, SAMPLE, Run, error_line, run_here, run_imgrec
from transforms.write import tfrecord

pytestmark = pytest.mark.e2e


def photo(path: pathlib.Path, seed: int, size=(48, 64)) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    image = cv2.resize(rng.integers(0, 256, (5, 5, 3), dtype=np.uint8), size[::-1], interpolation=cv2.INTER_CUBIC)
    assert cv2.imwrite(str(path), image)


def make_images(root: pathlib.Path, count: int, first_seed: int = 0) -> list[pathlib.Path]:
    paths = []
    for i in range(count):
        path = root / ("ant", "bee", "cow")[i % 3] / f"img_{first_seed + i:05d}.{'png' if i % 4 == 0 else 'jpg'}"
        photo(path, first_seed + i)
        paths.append(path)
    return paths


FLAGS = ("--num_shards=2", "--height=32", "--width=32", "--max_error_fraction=0.5")


def convert(images: pathlib.Path, output: pathlib.Path, *flags: str) -> dict:
    run([*IN_MEMORY, f"--input={images}", f"--output={output}", *FLAGS, *flags])
    return json.loads((output / "metadata.json").read_text())


def resumable_args(images: pathlib.Path, output: pathlib.Path) -> list[str]:
    """A run slow enough (one converter, 96×96) to be killed with some of its parts finished."""
    return [*IN_MEMORY, f"--input={images}", f"--output={output}",
            "--num_shards=2", "--height=96", "--width=96", "--convert_processes=1"]


def resumable_run(images: pathlib.Path, output: pathlib.Path) -> list[str]:
    """`python -m pipeline.run` with `resumable_args`: the process the tests kill."""
    return [sys.executable, "-m", "pipeline.run", *resumable_args(images, output)]


def imgrec(capsys, args) -> Run:
    """`imgrec run ARGS` in this process (its main(), exit code and output), for the runs that are
    not killed: the same command as the process, without its interpreter and Beam start."""
    from pipeline.run import main

    return run_here(capsys, main, args)


def kill_once_parts_finish(argv: list[str], parts: pathlib.Path, count: int) -> None:
    """Starts `argv` and kill -9s its process group once `count` parts are finished in `parts`
    (a path that may hold `*` for the folder a template expands to)."""
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    finished = str(parts.relative_to(parts.anchor) / "*.json")
    deadline = time.monotonic() + 240
    while len(list(pathlib.Path(parts.anchor).glob(finished))) < count:
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no part finished in time"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture(scope="module")
def resumable_images(tmp_path_factory) -> pathlib.Path:
    """600 images, enough for a run of `resumable_run` to be killed with some of its parts finished."""
    images = tmp_path_factory.mktemp("resumable") / "images"
    make_images(images, 600)
    return images


@pytest.fixture(scope="module")
def uninterrupted(resumable_images, tmp_path_factory) -> pathlib.Path:
    """`resumable_run` of those images, never killed: what a killed and resumed run must equal."""
    output = tmp_path_factory.mktemp("uninterrupted") / "out"
    run(resumable_args(resumable_images, output))
    return output


def finished_records(parts: pathlib.Path) -> int:
    """The records in the parts a killed run finished (those in progress are converted again)."""
    return sum(json.loads(p.read_text())["records"] for p in parts.glob("*.json"))


def published(output: pathlib.Path) -> dict[str, bytes]:
    """Every file of the dataset but metadata.json, by relative name."""
    return {str(p.relative_to(output)): p.read_bytes() for p in sorted(output.rglob("*"))
            if p.is_file() and p.name != "metadata.json"}


def comparable(metadata: dict) -> dict:
    """metadata.json less what differs by design between two runs of the same inputs."""
    metadata = json.loads(json.dumps(metadata))
    for key in ("run", "reuse"):
        metadata.pop(key)
    for key in ("path", "reuse_from", "overwrite"):
        metadata["config"]["output"].pop(key)
    return metadata


def assert_same_dataset(actual: pathlib.Path, expected: pathlib.Path) -> None:
    assert published(actual) == published(expected)
    assert comparable(json.loads((actual / "metadata.json").read_text())) == \
        comparable(json.loads((expected / "metadata.json").read_text()))


@pytest.fixture(scope="module")
def changed_world(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """(images, first dataset, a from-scratch dataset of the images as they are now), which the
    tests only read: 60 images converted, then 9 added, 3 replaced with other pictures and 2
    removed; plus a broken file that stays broken."""
    root = tmp_path_factory.mktemp("changed")
    images = root / "images"
    paths = make_images(images, 60)
    (images / "ant" / "broken.jpg").write_bytes(b"not an image")
    first = root / "first"
    convert(images, first)
    make_images(images, 9, first_seed=1000)
    for path in paths[:3]:
        photo(path, 5000 + paths.index(path))
    for path in paths[-2:]:
        path.unlink()
    convert(images, root / "scratch")
    return images, first, root / "scratch"


@pytest.fixture
def changed_inputs(changed_world, tmp_path) -> tuple[pathlib.Path, pathlib.Path, int]:
    """(images, first dataset, images changed since): the first dataset is the test's own copy."""
    images, first, _ = changed_world
    shutil.copytree(first, tmp_path / "first")
    return images, tmp_path / "first", 9 + 3


@pytest.fixture
def scratch(changed_world) -> pathlib.Path:
    """The changed images converted from scratch: what every incremental run of them must equal."""
    return changed_world[2]


def test_incremental_run_equals_a_from_scratch_run(changed_inputs, scratch, tmp_path):
    images, first, changed = changed_inputs
    incremental = convert(images, tmp_path / "incremental", f"--reuse_from={first}")
    assert_same_dataset(tmp_path / "incremental", scratch)
    assert incremental["reuse"] == {"from": str(first), "reused": 67 - changed, "converted": changed}


def test_a_damaged_previous_dataset_costs_conversions_not_correctness(changed_inputs, scratch, tmp_path):
    images, first, _ = changed_inputs
    shard = sorted(first.glob("train-*.tfrecord"))[0]
    damaged = bytearray(shard.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    convert(images, tmp_path / "incremental", f"--reuse_from={first}")
    assert_same_dataset(tmp_path / "incremental", scratch)


def test_an_edited_record_index_never_gives_an_image_another_images_pixels(changed_inputs, scratch, tmp_path):
    images, first, changed = changed_inputs
    index = sorted((first / "index").glob("train-*.idx"))[0]
    rows = [line.split() for line in index.read_text().splitlines()]
    current = {hashlib.sha256(p.read_bytes()).hexdigest() for p in images.rglob("*") if p.is_file()}
    a, b = [i for i, row in enumerate(rows) if row[2] in current][:2]  # two images still unchanged
    for column in (0, 1, 3, 4):  # they keep their hashes but point at each other's record
        rows[a][column], rows[b][column] = rows[b][column], rows[a][column]
    index.write_text("".join(" ".join(row) + "\n" for row in rows))
    incremental = convert(images, tmp_path / "incremental", f"--reuse_from={first}")
    assert_same_dataset(tmp_path / "incremental", scratch)
    assert incremental["reuse"]["converted"] == changed + 2


def test_an_edited_record_index_never_gives_an_image_another_features_bytes(changed_inputs, scratch, tmp_path):
    """An index line pointed at the record's label text (a bytes value framed like the image's):
    the incremental run wrote `b'cow'` as the image."""
    images, first, changed = changed_inputs
    index = sorted((first / "index").glob("train-*.idx"))[0]
    rows = [line.split() for line in index.read_text().splitlines()]
    current = {hashlib.sha256(p.read_bytes()).hexdigest() for p in images.rglob("*") if p.is_file()}
    a = next(i for i, row in enumerate(rows) if row[2] in current)
    with open(first / index.name[:-len(".idx")], "rb") as handle:
        data = tfrecord.read_record_at(handle, int(rows[a][0]), int(rows[a][1]))
    features = json.loads((first / "metadata.json").read_text())["features"]
    key = next(k for k, v in features.items() if v.get("role") == "label_text")
    text = tf.train.Example.FromString(data).features.feature[key].bytes_list.value[0]
    rows[a][3], rows[a][4] = str(data.index(bytes([0x0A, len(text)]) + text) + 2), str(len(text))
    index.write_text("".join(" ".join(row) + "\n" for row in rows))
    incremental = convert(images, tmp_path / "incremental", f"--reuse_from={first}")
    assert_same_dataset(tmp_path / "incremental", scratch)
    assert incremental["reuse"]["converted"] == changed + 1


def test_skip_unchanged_sees_a_new_empty_class_and_a_missing_or_cut_shard_or_index(tmp_path):
    images, out = tmp_path / "images", tmp_path / "out"
    make_images(images, 12)
    first = convert(images, out)
    (images / "aardvark").mkdir()  # no image changed, but every label id did
    second = convert(images, out, "--skip_unchanged")
    assert second["run"]["run_id"] != first["run"]["run_id"]
    assert list(second["label_map"]) == ["aardvark", "ant", "bee", "cow"]
    assert convert(images, out, "--skip_unchanged")["run"]["run_id"] == second["run"]["run_id"]  # unchanged
    missing = out / second["splits"]["train"]["files"][0]
    missing.unlink()
    third = convert(images, out, "--skip_unchanged")  # not kept as it is: converted again, repaired
    assert third["run"]["run_id"] != second["run"]["run_id"] and missing.exists()
    shard = out / third["splits"]["train"]["files"][0]
    whole = shard.read_bytes()
    shard.write_bytes(whole[:-100])  # cut short: every file is there, one is not whole
    fourth = convert(images, out, "--skip_unchanged")
    assert fourth["run"]["run_id"] != third["run"]["run_id"] and shard.read_bytes() == whole
    index = out / "index" / (fourth["splits"]["train"]["files"][0] + ".idx")
    lines = index.read_bytes()
    index.write_bytes(lines[:lines.rindex(b"\n", 0, -1) + 1])  # its last line cut off, at a line's end
    fifth = convert(images, out, "--skip_unchanged")
    assert fifth["run"]["run_id"] != fourth["run"]["run_id"] and index.read_bytes() == lines
    index.unlink()
    os.mkfifo(index)  # opening it to read would block, with the output's lock held
    sixth = convert(images, out, "--skip_unchanged")
    assert sixth["run"]["run_id"] != fifth["run"]["run_id"] and index.read_bytes() == lines


@pytest.mark.unit
@pytest.mark.parametrize("data, records, shard_bytes, whole", [
    (b"0 20 ab 10 4\n20 30 cd 12 6\n", 2, 50, True),
    (b"0 20 ab 10 4\n20 30 cd 12 6\n", 2, None, True),  # gzip: the shard's size says nothing
    (b"", 0, 0, True),
    (b"0 20 ab 10 4\n", 2, 50, False),  # a line gone
    (b"0 20 ab 10 4\n20 30 cd 12", 2, None, False),  # cut inside the last line
    (b"0 20 ab 10 4\n20 30 cd 12 6\n", 2, 60, False),  # the shard holds more than the index frames
    (b"0 20 ab 10 4\n20 x cd 12 6\n", 2, 50, False),
    (b"20 30 cd 12 6\n0 20 ab 10 4\n", 2, 50, False),  # two lines swapped
    (b"7 20 ab 10 4\n20 30 cd 12 6\n", 2, 50, False),  # an offset edited
    (b"0 20 ab 10 4\n\xff\n", 2, 50, False),
])
def test_index_lists_records(data, records, shard_bytes, whole):
    assert prepare.index_lists_records(data, records, shard_bytes) is whole


def test_reuse_from_latest_takes_the_newest_dated_sibling(changed_inputs, tmp_path):
    images, first, changed = changed_inputs
    root = tmp_path / "datasets"
    shutil.copytree(first, root / "2026-01-01")
    shutil.copytree(first, root / "2025-12-31")
    (root / "2026-01-02").mkdir()  # unfinished: no metadata.json
    run([*IN_MEMORY, f"--input={images}", f"--output={root}/{{date}}", *FLAGS, "--reuse_from=latest"])
    (today,) = set(root.iterdir()) - {root / "2026-01-01", root / "2025-12-31", root / "2026-01-02"}
    metadata = json.loads((today / "metadata.json").read_text())
    assert metadata["reuse"]["from"] == str(root / "2026-01-01")
    assert metadata["reuse"]["converted"] == changed


def test_reuse_from_the_output_itself_needs_no_dataset_there_yet(changed_inputs, tmp_path):
    """`--output=X --overwrite --reuse_from=X` on a schedule: a first run, or the run after a
    publish cut short (no metadata.json), was refused with exit 2, so the schedule never recovered,
    though the interrupted run's message said to run the same command again."""
    images, _, _ = changed_inputs
    own = tmp_path / "own"
    first = convert(images, own, f"--reuse_from={own}/", "--overwrite")
    assert first["reuse"] is None and first["inputs"]["written"] == 67
    again = convert(images, own, f"--reuse_from={own}", "--overwrite")
    assert again["reuse"] == {"from": str(own), "reused": 67, "converted": 0}


@pytest.mark.parametrize("flags, reason", [
    (("--height=48",), "image settings"),
    (("--encoding=png",), "image settings"),
])
def test_a_dataset_that_cannot_serve_is_refused(changed_inputs, tmp_path, flags, reason):
    images, first, _ = changed_inputs
    with pytest.raises(UsageError, match=reason):
        convert(images, tmp_path / "out" / "nested", f"--reuse_from={first}", *flags)
    assert not (tmp_path / "out").exists()  # nor the parent the run created for it


def test_a_dataset_the_run_picks_itself_that_cannot_serve_converts_every_image(changed_inputs, tmp_path, capsys):
    """After the image settings change, `--reuse_from=latest` and `--output=X --reuse_from=X`
    met a dataset that cannot serve and exited 2 on every later run: the schedule was stuck for
    good, `latest` naming the old dataset forever. A dataset the user named is still refused."""
    images, first, _ = changed_inputs
    own = tmp_path / "own"
    shutil.copytree(first, own)
    mended = convert(images, own, f"--reuse_from={own}", "--overwrite", "--height=48")
    assert mended["reuse"] is None and mended["inputs"]["written"] == 67
    assert f"{own} cannot serve this run: it was written with other image settings" in capsys.readouterr().err
    root = tmp_path / "datasets"
    shutil.copytree(first, root / "2026-01-01")
    run([*IN_MEMORY, f"--input={images}", f"--output={root}/{{date}}", *FLAGS, "--reuse_from=latest", "--height=48"])
    (today,) = set(root.iterdir()) - {root / "2026-01-01"}
    assert json.loads((today / "metadata.json").read_text())["reuse"] is None
    assert "cannot serve this run" in capsys.readouterr().err


def test_a_retry_kept_unchanged_says_no_image_is_converted_though_latest_cannot_serve(tmp_path, capsys):
    """A gzip schedule's retry: `latest` (its own dataset, gzip) cannot serve, and the line said
    "converting every image" before the run found the inputs unchanged and converted nothing."""
    images = tmp_path / "images"
    make_images(images, 4)
    args = [*IN_MEMORY, f"--input={images}", f"--output={tmp_path}/{{date}}", *FLAGS, "--compression=gzip",
            "--skip_unchanged", "--compare_to=latest", "--reuse_from=latest"]
    assert imgrec(capsys, args).returncode == 0
    retry = imgrec(capsys, args)
    assert retry.returncode == 0 and "unchanged" in retry.stdout
    assert "gzip-compressed" in retry.stderr and "converting every image" not in retry.stderr


def test_an_older_format_is_refused(changed_inputs, tmp_path):
    images, first, _ = changed_inputs
    metadata = json.loads((first / "metadata.json").read_text())
    metadata["format_version"] = 1
    (first / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(UsageError, match="format_version 1"):
        convert(images, tmp_path / "out", f"--reuse_from={first}")
    (first / "metadata.json").write_bytes(b'{"format_version": "\xff"}')
    with pytest.raises(UsageError, match="not valid JSON: 'utf-8' codec"):
        convert(images, tmp_path / "out", f"--reuse_from={first}")


def test_the_documented_schedule_is_safe_to_retry_and_keeps_the_last_datasets(tmp_path, capsys):
    """The README's daily command: a retry the same day exits 0 without converting when nothing
    changed, and converts when something did; --keep_last removes the oldest datasets (only the
    files imgrec wrote); a template that finds no dataset says so."""
    images = tmp_path / "images"
    make_images(images, 12)
    root = tmp_path / "datasets"
    convert(images, root / "2026-01-01")
    for older in ("2025-12-30", "2025-12-31"):
        shutil.copytree(root / "2026-01-01", root / older)
    (root / "2025-12-30" / "notes.txt").write_text("mine")

    def scheduled(template: str = "{date}") -> Run:
        done = imgrec(capsys, [*IN_MEMORY, f"--input={images}", f"--output={root}/{template}", *FLAGS,
                               "--skip_unchanged", "--compare_to=latest", "--reuse_from=latest", "--keep_last=2"])
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    done = scheduled()
    assert f"match the dataset in {root / '2026-01-01'}" in done.stdout
    assert sorted(p.name for p in root.iterdir()) == ["2025-12-30", "2025-12-31", "2026-01-01"]
    assert sorted(p.name for p in (root / "2025-12-30").iterdir()) == ["notes.txt"]  # removed but the user's file
    photo(images / "ant" / "new.jpg", 99)
    scheduled()
    (today,) = set(root.iterdir()) - {root / "2025-12-30", root / "2025-12-31", root / "2026-01-01"}
    assert not (root / "2025-12-31").exists()
    assert json.loads((today / "metadata.json").read_text())["inputs"]["written"] == 13
    assert "unchanged" in scheduled().stdout  # a retry the same day
    # The same day, the new image withdrawn: compared with today's dataset, the newest, which
    # is rebuilt; the day before's, which the inputs match again, must not make it look unchanged.
    (images / "ant" / "new.jpg").unlink()
    scheduled()
    assert json.loads((today / "metadata.json").read_text())["inputs"]["written"] == 12
    assert "--compare_to=latest: no finished dataset in the folders" in scheduled("{timestamp}").stderr



def test_keep_last_removes_the_pictures_verify_drew_beside_a_dataset(tmp_path):
    """A schedule that runs `imgrec verify` after each run (the README's next step) kept every
    removed day's folder, holding contact_sheet.png and class_counts.png, so --keep_last never
    bounded the folders; the user's own files still keep theirs."""
    from pipeline.output.retention import datasets_to_remove, remove_dataset

    images = tmp_path / "images"
    make_images(images, 4)
    root = tmp_path / "datasets"
    for day in ("2026-01-01", "2026-01-02", "2026-01-03"):
        convert(images, root / day)
        for picture in ("contact_sheet.png", "class_counts.png"):
            (root / day / picture).write_bytes(b"\x89PNG")
    (root / "2026-01-01" / "notes.txt").write_text("mine")
    said = [remove_dataset(folder) for folder in datasets_to_remove(f"{root}/{{date}}", 1)]
    assert said == [f"removed the dataset in {root / '2026-01-01'}, not the folder: it holds files imgrec did not "
                    "write", f"removed {root / '2026-01-02'}"]  # not "removed" a folder that is there
    assert sorted(p.name for p in root.iterdir()) == ["2026-01-01", "2026-01-03"]
    assert sorted(p.name for p in (root / "2026-01-01").iterdir()) == ["notes.txt"]

def test_keep_last_says_a_removed_datasets_folder_holds_a_stopped_runs_staging(tmp_path):
    """A day's folder whose retry was killed keeps the killed run's staging when --keep_last
    removes its dataset: the line said the folder "holds files imgrec did not write"."""
    from pipeline.output.retention import datasets_to_remove, remove_dataset

    images = tmp_path / "images"
    make_images(images, 4)
    root = tmp_path / "datasets"
    for day in ("2026-01-01", "2026-01-02"):
        convert(images, root / day)
    parts = root / "2026-01-01" / ".imgrec-staging" / "parts"
    parts.mkdir(parents=True)
    (parts / f"{0:064x}.records").write_bytes(b"")
    (folder,) = datasets_to_remove(f"{root}/{{date}}", 1)
    assert remove_dataset(folder) == (f"removed the dataset in {folder}, not the folder: it holds the staging of a "
                                      f"stopped run (delete {folder}/.imgrec-staging once nothing there is needed)")
    assert [p.name for p in (root / "2026-01-01").iterdir()] == [".imgrec-staging"]


def test_keep_last_never_removes_the_runs_own_output(tmp_path, capsys):
    """A sibling named later than today (a clock set ahead, or the other of two {timestamp} runs
    that finished first) made --keep_last=1 try to remove the dataset this run had just published:
    its own lock kept it, with a warning that it "is locked by a run"."""
    images = tmp_path / "images"
    make_images(images, 4)
    root = tmp_path / "datasets"
    for day in ("2026-01-01", "2099-01-01"):
        convert(images, root / day)
    done = imgrec(capsys, [*IN_MEMORY, f"--input={images}", f"--output={root}/{{date}}", *FLAGS, "--keep_last=1"])
    assert done.returncode == 0 and "locked" not in done.stderr, done.stderr
    (today,) = set(root.iterdir()) - {root / "2099-01-01"}
    assert (today / "metadata.json").exists() and not (root / "2026-01-01").exists()


def test_a_dataset_keep_last_cannot_remove_does_not_fail_the_run_that_published(tmp_path, capsys, monkeypatch):
    """An older day's shard that cannot be removed (another user's file, a store refusing the
    delete) made the run that had just published exit 1, 'the run failed: PermissionError', with a
    traceback and no summary: a scheduler retried a run that had succeeded."""
    from transforms import files

    images = tmp_path / "images"
    make_images(images, 4)
    root = tmp_path / "datasets"
    convert(images, root / "2026-01-01")
    delete = files.delete

    def refused(paths):
        paths = list(paths)
        if any(path.endswith(".tfrecord") and "2026-01-01" in path for path in paths):
            raise PermissionError(1, "Operation not permitted", paths[0])
        delete(paths)

    monkeypatch.setattr(files, "delete", refused)
    done = imgrec(capsys, [*IN_MEMORY, f"--input={images}", f"--output={root}/{{date}}", *FLAGS, "--keep_last=1"])
    assert done.returncode == 0, done.stderr
    assert "output:" in done.stdout and "Traceback" not in done.stderr
    assert (f"warning: could not remove the dataset in {root / '2026-01-01'} (--keep_last=1): [Errno 1] Operation "
            "not permitted") in done.stderr and "delete what is left by hand" in done.stderr
    (today,) = set(root.iterdir()) - {root / "2026-01-01"}
    assert (today / "metadata.json").exists()


def test_a_template_without_a_folder_finds_the_datasets_beside_it(tmp_path, capsys, monkeypatch):
    """`--output={date}`, run in the datasets' folder: `latest` found no dataset and --keep_last
    removed none, the siblings being listed in the folder '' (none)."""
    images = tmp_path / "images"
    make_images(images, 4)
    root = tmp_path / "datasets"
    convert(images, root / "2026-01-01")
    photo(images / "ant" / "new.jpg", 99)
    monkeypatch.chdir(root)
    done = imgrec(capsys, [*IN_MEMORY, f"--input={images}", "--output={date}", *FLAGS, "--skip_unchanged",
                           "--compare_to=latest", "--reuse_from=latest", "--keep_last=1"])
    assert done.returncode == 0, done.stderr
    (today,) = root.iterdir()
    assert json.loads((today / "metadata.json").read_text())["reuse"] == {"from": "2026-01-01", "reused": 4,
                                                                          "converted": 1}


def test_the_command_advised_for_a_stopped_runs_staging_leaves_out_the_flags_that_need_the_template(tmp_path,
                                                                                                     capsys):
    """The README's schedule, told to "run with --output=FOLDER to finish" a stopped run's
    staging, exited 2: 'latest' and --keep_last need the template, not a folder."""
    images = tmp_path / "images"
    make_images(images, 4)
    stopped = tmp_path / "datasets" / "2026-01-01"
    (stopped / ".imgrec-staging" / "parts").mkdir(parents=True)
    done = imgrec(capsys, [*IN_MEMORY, f"--input={images}", f"--output={tmp_path}/datasets/{{date}}", *FLAGS,
                           "--skip_unchanged", "--compare_to=latest", "--reuse_from=latest", "--keep_last=7"])
    assert done.returncode == 0, done.stderr
    assert (f"run with --output={stopped} (without --compare_to=latest, --reuse_from=latest, --keep_last) to "
            "finish it") in done.stderr


def test_skip_unchanged_compares_with_the_outputs_own_dataset_whatever_compare_to_names(tmp_path):
    """A skip leaves the output as it is: its own dataset must be the one that matched (a
    backfill into an older dated folder, with a newer sibling that matches the inputs)."""
    images, other = tmp_path / "images", tmp_path / "other"
    make_images(images, 9)
    make_images(other, 6, first_seed=50)
    newer = convert(images, tmp_path / "newer")
    own = tmp_path / "own"
    first = convert(other, own)
    again = convert(images, own, "--skip_unchanged", f"--compare_to={tmp_path / 'newer'}")
    assert again["run"]["run_id"] != first["run"]["run_id"]
    assert again["inputs"]["written"] == 9 and again["fingerprint"] == newer["fingerprint"]


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_finished_parts(tmp_path, capsys, resumable_images, uninterrupted):
    """kill -9 mid-conversion, then the same command again: the finished parts are taken as they
    are, the parts in progress converted again; the output equals an uninterrupted run's."""
    images = resumable_images
    output = tmp_path / "out"
    parts = output / ".imgrec-staging" / "parts"
    kill_once_parts_finish(resumable_run(images, output), parts, 4)
    finished = finished_records(parts)
    assert not (output / "metadata.json").exists()
    done = imgrec(capsys, resumable_args(images, output))
    assert done.returncode == 0, done.stderr[-2000:]
    resumed = json.loads((output / "metadata.json").read_text())["run"]["resumed_records"]
    assert resumed == finished > 0
    assert f"resumed: {resumed} records" in done.stdout
    assert published(output) == published(uninterrupted)


@pytest.mark.slow
def test_a_run_killed_in_a_timestamp_folder_is_reported_and_resumed_there(tmp_path, capsys, resumable_images,
                                                                           uninterrupted):
    """`--output=ROOT/{timestamp}`: the next run expands to another folder, so a killed run's
    staging stayed for good without a word (83 MB in one report). The next run names it, and the
    command it advises resumes it."""
    images, root = resumable_images, tmp_path / "root"
    template = root / "{timestamp}"
    kill_once_parts_finish(resumable_run(images, template), root / "*" / ".imgrec-staging" / "parts", 2)
    (killed,) = root.iterdir()
    finished = finished_records(killed / ".imgrec-staging" / "parts")
    time.sleep(1.1)  # the next second: another folder
    done = imgrec(capsys, resumable_args(images, template))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (f"imgrec: warning: {killed} holds the staging of a stopped run, and no run of this template "
            f"writes there again; run with --output={killed} to finish it") in done.stderr
    resumed = imgrec(capsys, resumable_args(images, killed))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((killed / "metadata.json").read_text())["run"]["resumed_records"] == finished > 0
    assert published(killed) == published(uninterrupted)


def test_a_fifo_named_metadata_json_in_the_reuse_source_is_a_reason_not_a_hang(tmp_path):
    """--reuse_from's metadata.json was opened as Beam opens any file: a FIFO there blocked the
    run before it began, for good."""
    source = tmp_path / "previous"
    source.mkdir()
    os.mkfifo(source / "metadata.json")
    run = run_imgrec(SAMPLE, tmp_path / "out", f"--reuse_from={source}", timeout=60)
    assert run.returncode == 2 and not run.timed_out, run.brief()
    assert "a FIFO, not a regular file" in error_line(run), run.brief()
