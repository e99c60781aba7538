"""imgrec on S3 and GCS, each a real server on loopback (moto, fake-gcs-server): whole runs from
the command line, byte for byte against the same run on the local disk, and the lock."""
from __future__ import annotations

import hashlib
import json
import pathlib
import socket
import threading
import time

import pytest

from tests.helpers import SAMPLE
from tests.stores import servers
from tests.stores.conftest import CONFIG
from tests.trust_helpers import (
    MULTI_PROCESSING,
    Watched,
    error_line,
    exited_pid,
    feature_key,
    finish_all,
    imgrec_argv,
    read_examples,
    run_imgrec,
    snapshot,
)

pytestmark = pytest.mark.stores
STAGING = ".imgrec-staging/"
LOCK = ".imgrec.lock"
# metadata.json sections that do not name the run, its time or its paths
SAME_METADATA = ("format_version", "splits", "features", "image", "compression", "label_map", "inputs",
                 "duplicates", "error_files", "pixel_fingerprint")


def published(store: servers.Store, prefix: str) -> dict[str, bytes]:
    return {name: data for name, data in store.objects(prefix).items() if not name.startswith((STAGING, LOCK))}


def assert_same_dataset(found: dict[str, bytes], reference: pathlib.Path) -> None:
    """The store's dataset is the local one: every file byte for byte (zero-byte shards and
    indexes included), metadata.json but for the run, its time and paths."""
    local = {name: data for name, data in snapshot(reference).items() if data != b"<dir>"}
    assert sorted(found) == sorted(local)
    assert any(not data for data in local.values()), "the reference should hold a zero-byte shard"
    for name in local:
        if name != "metadata.json":
            assert found[name] == local[name], name
    ours, theirs = json.loads(found["metadata.json"]), json.loads(local["metadata.json"])
    assert {k: ours[k] for k in SAME_METADATA} == {k: theirs[k] for k in SAME_METADATA}


def contents(folder: pathlib.Path) -> set[tuple[str, str]]:
    """(label, sha256 of the stored image) of every record: what does not depend on input paths."""
    metadata = json.loads((folder / "metadata.json").read_text())
    image, label = feature_key(metadata, "image"), feature_key(metadata, "label_text")
    return {(e.features.feature[label].bytes_list.value[0].decode(),
             hashlib.sha256(e.features.feature[image].bytes_list.value[0]).hexdigest())
            for examples in read_examples(folder, metadata).values() for e in examples}


def download(store: servers.Store, prefix: str, folder: pathlib.Path) -> pathlib.Path:
    for name, data in published(store, prefix).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


@pytest.mark.e2e
def test_a_dataset_written_to_a_store_is_the_local_one_byte_for_byte(store, local_reference):
    run = run_imgrec(SAMPLE, store.url("out"), *CONFIG, *store.flags, timeout=150)
    assert run.returncode == 0, run.brief()
    assert_same_dataset(published(store, "out"), local_reference)
    assert store.keys("out") == sorted(f"out/{name}" for name in published(store, "out")), "staging or lock left"


@pytest.mark.e2e
def test_images_read_from_a_store_by_beam_workers_and_converters(store, local_reference, tmp_path):
    """Input on the store, read by Beam's multi_processing workers; then an unchanged rerun and
    an incremental run (--reuse_from) on the store, by imgrec's converter processes."""
    store.upload_tree(SAMPLE, "in")
    run = run_imgrec(store.url("in"), store.url("out"), *CONFIG, *store.flags, runner=MULTI_PROCESSING, timeout=150)
    assert run.returncode == 0, run.brief()
    assert contents(download(store, "out", tmp_path / "out")) == contents(local_reference)
    again = run_imgrec(store.url("in"), store.url("out"), *CONFIG, "--skip_unchanged", *store.flags, timeout=150)
    assert again.returncode == 0 and again.stdout.startswith("unchanged"), again.brief()
    reused = run_imgrec(store.url("in"), store.url("dated-{date}"), *CONFIG, f"--reuse_from={store.url('out')}",
                        *store.flags, timeout=150)
    assert reused.returncode == 0, reused.brief()
    metadata = json.loads(store.get(f"dated-{time.strftime('%Y-%m-%d', time.gmtime())}/metadata.json"))
    assert metadata["reuse"] == {"from": store.url("out"), "reused": 36, "converted": 0}


@pytest.mark.e2e
def test_of_two_runs_at_once_one_publishes_and_the_other_exits_3(store, local_reference):
    runs = finish_all([Watched(imgrec_argv(SAMPLE, store.url("out"), *CONFIG, *store.flags)) for _ in range(2)],
                      timeout=150)
    assert sorted(r.returncode for r in runs) == [0, 3], "\n\n".join(r.brief() for r in runs)
    (loser,) = [r for r in runs if r.returncode == 3]
    assert LOCK in error_line(loser)
    assert_same_dataset(published(store, "out"), local_reference)


