"""Issue 8, "Publishing and the output folder": one winner, staging inside the output, foreign
files untouched, a killed driver publishes nothing, the output is never re-ingested.

Black-box, on real files: every run a test races, signals, kills, freezes, limits or mounts is
`python -m pipeline.run` in a subprocess; the other runs (refusals, the runs that set up a dataset
or prove that the same command then completes) are its `main(argv)` in this process
(`imgrec_here`: exit code, one-line error, published files), as in test_trust_cli.py.
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import signal
import socket
import subprocess
import time
import uuid

import psutil
import pytest

from pipeline.output.publish import JOURNAL_FILE
from tests.helpers import (
    IN_MEMORY,
    MULTI_PROCESSING,
    REPO,
    Watched,
    check_complete,
    error_line,
    finish_all,
    imgrec_argv,
    imgrec_here,
    kill_all,
    make_tree,
    metadata_of,
    module_argv,
    nothing_published,
    published_files,
    run_pipeline,
    snapshot,
    subprocess_env,
    tree,
    verify_here,
    write_photo,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LOCK = ".imgrec.lock"
STAGING = ".imgrec-staging"
# Raw float32 224x224 records from 400x500 images: several seconds of conversion in memory.
HEAVY = ("--encoding=raw", "--normalize=unit", "--num_shards=4")
HEAVY_IMAGES = 200


@pytest.fixture(scope="module")
def heavy_input(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("heavy") / "imgs"
    make_tree(root, {"ant": HEAVY_IMAGES // 2, "bee": HEAVY_IMAGES // 2}, size=(400, 500))
    return root


def lock_json(pid: int, host: str | None = None, age_s: float = 0) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - age_s))
    return json.dumps({"run_id": "0" * 32, "host": host or socket.gethostname(), "pid": pid,
                       "started": stamp, "heartbeat": stamp})


def wait_for(predicate, timeout: float, watched: Watched | None = None, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if watched is not None:
            assert watched.sample(), f"the run ended before {what}: {watched.finish(1).brief()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def any_shard_under(root: pathlib.Path) -> bool:
    """Records being written anywhere under root: a converted part (imgrec writes shards as parts,
    then concatenates them) or a shard, inside the output or beside it."""
    return any(root.rglob("*.records")) or \
        any(p.name.startswith(("ant-", "bee-", "train-", "val-", "test-")) for p in root.rglob("*-of-*"))


def read_lock(out: pathlib.Path) -> dict | None:
    """OUTPUT/.imgrec.lock as JSON, or None when there is none (retries a lock being rewritten)."""
    for _ in range(50):
        try:
            return json.loads((out / LOCK).read_text())
        except FileNotFoundError:
            return None
        except json.JSONDecodeError:
            time.sleep(0.02)
    return json.loads((out / LOCK).read_text())


THIS_HOST = {socket.gethostname(), socket.getfqdn(), platform.node()}


def assert_lock_message(line: str, out: pathlib.Path) -> None:
    assert str(out / LOCK) in line, line
    assert any(word in line.lower() for word in ("remove", "delete", "rm ")), f"does not say how to clear it: {line}"


# ------------------------------------------------------------------------------------------
# Two runs into one output


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_concurrent_runs_have_exactly_one_winner(heavy_input, tmp_path):
    out = tmp_path / "out"
    runs = finish_all([Watched(imgrec_argv(heavy_input, out, *HEAVY)) for _ in range(2)], timeout=180)
    codes = sorted(r.returncode for r in runs)
    assert codes == [0, 3], "\n\n".join(r.brief() for r in runs)
    loser = runs[[r.returncode for r in runs].index(3)]
    assert_lock_message(error_line(loser), out)
    metadata, records, _ = check_complete(out)
    assert metadata["inputs"]["written"] == len(records) == HEAVY_IMAGES
    listed = {n for s in metadata["splits"].values() for n in s["files"]} | set(metadata["error_files"])
    assert published_files(out) == listed | {"metadata.json", "index"}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_second_run_during_a_conversion_is_refused_and_the_first_completes(heavy_input, tmp_path, capsys):
    """Even with --overwrite, the second run must not touch the running one's lock, staging or output."""
    out = tmp_path / "out"
    first = Watched(imgrec_argv(heavy_input, out, *HEAVY))
    wait_for(lambda: any_shard_under(tmp_path), 120, first, "the first run started writing shards")
    lock = read_lock(out)
    frozen = [p for p in tree(first.root)]
    for p in frozen:  # freeze the first run mid-conversion (its pid stays alive), so it is
        p.suspend()   # certainly still converting while the second run tries
    try:
        second = imgrec_here(capsys, heavy_input, out, *HEAVY, "--overwrite")
    finally:
        for p in frozen:
            p.resume()
    assert second.returncode == 3, second.brief()
    assert_lock_message(error_line(second), out)
    assert lock is not None, "no OUTPUT/.imgrec.lock while the first run was converting"
    assert {"run_id", "host", "pid", "started", "heartbeat"} <= set(lock), lock
    assert lock["pid"] == first.pid and lock["host"] in THIS_HOST, lock
    still = read_lock(out)
    assert still is None or still["pid"] == first.pid, f"the second run replaced the lock: {still}"
    result = first.finish(180)
    assert result.returncode == 0, result.brief()
    metadata, records, _ = check_complete(out)
    assert len(records) == HEAVY_IMAGES


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_run_whose_lock_was_cleared_rechecks_before_publishing(heavy_input, tmp_path):
    """An operator follows the message and deletes the lock of a run that is in fact still
    converting, then starts another run: whichever publishes second must notice (the re-check
    right before publishing) and refuse, so the output holds one complete dataset."""
    out = tmp_path / "out"
    first = Watched(imgrec_argv(heavy_input, out, *HEAVY))
    wait_for(lambda: (out / LOCK).exists(), 120, first, "the first run took the lock")
    (out / LOCK).unlink()
    second = Watched(imgrec_argv(heavy_input, out, *HEAVY, "--num_shards=3"))
    runs = finish_all([first, second], timeout=180)
    assert sorted(r.returncode == 0 for r in runs) == [False, True], "\n\n".join(r.brief() for r in runs)
    metadata, records, _ = check_complete(out)
    assert len(records) == HEAVY_IMAGES
    listed = {n for s in metadata["splits"].values() for n in s["files"]} | set(metadata["error_files"])
    assert published_files(out) == listed | {"metadata.json", "index"}


