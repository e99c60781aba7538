"""The output folder without a pipeline: driver-side checks (pipeline.prepare), the output lock
(pipeline.output.lock) and worker-side publishing (pipeline.output.publish) on real local folders."""
from __future__ import annotations

import fcntl
import json
import os
import pathlib
import resource
import socket
import threading
from typing import Optional

import pytest

from pipeline.errors import OutputLocked, RunFailed, UsageError
from pipeline.output import lock as lock_module
from pipeline.output.lock import LockOwner, OutputLock, check_publisher
from pipeline.output.publish import JOURNAL_FILE, interrupted_outcome, publish
from pipeline.prepare import (
    check_layout,
    check_output,
    clear_dead_runs,
    inspect_output,
    latest_sibling,
    output_folder,
    sibling_pattern,
    stopped_runs_beside,
)
from pipeline.reaper import driver_marker, process_start_time
from transforms.dataset_format import (
    FORMAT_VERSION,
    LOCK_FILE,
    DatasetMetadata,
    DuplicateSummary,
    InputAccounting,
    SplitInfo,
    parts_dir,
    run_dir,
    staging_dir,
)
from transforms.specs import InputSpec, OutputSpec

pytestmark = pytest.mark.unit


def dataset(run_id: str, num_shards: int) -> DatasetMetadata:
    files = tuple(f"train-{i:05d}-of-{num_shards:05d}.tfrecord" for i in range(num_shards))
    split = SplitInfo(num_shards, 10 * num_shards, files, (1,) * num_shards, {"cat": num_shards}, 0)
    return DatasetMetadata(
        splits={"train": split}, features={}, image={}, compression="none", label_map={"cat": 0},
        inputs=InputAccounting(num_shards, num_shards, 0, 0, {}, {}), duplicates=DuplicateSummary(),
        error_files=("errors-00000-of-00001.jsonl",), fingerprint=run_id, pixel_fingerprint="p", config={},
        run={"run_id": run_id}, versions={"imgrec": "test"})


def stage(output: pathlib.Path, metadata: DatasetMetadata) -> str:
    """Writes the files of `metadata` into its run's staging folder, each holding its own name + run."""
    folder = pathlib.Path(run_dir(str(output), metadata.run["run_id"]))
    for name in metadata.owned_files():
        if name != "metadata.json":
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(f"{metadata.run['run_id']}:{name}")
    return str(folder)


def write(folder: pathlib.Path, names, text: str = "foreign") -> None:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def publish_run(output: pathlib.Path, metadata: DatasetMetadata, previous_run_id=None, previous_files=()):
    staged = stage(output, metadata)
    with OutputLock(str(output), metadata.run["run_id"]):
        publish(str(output), staged, metadata, previous_run_id, previous_files)