@pytest.mark.e2e
def test_a_driver_killed_while_publishing_leaves_a_dataset_the_rerun_completes(store, local_reference):
    """kill -9 as the publishing journal appears (the old dataset is being replaced): the rerun
    takes over the dead driver's lock at once (same host, its pid gone) and publishes the whole
    dataset, byte for byte."""
    killed = Watched(imgrec_argv(SAMPLE, store.url("out"), *CONFIG, *store.flags))
    journal = f"out/{STAGING}publishing.json"
    while journal not in store.keys("out") and killed.sample():
        time.sleep(0.02)
    assert killed.popen.poll() is None, "the run ended before publishing was seen"
    killed.kill()
    assert any(key.endswith(LOCK) for key in store.keys("out")), "the killed run's lock should be left"
    began = time.monotonic()
    rerun = run_imgrec(SAMPLE, store.url("out"), *CONFIG, *store.flags, timeout=150)
    assert rerun.returncode == 0, rerun.brief()
    assert time.monotonic() - began < 120
    assert_same_dataset(published(store, "out"), local_reference)


@pytest.mark.e2e
def test_objects_imgrec_did_not_write_stay_as_they_are(store):
    foreign = {"out/notes.txt": b"mine", "out/sub/keep.bin": b"", "out-other/data": b"beside"}
    for key, data in foreign.items():
        store.put(key, data)
    for _ in range(2):  # into a folder that is not a dataset, then replacing the dataset
        run = run_imgrec(SAMPLE, store.url("out"), *CONFIG, "--overwrite", *store.flags, timeout=150)
        assert run.returncode == 0, run.brief()
        for key, data in foreign.items():
            assert store.get(key) == data, key


@pytest.mark.e2e
def test_a_bucket_that_does_not_exist_is_one_line_and_exit_2(store):
    run = run_imgrec(SAMPLE, f"{store.scheme}://no-such-bucket-{store.bucket}/out", *CONFIG, *store.flags)
    assert run.returncode == 2, run.brief()
    assert "no such bucket" in error_line(run)


@pytest.mark.e2e
def test_an_endpoint_nobody_answers_at_is_one_line_and_exit_2(s3_endpoint):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        store_flags = ("--s3_endpoint_url=http://127.0.0.1:%d" % port, "--s3_access_key_id=a",
                       "--s3_secret_access_key=b", "--s3_region_name=us-east-1")
        run = run_imgrec("s3://bucket/in", "s3://bucket/out", *CONFIG, *store_flags)
    assert run.returncode == 2, run.brief()
    assert "--input=s3://bucket/in: cannot connect" in error_line(run)


# ------------------------------------------------------------------------------------------
# The lock, through pipeline/lock.py itself


@pytest.fixture
def store_output(store):
    """An output folder on the store, with this process's filesystem options set for it."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline import stores

    stores.use_filesystem_options(PipelineOptions(list(store.flags)))
    return store.url("locked")


def lock_text(host: str, pid: int, heartbeat_age: float) -> bytes:
    import datetime

    when = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=heartbeat_age))
    stamp = when.isoformat(timespec="seconds")
    return json.dumps({"run_id": "other", "host": host, "pid": pid, "started": stamp, "heartbeat": stamp,
                       "process": f"{pid}:1"}).encode()


def test_exactly_one_of_many_takes_a_free_lock(store, store_output):
    from pipeline.errors import OutputLocked
    from pipeline.lock import OutputLock

    won, barrier = [], threading.Barrier(4)

    def take(index: int) -> None:
        barrier.wait()
        try:
            won.append(OutputLock(store_output, f"run{index}")._lock_remote())  # pylint: disable=protected-access
        except OutputLocked:
            won.append(False)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(won) == [False, False, False, True]


def test_the_lock_of_a_dead_driver_on_this_host_is_taken_at_once(store, store_output):
    from pipeline.lock import OutputLock

    key = f"locked/{LOCK}"
    store.put(key, lock_text(socket.gethostname(), exited_pid(), heartbeat_age=0))
    began = time.monotonic()
    lock = OutputLock(store_output, "mine").acquire()
    try:
        assert json.loads(store.get(key))["run_id"] == "mine"
        assert time.monotonic() - began < 10
    finally:
        lock.release()
    assert key not in store.keys("locked")


@pytest.mark.parametrize("heartbeat_age, taken", [(0, False), (11 * 60, True)])
def test_a_lock_from_another_host_is_taken_only_once_its_heartbeat_is_stale(store, store_output, heartbeat_age, taken):
    from pipeline.errors import OutputLocked
    from pipeline.lock import OutputLock

    store.put(f"locked/{LOCK}", lock_text("another-host", 1, heartbeat_age))
    if taken:
        OutputLock(store_output, "mine").acquire().release()
    else:
        with pytest.raises(OutputLocked):
            OutputLock(store_output, "mine").acquire()