@pytest.mark.slow
def test_the_stale_lock_of_a_killed_run_is_taken_over(heavy_input, tmp_path, capsys):
    """kill -9 leaves OUTPUT/.imgrec.lock behind with a dead pid on this host: the next run takes over."""
    out = tmp_path / "out"
    killed = Watched(imgrec_argv(heavy_input, out, *HEAVY))
    wait_for(lambda: read_lock(out) is not None, 120, killed, "the run took the lock")
    dead = read_lock(out)["pid"]
    killed.kill()  # SIGKILL, every process of that run, by pid
    assert read_lock(out) is not None and read_lock(out)["pid"] == dead
    run = imgrec_here(capsys, heavy_input, out, *HEAVY)
    assert run.returncode == 0, run.brief()
    metadata, records, _ = check_complete(out)
    assert len(records) == HEAVY_IMAGES
    lock = read_lock(out)
    assert lock is None or lock["pid"] != dead, "the dead run's lock is still there"


def test_a_lock_held_by_a_live_process_blocks(tmp_path, capsys):
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 3, "bee": 3})
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen(["sleep", "120"])
    time.sleep(1.5)  # the lock is younger than its owner, as a real lock is
    try:
        text = lock_json(holder.pid, age_s=0)
        (out / LOCK).write_text(text)
        run = imgrec_here(capsys, root, out)
        assert run.returncode == 3, run.brief()
        assert_lock_message(error_line(run), out)
        assert (out / LOCK).read_text() == text
        assert nothing_published(out)
    finally:
        holder.kill()
        holder.wait()


def test_a_live_lock_blocks_a_republish_and_keeps_the_dataset(tmp_path, capsys):
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 3, "bee": 3})
    out = tmp_path / "out"
    assert imgrec_here(capsys, root, out).returncode == 0
    before = snapshot(out)
    holder = subprocess.Popen(["sleep", "120"])
    time.sleep(1.5)
    try:
        (out / LOCK).write_text(lock_json(holder.pid, age_s=0))
        run = imgrec_here(capsys, root, out, "--overwrite")
        assert run.returncode == 3, run.brief()
        after = snapshot(out)
        after.pop(LOCK)
        assert after == before
    finally:
        holder.kill()
        holder.wait()


# ------------------------------------------------------------------------------------------
# Staging inside the output; mount points; unwritable outputs