def dead_pid() -> int:
    pid = int(pathlib.Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while pid > 1:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1
    raise AssertionError("no free pid")


def files_under(folder: pathlib.Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


# ----------------------------------------------------------------------------- inspect_output / check_output

def test_an_empty_or_missing_output_holds_nothing(tmp_path):
    for folder in (tmp_path / "missing", tmp_path):
        state = inspect_output(str(folder))
        assert (state.previous, state.owned, state.foreign, state.previous_run_id) == (None, (), (), None)
        check_output(str(folder), OutputSpec(str(folder)), state)


def test_a_finished_dataset_is_owned_and_needs_overwrite(tmp_path):
    first = dataset("r1", 2)
    publish_run(tmp_path, first)
    write(tmp_path, ["notes.txt"])
    state = inspect_output(str(tmp_path))
    assert state.previous_run_id == "r1" and state.previous == first.to_json()
    assert set(state.owned) == set(first.owned_files()) - {"metadata.json"}
    assert state.foreign == ("notes.txt",)
    with pytest.raises(UsageError, match="already holds a finished dataset .*--overwrite.*--skip_unchanged"):
        check_output(str(tmp_path), OutputSpec(str(tmp_path)), state)
    check_output(str(tmp_path), OutputSpec(str(tmp_path), overwrite=True), state)
    check_output(str(tmp_path), OutputSpec(str(tmp_path), skip_unchanged=True), state)


def test_verify_pictures_are_imgrecs_only_beside_a_dataset(tmp_path):
    """A contact_sheet.png in a folder that holds no dataset is the user's (an input, if listed)."""
    plain, finished = tmp_path / "plain", tmp_path / "finished"
    write(plain, ["contact_sheet.png", "class_counts.png"])
    publish_run(finished, dataset("r1", 2))
    write(finished, ["contact_sheet.png", "class_counts.png"])
    pictures = {"contact_sheet.png", "class_counts.png"}
    assert not pictures & output_folder(str(plain), inspect_output(str(plain))).own
    assert pictures <= output_folder(str(finished), inspect_output(str(finished))).own


def test_a_folder_that_is_not_a_dataset_needs_overwrite(tmp_path):
    names = ["train-00000-of-00010.tfrecord", "dataset_info.json", "a", "b", "c", "d"]
    write(tmp_path, names)
    state = inspect_output(str(tmp_path))
    assert state.previous is None and state.owned == () and set(state.foreign) == set(names)
    with pytest.raises(UsageError, match=r"is not empty and not an imgrec dataset \(it holds .*, \.\.\.\)"):
        check_output(str(tmp_path), OutputSpec(str(tmp_path)), state)
    check_output(str(tmp_path), OutputSpec(str(tmp_path), overwrite=True), state)


def test_a_folder_in_place_of_a_file_of_the_dataset_is_refused_before_any_work(tmp_path):
    """Publishing renames over the dataset's files: a folder there would stop it half-way."""
    metadata = dataset("r1", 2)
    publish_run(tmp_path, metadata)
    shard = tmp_path / metadata.splits["train"].files[1]
    shard.unlink()
    write(shard, ["notes.txt"])
    state = inspect_output(str(tmp_path))
    assert state.folders == (shard.name,)
    with pytest.raises(UsageError, match=f"holds folders where its dataset's files go \\({shard.name}\\)"):
        check_output(str(tmp_path), OutputSpec(str(tmp_path), overwrite=True), state)


def test_a_foreign_file_with_a_name_every_run_writes_is_refused_even_with_overwrite(tmp_path):
    (tmp_path / "metadata.json").write_text('{"name": "my project"}')  # valid JSON, not imgrec's
    write(tmp_path, ["index/notes.txt", "photo.jpg"])
    state = inspect_output(str(tmp_path))
    assert state.previous is None and set(state.foreign) == {"metadata.json", "index", "photo.jpg"}
    assert set(state.in_the_way) == {"metadata.json", "index"}
    with pytest.raises(UsageError, match="holds index, metadata.json, which imgrec did not write"):
        check_output(str(tmp_path), OutputSpec(str(tmp_path), overwrite=True), state)


def test_publishing_never_replaces_a_file_imgrec_did_not_write(tmp_path):
    metadata = dataset("r1", 2)
    write(tmp_path, [metadata.splits["train"].files[1]], "my own shard")  # appeared during the run
    with pytest.raises(RunFailed, match="which imgrec did not write"):
        publish_run(tmp_path, metadata)
    assert (tmp_path / metadata.splits["train"].files[1]).read_text() == "my own shard"
    assert not (tmp_path / "metadata.json").exists()


@pytest.mark.parametrize("kind, output, holds, refused", [
    ("folders", "data", (), "is the input folder"),
    ("folders", "data/cat", ("1.jpg",), "holds files imgrec did not write"),
    ("folders", "data/cat/out", (), None),  # a new folder inside the input: left out of discovery
    ("folders", "elsewhere", ("1.jpg",), None),
    ("glob", "data/cat", ("1.jpg",), "holds files imgrec did not write"),
    ("csv", "data", ("1.jpg",), None),  # a manifest lists its files: nothing is discovered
])
def test_an_output_must_not_hide_inputs(tmp_path, kind, output, holds, refused):
    pattern = {"folders": "data", "glob": "data/*/*.jpg", "csv": "data/list.csv"}[kind]
    out = tmp_path / output
    write(out, holds)
    out.mkdir(parents=True, exist_ok=True)
    spec = InputSpec(str(tmp_path / pattern), kind=kind)
    if refused:
        with pytest.raises(UsageError, match=refused):
            check_layout(spec, str(out), inspect_output(str(out)))
    else:
        check_layout(spec, str(out), inspect_output(str(out)))


def test_imgrecs_own_hidden_entries_are_not_foreign(tmp_path):
    write(tmp_path, [LOCK_FILE, ".imgrec-staging/parts/x.records", "metadata.json.tmp-123"])
    assert inspect_output(str(tmp_path)).foreign == ()


def test_an_interrupted_publish_makes_its_journal_files_imgrecs(tmp_path):
    write(tmp_path, ["train-00000-of-00001.tfrecord", "old-00000-of-00001.tfrecord", "notes.txt"])
    write(tmp_path, [f".imgrec-staging/{JOURNAL_FILE}"], json.dumps(
        {"old": ["old-00000-of-00001.tfrecord"], "new": ["train-00000-of-00001.tfrecord"]}))
    state = inspect_output(str(tmp_path))
    assert state.owned == ("old-00000-of-00001.tfrecord", "train-00000-of-00001.tfrecord")
    assert state.foreign == ("notes.txt",)


def test_an_unreadable_metadata_json_is_a_usage_error(tmp_path):
    (tmp_path / "metadata.json").write_text("{broken")
    with pytest.raises(UsageError, match="is not a readable JSON file .*fix or remove it"):
        inspect_output(str(tmp_path))


def test_a_folder_named_metadata_json_is_a_usage_error(tmp_path):
    write(tmp_path, ["metadata.json/x"])
    with pytest.raises(UsageError, match="is not a readable JSON file"):
        inspect_output(str(tmp_path))


def test_clear_dead_runs_keeps_finished_parts(tmp_path):
    write(tmp_path, [".imgrec-staging/run-dead/train-00000-of-00001.tfrecord", ".imgrec-staging/run-dead2/x",
                     ".imgrec-staging/parts/abc.records", ".imgrec-staging/parts/abc.json",
                     f".imgrec-staging/{JOURNAL_FILE}"])
    clear_dead_runs(str(tmp_path))
    assert files_under(tmp_path) == {".imgrec-staging/parts/abc.records", ".imgrec-staging/parts/abc.json",
                                     f".imgrec-staging/{JOURNAL_FILE}"}
    clear_dead_runs(str(tmp_path / "never-written"))  # nothing to clear


def test_latest_sibling_of_a_dated_output(tmp_path):
    template = str(tmp_path / "{date}")
    assert sibling_pattern(str(tmp_path / "fixed")) is None
    dataset = {"format_version": FORMAT_VERSION, "splits": {}, "versions": {"imgrec": "1"}}
    for name, metadata in (("2026-12-01", dataset), ("2026-12-03", None), ("2026-11-30", dataset), ("notes", dataset),
                           ("2026-12-04", {"hello": 1})):  # somebody else's metadata.json: not a dataset
        (tmp_path / name).mkdir()
        (tmp_path / name / ("metadata.json" if metadata else "x")).write_text(json.dumps(metadata))
    assert latest_sibling(template) == str(tmp_path / "2026-12-01")
    (tmp_path / "2026-12-03" / "metadata.json").write_text(json.dumps(dataset))  # this run's output, say
    assert latest_sibling(template) == str(tmp_path / "2026-12-03")
    with pytest.raises(UsageError, match=r"'latest' needs an output template with \{date\}"):
        latest_sibling(str(tmp_path / "fixed"))
    parent, pattern = sibling_pattern(str(tmp_path / "{{v1}}-{date}"))
    assert parent == str(tmp_path) and pattern.fullmatch("{v1}-2026-12-01") and not pattern.fullmatch("{{v1}}-x")


# ----------------------------------------------------------------------------- publish

def test_publish_into_a_new_output(tmp_path):
    metadata = dataset("r1", 2)
    publish_run(tmp_path, metadata)
    assert files_under(tmp_path) == set(metadata.owned_files())
    for name in metadata.owned_files():
        if name != "metadata.json":
            assert (tmp_path / name).read_text() == f"r1:{name}"
    assert DatasetMetadata.loads((tmp_path / "metadata.json").read_text()) == metadata
    assert not pathlib.Path(staging_dir(str(tmp_path))).exists()


def test_republishing_replaces_only_imgrecs_own_files(tmp_path):
    first = dataset("r1", 3)
    publish_run(tmp_path, first)
    foreign = ["notes.txt", "train-00000-of-00010.tfrecord", "dataset_info.json", "features.json",
               "index/mine.idx", "train-1-of-2.tfrecord"]
    write(tmp_path, foreign)
    write(tmp_path, [".imgrec-staging/parts/kept.records"])  # a finished part from a dead run
    state = inspect_output(str(tmp_path))
    second = dataset("r2", 1)
    publish_run(tmp_path, second, state.previous_run_id, state.owned)
    assert files_under(tmp_path) == set(second.owned_files()) | set(foreign)
    assert all((tmp_path / name).read_text() == "foreign" for name in foreign)
    assert (tmp_path / "train-00000-of-00001.tfrecord").read_text() == "r2:train-00000-of-00001.tfrecord"
    assert DatasetMetadata.loads((tmp_path / "metadata.json").read_text()).run["run_id"] == "r2"


def test_publish_refuses_when_the_dataset_changed_meanwhile(tmp_path):
    publish_run(tmp_path, dataset("r1", 1))
    before = {name: (tmp_path / name).read_bytes() for name in files_under(tmp_path)}
    late = dataset("r3", 2)
    with pytest.raises(RunFailed, match="changed while this run converted .*run r1.*nothing was published"):
        publish_run(tmp_path, late, previous_run_id=None)  # it saw an empty output
    assert {name: (tmp_path / name).read_bytes() for name in files_under(tmp_path)
            if not name.startswith(".imgrec-staging")} == before


def test_publish_needs_the_lock(tmp_path):
    metadata = dataset("r1", 1)
    staged = stage(tmp_path, metadata)
    with pytest.raises(RunFailed, match=r"no longer belongs to this run \(now: nobody\)"):
        publish(str(tmp_path), staged, metadata, None, ())
    with OutputLock(str(tmp_path), "someone-else"):
        with pytest.raises(RunFailed, match="no longer belongs to this run .*run someone-else"):
            publish(str(tmp_path), staged, metadata, None, ())
    assert not (tmp_path / "metadata.json").exists()


def test_nothing_is_published_once_the_driver_is_gone(tmp_path):
    owner = LockOwner("r1", socket.gethostname(), dead_pid(), "2026-12-02T00:00:00+00:00",
                      "2026-12-02T00:00:00+00:00")
    (tmp_path / LOCK_FILE).write_text(owner.to_json())
    with pytest.raises(RunFailed, match=f"the driver of run r1 \\(pid {owner.pid}\\) is gone"):
        check_publisher(str(tmp_path), "r1")
    # The driver's pid taken by a later process (another start time) is not the driver.
    started = process_start_time(os.getpid())
    reused = LockOwner("r1", socket.gethostname(), os.getpid(), owner.started, owner.heartbeat,
                       process=f"{os.getpid()}:{int(started) - 1}")
    (tmp_path / LOCK_FILE).write_text(reused.to_json())
    with pytest.raises(RunFailed, match="is gone"):
        check_publisher(str(tmp_path), "r1")
    # A driver on another host (Dataflow's launcher) cannot be seen: the lock alone decides.
    elsewhere = LockOwner("r1", "another-host", owner.pid, owner.started, owner.heartbeat)
    (tmp_path / LOCK_FILE).write_text(elsewhere.to_json())
    check_publisher(str(tmp_path), "r1")


# ----------------------------------------------------------------------------- the lock

def test_the_lock_records_its_owner_and_is_removed_on_release(tmp_path):
    lock = OutputLock(str(tmp_path), "r1").acquire()
    owner = LockOwner.from_json((tmp_path / LOCK_FILE).read_text())
    assert (owner.run_id, owner.host, owner.pid) == ("r1", socket.gethostname(), os.getpid())
    assert lock.holds()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists() and not lock.holds()


def test_a_second_run_is_refused_while_the_first_holds_the_lock(tmp_path):
    with OutputLock(str(tmp_path), "first"):
        second = OutputLock(str(tmp_path), "second")
        with pytest.raises(OutputLocked) as info:
            second.acquire()
        message = str(info.value)
        assert info.value.exit_code == 3
        assert "held by run first" in message and f"pid {os.getpid()}" in message
        assert f"delete {tmp_path / LOCK_FILE}" in message
        assert LockOwner.from_json((tmp_path / LOCK_FILE).read_text()).run_id == "first"  # untouched
    with OutputLock(str(tmp_path), "second"):
        assert LockOwner.from_json((tmp_path / LOCK_FILE).read_text()).run_id == "second"


def test_a_lock_file_left_by_a_killed_run_does_not_block(tmp_path):
    """On local folders the kernel drops a dead process's flock; the file alone blocks nothing."""
    owner = LockOwner("killed", socket.gethostname(), dead_pid(), "2026-12-02T00:00:00+00:00",
                      "2026-12-02T00:00:00+00:00")
    (tmp_path / LOCK_FILE).write_text(owner.to_json())
    with OutputLock(str(tmp_path), "next"):
        assert LockOwner.from_json((tmp_path / LOCK_FILE).read_text()).run_id == "next"


def test_a_lock_whose_owner_cannot_be_written_is_not_kept(tmp_path):
    """A full disk (the file-size limit here: EFBIG, as ENOSPC) failed the lock's first write: the
    flock stayed held by this process, so a notebook's next run (or any other process's) was refused
    with exit 3 until it exited, and an empty lock file stayed."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (10, limit[1]))  # Python ignores SIGXFSZ: the write fails
    try:
        with pytest.raises(OSError):
            OutputLock(str(tmp_path), "on-a-full-disk").acquire()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    assert not (tmp_path / LOCK_FILE).exists()
    with OutputLock(str(tmp_path), "next"):
        pass


def test_lock_owner_staleness():
    import datetime

    owner = LockOwner("r", "h", 1, "2026-12-02T10:00:00+00:00", "2026-12-02T10:00:00+00:00")
    at = datetime.datetime.fromisoformat("2026-12-02T10:09:59+00:00")
    assert not owner.is_stale(at)
    assert owner.is_stale(at + datetime.timedelta(seconds=2))
    assert LockOwner.from_json(owner.to_json()) == owner
    assert "run r (host h, pid 1" in owner.describe()


def test_parts_and_runs_are_staged_inside_the_output(tmp_path):
    assert parts_dir(str(tmp_path)).startswith(staging_dir(str(tmp_path)) + "/")
    assert run_dir(str(tmp_path), "x").startswith(staging_dir(str(tmp_path)) + "/")
    assert os.path.dirname(staging_dir(str(tmp_path))) == str(tmp_path)


def test_an_interrupted_run_is_told_what_the_output_holds(tmp_path):
    out = str(tmp_path)
    assert interrupted_outcome(out, "r1") == "interrupted; nothing was published"
    publish_run(tmp_path, dataset("r1", 1))
    write(tmp_path, [f".imgrec-staging/{JOURNAL_FILE}", ".imgrec-staging/parts/a.records"])  # cut short
    assert interrupted_outcome(out, "r1") is None  # its dataset is complete
    assert not (tmp_path / ".imgrec-staging").exists()  # what that publish had left to do
    kept = f"interrupted; nothing was published ({out} still holds the dataset it held)"
    assert interrupted_outcome(out, "r2") == kept
    write(tmp_path, [f".imgrec-staging/{JOURNAL_FILE}"], json.dumps({"old": [], "new": []}))
    assert interrupted_outcome(out, "r2").startswith("interrupted; nothing was published")  # the renames had not begun
    (tmp_path / "metadata.json").unlink()
    assert interrupted_outcome(out, "r2").startswith(f"interrupted while publishing: {out} holds no finished dataset")


def test_a_heartbeat_never_leaves_the_lock_file_without_its_owner(tmp_path, monkeypatch):
    """check_publisher reads the lock as the heartbeat rewrites it: an owner missing for a moment
    would refuse to publish a finished run."""
    monkeypatch.setattr(lock_module, "HEARTBEAT_SECONDS", 0)  # rewritten continuously
    with OutputLock(str(tmp_path), "r1"):
        for _ in range(3000):
            check_publisher(str(tmp_path), "r1")


def test_a_run_refused_the_lock_names_the_owner_that_has_just_taken_it(tmp_path):
    """The owner creates and flocks the file, then writes itself into it: a run refused in
    between waits a moment for the name instead of saying 'another run'."""
    descriptor = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    owner = LockOwner("first-run", socket.gethostname(), os.getpid(), "2026-12-02T00:00:00+00:00",
                      "2026-12-02T00:00:00+00:00")
    writer = threading.Timer(0.2, os.pwrite, (descriptor, owner.to_json().encode(), 0))
    writer.start()
    try:
        with pytest.raises(OutputLocked, match="first-run"):
            OutputLock(str(tmp_path), "second-run").acquire()
    finally:
        writer.join()
        os.close(descriptor)


def test_a_template_run_names_the_sibling_folders_where_stopped_runs_left_their_staging(tmp_path):
    """`ROOT/{timestamp}`: a killed run's staging (its lock file left, naming a dead driver) and
    an interrupted one's (only parts left) stay where no later run expands to; they are reported.
    A failed run's (its message named its dead letters there) and a live run's are not."""
    def staged(name: str, *entries: str, lock_of: Optional[str] = None) -> pathlib.Path:
        folder = tmp_path / name
        for entry in entries:
            (folder / entry).parent.mkdir(parents=True, exist_ok=True)
            (folder / entry).write_text(entry)
        if lock_of is not None:
            (folder / LOCK_FILE).write_text(LockOwner("r", socket.gethostname(), 1, "2026-12-01T00:00:00+00:00",
                                                      "2026-12-01T00:00:00+00:00", lock_of).to_json())
        return folder

    parts = ".imgrec-staging/parts"
    dead = "1:never"  # pid 1, with a start time no process has: not alive
    killed = staged("20261201T000000", f"{parts}/a.json", ".imgrec-staging/run-1/x.tfrecord", lock_of=dead)
    interrupted = staged("20261202T000000", f"{parts}/c.json")
    staged("20261203T000000", f"{parts}/d.json", ".imgrec-staging/run-3/errors.jsonl")  # failed
    cut = staged("20261204T000000", f"{parts}/e.json", f".imgrec-staging/{JOURNAL_FILE}", lock_of=dead)
    staged("20261205T000000", f"{parts}/f.json", lock_of=driver_marker())  # alive: this process
    staged("pets", f"{parts}/h.json", lock_of=dead)  # not the template's
    staged("2026120٦T000000", f"{parts}/h.json", lock_of=dead)  # an Arabic-Indic digit: not the template's
    (tmp_path / "20261206T000000").write_text("a file")
    output = tmp_path / "20261207T000000"
    output.mkdir()
    assert stopped_runs_beside(f"{tmp_path}/{{timestamp}}", str(output)) == [str(killed), str(interrupted), str(cut)]
    assert stopped_runs_beside(f"{tmp_path}/{{timestamp}}", str(killed)) == [str(interrupted), str(cut)]


def test_the_siblings_of_a_template_with_escaped_braces_are_in_the_folder_it_names(tmp_path):
    """`ROOT/a{{b}}/{date}` writes into `ROOT/a{b}/DATE`; its siblings were looked for in `a{{b}}`."""
    assert sibling_pattern(f"{tmp_path}/a{{{{b}}}}/{{date}}")[0] == f"{tmp_path}/a{{b}}"
    assert sibling_pattern(f"{tmp_path}/{{date}}/x") is None
    assert sibling_pattern(f"{tmp_path}/{{date}}/{{date}}") is None
    assert sibling_pattern(f"{tmp_path}/{{{{date}}}}") is None  # names the folder `{date}`: no siblings