@pytest.mark.slow
def test_staging_lives_inside_the_output_and_nothing_is_written_beside_it(heavy_input, tmp_path):
    parent = tmp_path / "parent"
    parent.mkdir()
    out = parent / "out"
    run = Watched(imgrec_argv(heavy_input, out, *HEAVY))
    beside, staged_inside = set(), False
    while run.sample():
        beside |= {p.name for p in parent.iterdir()} - {"out"}
        staged_inside = staged_inside or any(p.is_file() for p in (out / STAGING).rglob("*"))
        time.sleep(0.02)
    result = run.finish(100)
    assert result.returncode == 0, result.brief()
    assert not beside, f"staged beside the output: {sorted(beside)}"
    assert staged_inside, "nothing was ever staged in OUTPUT/.imgrec-staging/"
    assert not (out / STAGING).exists() or not any((out / STAGING).rglob("*")), "staging left behind"
    check_complete(out)


def _namespace_available(tmp_path: pathlib.Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    ok = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                         f"mount -t tmpfs -o size=1m tmpfs {probe}"], capture_output=True).returncode == 0
    probe.rmdir()
    return ok


def in_mount_namespace(script: str, *args: str) -> list[str]:
    """argv that runs `script` (sh, with "$@" = args) in a private mount namespace, so test mounts
    vanish with it."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *args]


def test_output_on_its_own_mount_point_is_published(tmp_path):
    """`docker run -v host:/out ... --output=/out`: the output is a mount point; publishing must be a
    rename inside it (staging on another device fails with EXDEV after the whole conversion)."""
    if not _namespace_available(tmp_path):
        pytest.skip("cannot create a private mount namespace with a tmpfs here")
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 4, "bee": 4})
    parent, copy = tmp_path / "parent", tmp_path / "copy"
    out = parent / "out"
    out.mkdir(parents=True)
    copy.mkdir()
    script = ('mount -t tmpfs -o size=256m tmpfs "$1" || exit 97; mounted="$1"; copy="$2"; shift 2; '
              '"$@"; rc=$?; cp -a "$mounted/." "$copy/"; exit $rc')
    run = Watched(in_mount_namespace(script, str(out), str(copy), *imgrec_argv(root, out))).finish(90)
    assert run.returncode != 97, run.brief()
    assert run.returncode == 0, run.brief()
    assert "EXDEV" not in run.stderr and "Invalid cross-device link" not in run.stderr
    metadata, records, _ = check_complete(copy)
    assert len(records) == 8
    assert {p.name for p in parent.iterdir()} == {"out"}, "staged beside the mounted output"


@pytest.fixture(scope="module")
def dataset_named_ds1(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """(input, PARENT/ds1): a dataset the glob-like outputs beside it, PARENT/ds? and so on, match."""
    parent = tmp_path_factory.mktemp("globs")
    root = parent / "imgs"
    make_tree(root, {"ant": 3, "bee": 3})
    sibling = parent / "ds1"
    run_pipeline(root, sibling)
    return root, sibling


@pytest.mark.parametrize("name", ["ds?", "out[1]"])
def test_an_output_named_like_a_glob_is_only_itself(dataset_named_ds1, name, capsys):
    """Beam's FileSystems.delete matches its path as a pattern: `ds?` removed nothing of its own
    (each run failed after publishing, its staging left behind) but `ds1`'s files. A wildcard
    that matches the sibling and a bracket here; every kind of pattern character (`d*` among
    them) is taken literally in tests/test_files.py (files.as_pattern, files.delete)."""
    root, sibling = dataset_named_ds1
    before = snapshot(sibling)
    out = sibling.parent / name
    for flags in ((), ("--overwrite", "--shuffle_seed=1")):
        run = imgrec_here(capsys, root, out, *flags)
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.brief()
        assert published_files(out) == published_files(sibling) and not (out / ".imgrec-staging").exists()
        assert len(check_complete(out)[1]) == 6
    assert snapshot(sibling) == before


def test_a_full_disk_fails_one_run_not_the_next(tmp_path):
    """A run that fills the output's filesystem fails; its finished parts must not keep the disk
    full, so a smaller conversion into the same output still succeeds, and nothing half-written
    (a metadata.json.tmp-*) stays behind."""
    if not _namespace_available(tmp_path):
        pytest.skip("cannot create a private mount namespace with a tmpfs here")
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 6, "bee": 6})
    out, copy = tmp_path / "out", tmp_path / "copy"
    out.mkdir()
    copy.mkdir()
    small = ("--height=32", "--width=32", "--overwrite")
    # 12 float32 224x224 records are 7.2 MB, staged and then concatenated: more than the 6 MB there.
    script = ('mount -t tmpfs -o size=6m tmpfs "$1" || exit 97; o="$1"; c="$2"; shift 2; '
              '"$@" --overwrite 2> "$c/big.err"; echo $? > "$c/big.rc"; '
              '"$@" ' + " ".join(small) + '; rc=$?; cp -a "$o/." "$c/out/"; exit $rc')
    (copy / "out").mkdir()
    float32 = ("--normalize=unit", "--encoding=raw")
    run = Watched(in_mount_namespace(script, str(out), str(copy), *imgrec_argv(root, out), *float32)).finish(180)
    assert run.returncode != 97, run.brief()
    big_err = (copy / "big.err").read_text()
    assert (copy / "big.rc").read_text().strip() == "1", big_err[-2000:]
    assert "No space left on device" in big_err and "filesystem is full" in big_err, big_err[-2000:]
    assert "Traceback" not in big_err, big_err[-2000:]  # the machine's state, not a bug: one line
    assert run.returncode == 0, run.brief()
    metadata, records, _ = check_complete(copy / "out")
    assert len(records) == 12 and metadata["image"]["height"] == 32
    assert not [p for p in (copy / "out").rglob("*") if ".tmp-" in p.name]


def test_a_write_error_while_publishing_keeps_the_previous_dataset(tmp_path, capsys):
    """The new metadata.json is the largest file here (300 classes of one tiny image) and the only
    one over the file-size limit (EFBIG, as ENOSPC would be): the replacing run fails while it
    publishes, and the dataset it was replacing must still be there, whole."""
    root = tmp_path / "imgs"
    make_tree(root, {f"class_with_a_rather_long_descriptive_name_{i:04d}": 1 for i in range(300)}, size=(8, 8))
    out = tmp_path / "out"
    flags = ("--height=8", "--width=8", "--normalize=none", "--encoding=png", "--num_shards=10")
    assert imgrec_here(capsys, root, out, *flags).returncode == 0
    before = snapshot(out)
    assert (out / "metadata.json").stat().st_size > 40 * 1024
    limited = ["sh", "-c", 'ulimit -f 40 && exec "$@"', "sh",
               *imgrec_argv(root, out, *flags, "--overwrite", "--shuffle_seed=1")]
    failed = Watched(limited).finish(90)
    assert failed.returncode == 1 and "File too large" in failed.stderr, failed.brief()
    after = snapshot(out)
    assert {k: v for k, v in after.items() if not k.startswith(".imgrec-staging")} == before
    metadata, records, _ = check_complete(out)
    assert len(records) == 300
    assert imgrec_here(capsys, root, out, *flags, "--overwrite", "--shuffle_seed=1").returncode == 0
    assert check_complete(out)[0]["config"]["output"]["shuffle_seed"] == 1


@pytest.mark.parametrize("where", ["read-only parent", "read-only output"])
def test_unwritable_output_fails_fast_with_one_line(tmp_path, where):
    if not _namespace_available(tmp_path):
        pytest.skip("cannot create a private mount namespace with a tmpfs here")
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 4, "bee": 4})
    parent = tmp_path / "parent"
    parent.mkdir()
    if where == "read-only parent":
        mountpoint, out = parent, parent / "out"        # OUTPUT does not exist and cannot be created
    else:
        out = parent / "out"
        out.mkdir()
        mountpoint = out                                # OUTPUT exists, empty, not writable
    script = 'mount -t tmpfs -o ro,size=1m tmpfs "$1" || exit 97; shift; exec "$@"'
    run = Watched(in_mount_namespace(script, str(mountpoint), *imgrec_argv(root, out))).finish(90)
    assert run.returncode != 97, run.brief()
    assert run.returncode == 2, run.brief()
    line = error_line(run)
    assert str(parent) in line, line  # names the output (or its parent)
    assert "writ" in line.lower() or "read-only" in line.lower(), line
    assert {p.name for p in parent.iterdir()} <= {"out"}


# ------------------------------------------------------------------------------------------
# Files imgrec did not write


FOREIGN = {
    "train-00000-of-00010.tfrecord": b"somebody else's shard",
    "dataset_info.json": b'{"name": "not imgrec"}',
    "features.json": b'{"feature": "theirs"}',
    "notes.txt": b"keep me",
    "errors-00000-of-00003.jsonl": b'{"not": "ours"}\n',
    "sub/train-00001-of-00002.tfrecord": b"nested, theirs",
    "sub/readme.md": b"theirs too",
}


def write_foreign(out: pathlib.Path, names=FOREIGN) -> None:
    for name, data in names.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)


def assert_foreign_intact(out: pathlib.Path, names=FOREIGN) -> None:
    for name, data in names.items():
        assert (out / name).is_file(), f"{name} was deleted"
        assert (out / name).read_bytes() == data, f"{name} was modified"


def test_an_output_that_is_a_regular_file_is_refused_before_converting(tmp_path, capsys):
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 3, "bee": 3})
    out = tmp_path / "out"
    out.write_bytes(b"somebody's file")
    run = imgrec_here(capsys, root, out, "--overwrite")
    assert run.returncode == 2, run.brief()
    assert str(out) in error_line(run)
    assert out.read_bytes() == b"somebody's file"
    assert {p.name for p in tmp_path.iterdir()} == {"imgs", "out"}


def test_a_non_empty_folder_that_is_not_a_dataset_is_refused(tmp_path, capsys):
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 3, "bee": 3})
    out = tmp_path / "out"
    write_foreign(out)
    before = snapshot(out)
    run = imgrec_here(capsys, root, out)
    assert run.returncode == 2, run.brief()
    line = error_line(run)
    assert str(out) in line and "--overwrite" in line, line
    assert snapshot(out) == before


def test_overwrite_into_a_foreign_folder_leaves_foreign_files_alone(tmp_path, capsys):
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 3, "bee": 3})
    out = tmp_path / "out"
    write_foreign(out)
    run = imgrec_here(capsys, root, out, "--overwrite", "--num_shards=2")
    assert run.returncode == 0, run.brief()
    assert_foreign_intact(out)
    metadata, records, _ = check_complete(out)
    assert len(records) == 6


def test_overwrite_never_replaces_a_foreign_file_with_a_name_imgrec_writes(tmp_path, capsys):
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 2, "bee": 2})
    out = tmp_path / "out"
    out.mkdir()
    (out / "metadata.json").write_text('{"name": "my project"}')  # JSON, but not an imgrec dataset's
    (out / "train-00000-of-00001.tfrecord").write_text("my old shard")
    before = snapshot(out)
    refused = imgrec_here(capsys, root, out, "--overwrite", "--split_ratios=1,0,0")
    assert refused.returncode == 2 and "metadata.json" in error_line(refused), refused.brief()
    assert snapshot(out) == before
    (out / "metadata.json").unlink()  # the shard's name is known only once the counts are: at publishing
    failed = imgrec_here(capsys, root, out, "--overwrite", "--split_ratios=1,0,0")
    assert failed.returncode == 1 and "train-00000-of-00001.tfrecord" in failed.stderr, failed.brief()
    assert (out / "train-00000-of-00001.tfrecord").read_text() == "my old shard"
    assert not (out / "metadata.json").exists()


@pytest.mark.parametrize("output", ["cat", "."])
def test_an_output_that_would_hide_inputs_is_refused(tmp_path, capsys, output):
    data = tmp_path / "data"
    make_tree(data, {"cat": 2, "dog": 2})
    before = snapshot(data)
    run = imgrec_here(capsys, data, data / output, "--overwrite")
    assert run.returncode == 2, run.brief()
    assert "--output" in error_line(run)
    assert snapshot(data) == before


@pytest.mark.slow
def test_republish_removes_only_the_files_the_previous_dataset_listed(tmp_path, capsys):
    root = tmp_path / "imgs"
    make_tree(root, {"ant": 4, "bee": 4})
    (root / "bee" / "broken.jpg").write_bytes(b"\xff\xd8\xff not really")
    out = tmp_path / "out"
    first = imgrec_here(capsys, root, out, "--num_shards=3", "--max_error_fraction=1")
    assert first.returncode == 0, first.brief()
    previous = metadata_of(out)
    previous_files = {n for s in previous["splits"].values() for n in s["files"]} | set(previous["error_files"])
    foreign = {k: v for k, v in FOREIGN.items() if k not in ("dataset_info.json", "features.json")}
    write_foreign(out, foreign)
    second = imgrec_here(capsys, root, out, "--num_shards=2", "--max_error_fraction=1", "--overwrite")
    assert second.returncode == 0, second.brief()
    assert_foreign_intact(out, foreign)
    metadata, records, _ = check_complete(out)
    listed = {n for s in metadata["splits"].values() for n in s["files"]} | set(metadata["error_files"])
    assert published_files(out) == listed | {"metadata.json", "index"} | {n.split("/")[0] for n in foreign}
    assert not (previous_files - listed) & published_files(out), "old shards were kept"


# ------------------------------------------------------------------------------------------
# kill -9 of the driver


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


RUN_MARK = "IMGREC_TEST_RUN"  # the test's own, not imgrec's (imgrec's reaper uses one of its own)


def marked(mark: str) -> list[psutil.Process]:
    """Every live process on this machine whose environment carries RUN_MARK=mark: whatever a run
    started with that variable started in turn, seen by sampling its tree or not (a process
    clearing its environment would escape, as none of imgrec's or Beam's does)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(RUN_MARK) == mark and alive(p):
                found.append(p)
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("moment", ["workers_started", "shards_being_written"])
def test_killing_the_driver_stops_every_worker_and_publishes_nothing(heavy_input, tmp_path, moment, capsys):
    """kill -9 of `python -m pipeline.run` (multi_processing): its workers must not outlive it and
    nothing may be published afterwards. On main, a kill just after the workers start leaves them
    running indefinitely; a kill mid-conversion lets them finish writing every shard."""
    out = tmp_path / "out"
    mark = uuid.uuid4().hex
    run = Watched(imgrec_argv(heavy_input, out, *HEAVY, runner=MULTI_PROCESSING), env={RUN_MARK: mark})
    try:
        if moment == "workers_started":
            wait_for(lambda: len(run.seen) >= 3, 150, run, "worker processes were started")
            settle = time.monotonic() + 0.5
        else:
            wait_for(lambda: any_shard_under(tmp_path) and len(run.seen) >= 3, 150, run,
                     "workers were started and a shard was being written")
            settle = time.monotonic() + 0.2
        while time.monotonic() < settle:  # a last look at the tree, so no descendant is missed
            run.sample()
            time.sleep(0.02)
        descendants = [p for pid, p in run.seen.items() if pid != run.pid]
        carrying = {p.pid for p in marked(mark)}
        unmarked = [p.pid for p in descendants if alive(p) and p.pid not in carrying and alive(p)]
        assert not unmarked, f"processes of the run without its mark (so the search below would miss such): {unmarked}"
        assert run.popen.poll() is None, "the run ended before it could be killed"
        os.kill(run.pid, signal.SIGKILL)
        run.popen.wait()
        killed = time.monotonic()
        while (any(alive(p) for p in descendants) or marked(mark)) and time.monotonic() < killed + 15:
            assert nothing_published(out), f"published after the driver died: {sorted(published_files(out))}"
            time.sleep(0.1)
        left = {p.pid: p for p in [*descendants, *marked(mark)] if alive(p)}
        survivors = [(pid, " ".join(p.cmdline())[-100:]) for pid, p in left.items()]
        assert not survivors, f"15 s after kill -9 of the driver these still run: {survivors}"
        # No process of the run is left, seen in its tree or found by the mark it passed on: a
        # last look that nothing lands in the output after them (a rename already under way).
        gone = time.monotonic()
        while time.monotonic() < gone + 3:
            assert nothing_published(out), f"published after the driver died: {sorted(published_files(out))}"
            time.sleep(0.1)
    finally:
        run.kill()  # every process of that run we saw, by pid
        kill_all(marked(mark))  # and any we did not see
    rerun = imgrec_here(capsys, heavy_input, out, *HEAVY, runner=MULTI_PROCESSING)
    assert rerun.returncode == 0, rerun.brief()
    metadata, records, _ = check_complete(out)
    assert len(records) == HEAVY_IMAGES


# ------------------------------------------------------------------------------------------
# Signals: SIGINT and SIGTERM unwind cleanly, and never halfway through publishing

def wait_for_exit(run: Watched, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while run.sample():
        assert time.monotonic() < deadline, f"still running {seconds:.0f} s after the signal: {run.finish(1).brief()}"
        time.sleep(0.05)


def survivors(run: Watched, grace: float = 10) -> list[tuple[int, str]]:
    """Descendants of an ended run still alive after `grace` seconds (the reaper needs a moment)."""
    deadline = time.monotonic() + grace
    while True:
        left = [(p.pid, " ".join(p.cmdline())[-100:]) for pid, p in run.seen.items() if pid != run.pid and alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("runner,signum,moment", [
    (IN_MEMORY, signal.SIGTERM, "writing"), (IN_MEMORY, signal.SIGINT, "writing, to every process"),
    (MULTI_PROCESSING, signal.SIGINT, "writing"), (IN_MEMORY, signal.SIGINT, "writing, twice"),
    (MULTI_PROCESSING, signal.SIGTERM, "workers_started")],
    ids=["in_memory-SIGTERM", "in_memory-Ctrl-C", "multi_processing-SIGINT", "in_memory-SIGINT-twice",
         "multi_processing-SIGTERM-workers_started"])
def test_a_signal_to_the_driver_mid_conversion_stops_the_run_cleanly(heavy_input, tmp_path, capsys, runner, signum,
                                                                   moment):
    """A signal to the driver alone (a scheduler's timeout, `docker stop`), or to all its processes
    (Ctrl-C), while workers start or shards are being written: exit 130 with one line, the lock
    released, nothing published, no process left, and the same command then completes. Before,
    multi_processing could hang in Beam's join of its worker threads (holding the lock until
    SIGKILL), SIGINT could exit 1 with Beam's RuntimeError, and tracebacks (Beam's, the
    converters') buried the message."""
    out = tmp_path / "out"
    run = Watched(imgrec_argv(heavy_input, out, *HEAVY, runner=runner))
    try:
        if moment == "workers_started":
            wait_for(lambda: len(run.seen) >= 3, 150, run, "worker processes were started")
        else:
            wait_for(lambda: any_shard_under(tmp_path), 150, run, "a shard was being written")
        for process in tree(run.root) if moment.endswith("every process") else [run.root]:
            os.kill(process.pid, signum)
        if moment.endswith("twice"):  # an impatient user: the second one must not cut the clean-up short
            time.sleep(0.05)
            os.kill(run.pid, signum)
        wait_for_exit(run, 30)
        assert not survivors(run)
    finally:
        done = run.finish(1)
    assert done.returncode == 130, done.brief()
    assert error_line(done) == "imgrec: error: interrupted; nothing was published"
    assert not (out / LOCK).exists()
    assert nothing_published(out)
    assert not list((out / STAGING).glob("run-*")), "the run's staging outlived it"
    rerun = imgrec_here(capsys, heavy_input, out, *HEAVY, runner=runner)
    assert rerun.returncode == 0, rerun.brief()
    assert len(check_complete(out)[1]) == HEAVY_IMAGES


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("runner", [IN_MEMORY, MULTI_PROCESSING], ids=["in_memory", "multi_processing"])
def test_a_signal_while_publishing_is_reported_as_what_the_output_holds(tmp_path, runner, capsys):
    """SIGTERM the moment publishing starts (its journal appears), while a dataset is replaced.
    In the driver's process (in_memory) the renames finish first, so the new dataset is whole and
    the run a success (exit 0, with a note); a worker process (multi_processing) may be cut short,
    and then the message says what the output holds. Before, the message was always "nothing was
    published", and in_memory left a half-published output."""
    data, out = tmp_path / "data", tmp_path / "out"
    make_tree(data, {"ant": 20, "bee": 20})
    run_pipeline(data, out, "--num_shards=1")  # the dataset to replace (the runner matters not)
    old_run = metadata_of(out)["run"]["run_id"]
    many_files = ("--overwrite", "--num_shards=300")  # 900 shards and their index files: a slow publish
    run = Watched(imgrec_argv(data, out, *many_files, runner=runner))
    journal = out / STAGING / JOURNAL_FILE
    deadline = time.monotonic() + 150
    while not journal.exists():
        assert run.popen.poll() is None, f"the run ended before publishing was seen: {run.finish(1).brief()}"
        assert time.monotonic() < deadline, "publishing never began"
        time.sleep(0.001)
    os.kill(run.pid, signal.SIGTERM)
    wait_for_exit(run, 60)
    done = run.finish(1)
    assert "Traceback" not in done.stderr, done.brief()
    published = (out / "metadata.json").exists()
    if published and metadata_of(out)["run"]["run_id"] != old_run:  # the new dataset, whole
        assert done.returncode == 0, done.brief()
        assert "imgrec: a signal came " in done.stderr and not (out / STAGING).exists()
        assert len(check_complete(out)[1]) == 40
        return
    assert runner != IN_MEMORY, f"the driver's own publish was cut short: {done.brief()}"
    assert done.returncode == 130, done.brief()
    line = error_line(done)
    if published:  # the old dataset, untouched yet
        assert line == f"imgrec: error: interrupted; nothing was published ({out} still holds the dataset it held)"
        assert metadata_of(out)["run"]["run_id"] == old_run and len(check_complete(out)[1]) == 40
        return
    assert line.startswith(f"imgrec: error: interrupted while publishing: {out} holds no finished dataset"), line
    again = imgrec_here(capsys, data, out, *many_files, runner=runner)
    assert again.returncode == 0, again.brief()
    assert len(check_complete(out)[1]) == 40


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_after_the_summary_leaves_the_run_finished(tmp_path, signum):
    """Once the summary is out, the interpreter still takes a few tenths of a second to exit (Beam
    stops Prism for a whole second). A signal then used to kill it (exit 143) or print a
    traceback, and a scheduler retrying on that met "already holds a finished dataset"."""
    data, out, stdout_path = tmp_path / "data", tmp_path / "out", tmp_path / "stdout"
    make_tree(data, {"ant": 3, "bee": 3})
    with open(stdout_path, "wb") as stdout:
        process = subprocess.Popen(imgrec_argv(data, out), cwd=REPO, env=subprocess_env(), stdout=stdout,
                                   stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while process.poll() is None and f"output: {out}" not in stdout_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, "no summary"
        time.sleep(0.005)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0 and b"Traceback" not in stderr, stderr.decode(errors="replace")[-3000:]
    assert len(check_complete(out)[1]) == 6


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (Linux: /proc/PID/status SigCgt)."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(mask >> (signum - 1) & 1)


@pytest.mark.parametrize("command", [("pipeline.run",), ("pipeline.cli", "run")], ids=["python-m", "imgrec_run"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_beam_is_imported_exits_with_one_line(tmp_path, signum, command):
    """Ctrl-C in the first second, while Beam's modules load, used to print the traceback of
    whichever import it cut short. Python has no SIGTERM handler of its own, so the first one
    the driver installs is imgrec's, on the entry point's first lines, before importing Beam."""
    data, out = tmp_path / "data", tmp_path / "out"
    make_tree(data, {"ant": 2})
    module, *subcommand = command
    argv = module_argv(module, [*subcommand, *IN_MEMORY, f"--input={data}", f"--output={out}"])
    process = subprocess.Popen(argv, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not catches(process.pid, signal.SIGTERM):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.002)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr.decode(errors="replace")[-3000:]
    assert stderr.decode().splitlines() == ["imgrec: interrupted while starting; nothing was written"]
    assert not stdout and not out.exists()


# ------------------------------------------------------------------------------------------
# Output inside the input


@pytest.mark.slow
def test_an_output_inside_the_input_is_not_reingested(tmp_path, capsys):
    """`--output=IN/out` (as a schedule's IN/{timestamp}): imgrec's files there are never inputs,
    the user's are (one inside a class folder: tests/test_discover.py)."""
    data = tmp_path / "data"
    make_tree(data, {"cat": 4, "dog": 4})
    out = data / "out"
    first = imgrec_here(capsys, data, out, "--max_error_fraction=1")
    assert first.returncode == 0, first.brief()
    m1, records1, _ = check_complete(out)
    # verify draws PNGs into the output (the "class out"): imgrec's, never inputs
    assert verify_here(capsys, out, "--samples=2").returncode == 0
    second = imgrec_here(capsys, data, out, "--max_error_fraction=1", "--overwrite")
    assert second.returncode == 0, second.brief()
    m2, records2, _ = check_complete(out)
    assert m2["label_map"] == m1["label_map"] == {"cat": 0, "dog": 1}
    assert m2["inputs"]["total"] == m1["inputs"]["total"] == 8
    assert sorted(records2) == sorted(records1)
    # a file the user puts there is an input like any other: converted, never silently left out
    write_photo(out / "extra.jpg", seed=4242)
    third = imgrec_here(capsys, data, out, "--max_error_fraction=1", "--overwrite")
    assert third.returncode == 0, third.brief()
    m3, records3, _ = check_complete(out)
    assert m3["inputs"]["total"] == 9
    extra = [r for r in records3 if r[0].endswith("/extra.jpg")]
    assert [r[1] for r in extra] == ["out"]


def test_inputs_reached_through_the_output_are_converted(tmp_path, capsys):
    """A class folder that is a symlink to the output: its images are inputs, imgrec's files not."""
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    make_tree(data, {"dog": 2})
    for i in range(3):
        write_photo(elsewhere / f"cat_{i}.png", seed=500 + i)
    (data / "cat").symlink_to(elsewhere, target_is_directory=True)
    for attempt in range(2):  # the second run meets the first one's shards, index and metadata there
        run = imgrec_here(capsys, data, elsewhere, "--max_error_fraction=1", "--overwrite")
        assert run.returncode == 0, run.brief()
        metadata, records, rows = check_complete(elsewhere)
        assert metadata["label_map"] == {"cat": 0, "dog": 1}, attempt
        assert sorted(r[1] for r in records) == ["cat"] * 3 + ["dog"] * 2, attempt
        assert metadata["inputs"]["total"] == 5 + len(rows), attempt
