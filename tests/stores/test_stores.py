"""imgrec on S3 and GCS, each a real server on loopback (moto, fake-gcs-server), against the same
run on the local disk. Each conversion several tests read is made once per store (module-scoped
fixtures) and in this process (`pipeline.run.convert`); the runs that must be processes of their
own (two at once, kill -9, a setup fault's exit code and line) are started as `python -m pipeline.run`."""
from __future__ import annotations

import hashlib
import itertools
import json
import pathlib
import socket
import threading
import time

import pytest

from tests.helpers import (
    MULTI_PROCESSING,
    REPO,
    SAMPLE,
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
from tests.stores import servers
from tests.stores.conftest import CONFIG
from transforms.dataset_format import listed_files

pytestmark = pytest.mark.stores
STAGING = ".imgrec-staging/"
LOCK = ".imgrec.lock"
# metadata.json sections that do not name the run, its time or its paths
SAME_METADATA = ("format_version", "splits", "features", "image", "compression", "label_map", "inputs",
                 "duplicates", "error_files", "pixel_fingerprint")
# Objects imgrec did not write: in the output folder, in a subfolder of it, and beside it.
FOREIGN = {"out/notes.txt": b"mine", "out/sub/keep.bin": b"", "out-other/data": b"beside"}


def convert(*argv: str):
    """A whole run in this process, as `python -m pipeline.run` makes it."""
    from pipeline.run import convert as run_conversion

    return run_conversion(list(argv))


def imgrecs(store: servers.Store, prefix: str) -> dict[str, bytes]:
    """The objects under `prefix/` but for FOREIGN's, by their names below it."""
    return {name: data for name, data in store.objects(prefix).items() if f"{prefix}/{name}" not in FOREIGN}


def assert_same_dataset(found: dict[str, bytes], reference: pathlib.Path) -> None:
    """`found` is the local dataset and nothing more (no staging, no lock): every file byte for
    byte (zero-byte shards and indexes included), metadata.json but for the run, its time and paths."""
    local = {name: data for name, data in snapshot(reference).items() if data != b"<dir>"}
    assert sorted(found) == sorted(local)
    assert any(not data for data in local.values()), "the reference should hold a zero-byte shard"
    for name in local:
        if name != "metadata.json":
            assert found[name] == local[name], name
    ours, theirs = json.loads(found["metadata.json"]), json.loads(local["metadata.json"])
    assert {k: ours[k] for k in SAME_METADATA} == {k: theirs[k] for k in SAME_METADATA}


def contents(folder: pathlib.Path) -> tuple[set[tuple[str, str]], list[str]]:
    """(label, sha256 of the stored image) of every record and the dead letters' errors: what
    does not depend on the input's paths."""
    metadata = json.loads((folder / "metadata.json").read_text())
    image, label = feature_key(metadata, "image"), feature_key(metadata, "label_text")
    records = {(e.features.feature[label].bytes_list.value[0].decode(),
                hashlib.sha256(e.features.feature[image].bytes_list.value[0]).hexdigest())
               for examples in read_examples(folder, metadata).values() for e in examples}
    errors = sorted(json.loads(line)["error"] for path in folder.glob("errors-*.jsonl")
                    for line in path.read_text().splitlines())
    return records, errors


def download(store: servers.Store, prefix: str, folder: pathlib.Path) -> pathlib.Path:
    for name, data in imgrecs(store, prefix).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


# ------------------------------------------------------------------------------------------
# Output on the store


@pytest.fixture(scope="module")
def first_run(store, small_input) -> dict[str, bytes]:
    """The small input converted into `out`, which holds objects imgrec did not write (and so
    is not a dataset yet): every object under `out/` afterwards."""
    for key, data in FOREIGN.items():
        store.put(key, data)
    convert(f"--input={small_input}", f"--output={store.url('out')}", "--overwrite", *CONFIG, *store.flags)
    return store.objects("out")


@pytest.mark.e2e
def test_a_dataset_written_to_a_store_is_the_local_one_byte_for_byte(first_run, local_reference):
    assert_same_dataset({name: data for name, data in first_run.items() if f"out/{name}" not in FOREIGN},
                        local_reference)


@pytest.mark.e2e
def test_objects_imgrec_did_not_write_stay_as_they_are(store, first_run):
    assert {key: first_run[key[len("out/"):]] for key in FOREIGN if key.startswith("out/")} == \
        {key: data for key, data in FOREIGN.items() if key.startswith("out/")}
    assert store.get("out-other/data") == FOREIGN["out-other/data"]


@pytest.mark.e2e
def test_of_two_runs_at_once_one_replaces_the_dataset_and_the_other_exits_3(store, first_run, small_input,
                                                                            local_reference):
    """Both with --overwrite into `out`: the winner replaces the dataset there and leaves the
    objects imgrec did not write as they are."""
    runs = finish_all([Watched(imgrec_argv(small_input, store.url("out"), *CONFIG, "--overwrite", *store.flags))
                       for _ in range(2)], timeout=150)
    assert sorted(r.returncode for r in runs) == [0, 3], "\n\n".join(r.brief() for r in runs)
    (loser,) = [r for r in runs if r.returncode == 3]
    assert LOCK in error_line(loser)
    assert json.loads(store.get("out/metadata.json"))["run"]["run_id"] != json.loads(first_run["metadata.json"])[
        "run"]["run_id"], "the dataset was not replaced"
    assert_same_dataset(imgrecs(store, "out"), local_reference)
    assert {key: store.get(key) for key in FOREIGN} == FOREIGN


@pytest.mark.e2e
def test_a_driver_killed_while_publishing_leaves_a_dataset_the_rerun_completes(store, small_input, local_reference):
    """kill -9 as the publishing journal appears: the rerun takes over the dead driver's lock at
    once (same host, its pid gone; else its heartbeat would hold it for 10 minutes) and
    publishes the whole dataset, byte for byte."""
    killed = Watched(imgrec_argv(small_input, store.url("killed"), *CONFIG, *store.flags))
    journal = f"killed/{STAGING}publishing.json"
    while journal not in store.keys("killed") and killed.sample():
        time.sleep(0.02)
    assert killed.popen.poll() is None, "the run ended before publishing was seen"
    killed.kill()
    assert f"killed/{LOCK}" in store.keys("killed"), "the killed run's lock should be left"
    left = store.objects("killed")
    if "metadata.json" in left:  # killed after metadata.json, the last file, moved in: the dataset is whole
        missing = [name for name in listed_files(json.loads(left["metadata.json"])) if name not in left]
        assert not missing, f"a dataset half published shows: {missing} missing"
    began = time.monotonic()
    convert(f"--input={small_input}", f"--output={store.url('killed')}", *CONFIG, *store.flags)
    assert time.monotonic() - began < 120
    assert_same_dataset(store.objects("killed"), local_reference)


# ------------------------------------------------------------------------------------------
# Input on the store


# A prefix Beam reads as a pattern unless escaped; named a folder, as auto would take it for a glob.
INPUT, AS_FOLDERS = "in[1]", "--input_kind=folders"


@pytest.fixture(scope="module")
def from_store(store, small_input):
    """The small input uploaded to INPUT and converted three times, each run's outcome
    returned: by Beam's multi_processing workers into `from-store`; again with --skip_unchanged;
    then, with one image more, into `dated-{date}` with --reuse_from=from-store, by imgrec's
    converter processes."""
    store.upload_tree(small_input, INPUT)
    source = (f"--input={store.url(INPUT)}", AS_FOLDERS)
    first = convert(*source, f"--output={store.url('from-store')}", *CONFIG, *store.flags, *MULTI_PROCESSING)
    unchanged = convert(*source, f"--output={store.url('from-store')}", "--skip_unchanged", *CONFIG, *store.flags)
    store.put(f"{INPUT}/cat/cat_02.jpg", (SAMPLE / "cat" / "cat_02.jpg").read_bytes())
    reused = convert(*source, f"--output={store.url('dated-{date}')}", f"--reuse_from={store.url('from-store')}",
                     *CONFIG, *store.flags)
    return first, unchanged, reused


@pytest.mark.e2e
def test_images_read_from_a_store_make_the_local_dataset(store, from_store, local_reference, tmp_path):
    first, _, _ = from_store
    assert first.spec.output.path == store.url("from-store")
    assert contents(download(store, "from-store", tmp_path)) == contents(local_reference)


@pytest.mark.e2e
def test_an_unchanged_input_on_a_store_is_not_converted_again(store, from_store):
    _, unchanged, _ = from_store
    assert unchanged.unchanged_from == store.url("from-store")


@pytest.mark.e2e
def test_a_dated_output_reuses_the_records_of_a_dataset_on_a_store(store, from_store):
    _, _, reused = from_store
    dated = reused.spec.output.path
    assert dated == store.url(f"dated-{time.strftime('%Y-%m-%d', time.gmtime())}")
    metadata = json.loads(store.get(f"{dated.split('/', 3)[3]}/metadata.json"))
    assert metadata["reuse"] == {"from": store.url("from-store"), "reused": 6, "converted": 1}


# ------------------------------------------------------------------------------------------
# A store that cannot be used


@pytest.mark.e2e
def test_a_bucket_that_does_not_exist_is_one_line_and_exit_2(store, small_input):
    run = run_imgrec(small_input, f"{store.scheme}://no-such-bucket-{store.bucket}/out", *CONFIG, *store.flags)
    assert run.returncode == 2, run.brief()
    assert "no such bucket" in error_line(run)


@pytest.mark.e2e
def test_an_endpoint_nobody_answers_at_is_one_line_and_exit_2(store, monkeypatch):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        flags = store.unreachable(f"http://127.0.0.1:{closed.getsockname()[1]}", monkeypatch)
        run = run_imgrec(store.url("in"), store.url("out"), *CONFIG, *flags)
    assert run.returncode == 2, run.brief()
    assert f"--input={store.url('in')}: cannot connect" in error_line(run)


@pytest.mark.e2e
def test_credentials_that_may_read_but_not_write_the_output_are_one_line_and_exit_2(small_input, tmp_path,
                                                                                    monkeypatch):
    """Credentials refused the output's writes (its bucket readable): the lock's write is refused
    before any work, a usage error naming the output as for a missing bucket, not "the run
    failed: the object store cannot be used" and exit 1."""
    import boto3

    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "5")  # moto checks IAM once the 5 requests below are made
    with servers.moto_server(tmp_path / "moto.log") as endpoint:
        admin = {"endpoint_url": endpoint, **servers.S3_KEYS}
        boto3.client("s3", **admin).create_bucket(Bucket="read-only")
        iam = boto3.client("iam", **admin)
        iam.create_user(UserName="reader")
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
                                                         {"Effect": "Deny", "Action": "s3:PutObject", "Resource": "*"}]}
        arn = iam.create_policy(PolicyName="read-only", PolicyDocument=json.dumps(policy))["Policy"]["Arn"]
        iam.attach_user_policy(UserName="reader", PolicyArn=arn)
        run = run_imgrec(small_input, "s3://read-only/out", *CONFIG, f"--s3_endpoint_url={endpoint}",
                         f"--s3_access_key_id={key['AccessKeyId']}", f"--s3_secret_access_key={key['SecretAccessKey']}",
                         f"--s3_region_name={servers.S3_KEYS['region_name']}")
    assert run.returncode == 2, run.brief()
    assert error_line(run).startswith("imgrec: error: cannot write into the output folder s3://read-only/out: "
                                      "AccessDenied"), run.brief()


# ------------------------------------------------------------------------------------------
# The lock, through pipeline/output/lock.py itself

_folders = itertools.count()


@pytest.fixture
def store_output(store):
    """A new output folder on the store, with this process's filesystem options set for it."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline import stores

    stores.use_filesystem_options(PipelineOptions(list(store.flags)))
    return f"locked-{next(_folders)}"


def lock_text(host: str, pid: int, heartbeat_age: float) -> bytes:
    import datetime

    when = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=heartbeat_age))
    stamp = when.isoformat(timespec="seconds")
    return json.dumps({"run_id": "other", "host": host, "pid": pid, "started": stamp, "heartbeat": stamp,
                       "process": f"{pid}:1"}).encode()


def test_exactly_one_of_many_takes_a_free_lock(store, store_output):
    from pipeline.errors import OutputLocked
    from pipeline.output.lock import OutputLock

    won, barrier = [], threading.Barrier(4)

    def take(index: int) -> None:
        barrier.wait()
        try:
            won.append(OutputLock(store.url(store_output), f"run{index}")._lock_remote())  # pylint: disable=protected-access
        except OutputLocked:
            won.append(False)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(won) == [False, False, False, True]


def test_the_lock_of_a_dead_driver_on_this_host_is_taken_at_once(store, store_output):
    from pipeline.output.lock import OutputLock

    key = f"{store_output}/{LOCK}"
    store.put(key, lock_text(socket.gethostname(), exited_pid(), heartbeat_age=0))
    began = time.monotonic()
    lock = OutputLock(store.url(store_output), "mine").acquire()
    try:
        assert json.loads(store.get(key))["run_id"] == "mine"
        assert time.monotonic() - began < 10
    finally:
        lock.release()
    assert key not in store.keys(store_output)


@pytest.mark.parametrize("heartbeat_age, taken", [(0, False), (11 * 60, True)])
def test_a_lock_from_another_host_is_taken_only_once_its_heartbeat_is_stale(store, store_output, heartbeat_age, taken):
    from pipeline.errors import OutputLocked
    from pipeline.output.lock import OutputLock

    store.put(f"{store_output}/{LOCK}", lock_text("another-host", 1, heartbeat_age))
    if taken:
        OutputLock(store.url(store_output), "mine").acquire().release()
    else:
        with pytest.raises(OutputLocked):
            OutputLock(store.url(store_output), "mine").acquire()


# ------------------------------------------------------------------------------------------
# Dead letters, through pipeline/output/dead_letters.py itself


def test_the_merged_dead_letter_runs_are_removed_from_a_store(store, store_output):
    """A store has no folder to find: the runs are removed by their prefix (before, they stayed
    beside the dead letters of a refused run, whose staging is kept for the user)."""
    from pipeline.output.dead_letters import write_dead_letters, write_run

    run_dir = store.url(store_output)
    runs = [write_run(['{"path": "b"}', '{"path": "a"}'], run_dir), write_run(['{"path": "c"}'], run_dir)]
    name = write_dead_letters(runs, run_dir)
    assert store.keys(store_output) == [f"{store_output}/{name}"]
    assert store.get(f"{store_output}/{name}") == b'{"path": "a"}\n{"path": "b"}\n{"path": "c"}\n'


# ------------------------------------------------------------------------------------------
# An S3 endpoint that goes away during a run (Beam retries each S3 request for ~10 minutes)


def fails_with_store_fault_within(seconds: float, call, what: str) -> None:
    """`call` raises the store's fault ('cannot connect') within `seconds`, not after a client's
    retries of minutes (in a thread, so a test that fails does not wait them out)."""
    from transforms import object_stores

    outcome = []

    def run() -> None:
        try:
            call()
        except Exception as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"{what} was still being retried after {seconds:.0f} s"
    assert object_stores.unavailable(outcome[0]) and "cannot connect" in str(outcome[0]), repr(outcome[0])


def holding_the_lock(store: servers.Store, images: pathlib.Path) -> Watched:
    """`python -m pipeline.run` from the store's in/ (the images uploaded) to its out/, once it
    holds its lock there: the moment the tests then stop the store."""
    store.upload_tree(images, "in")
    run = Watched(imgrec_argv(store.url("in"), store.url("out"), *CONFIG, *store.flags))
    while f"out/{LOCK}" not in store.keys("out") and run.sample():
        time.sleep(0.02)
    assert run.popen.poll() is None, "the run ended before it took the lock"
    return run


def fails_for_the_store(run: Watched, timeout: float) -> None:
    """The run whose store went away ends within `timeout` with exit 1 and one line that says so."""
    outcome = run.finish(timeout=timeout)
    assert outcome.returncode == 1, outcome.brief()
    assert "cannot connect" in error_line(outcome)


def _gone_s3() -> None:
    """This process's S3 options point at a loopback port nobody answers at."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline import stores

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        stores.use_filesystem_options(PipelineOptions(list(servers.S3Store._flags(
            f"http://127.0.0.1:{closed.getsockname()[1]}"))))


def test_a_read_from_an_s3_endpoint_that_went_away_fails_at_once():
    """The store's fault is raised after botocore's own retries, not after Beam's exponential
    backoff (7 tries from 5 s: ~10 minutes per object, so hours for a run)."""
    from transforms import files

    _gone_s3()
    fails_with_store_fault_within(60, lambda: files.read_input("s3://bucket/cat/cat_01.jpg", 2**20),
                                  "reading from an endpoint nobody answers at")


def _list_class_folders(scheme: str):
    from transforms.inputs.discover import list_root

    return list(list_root(f"{scheme}://bucket/in", (".jpg",), None))


def _match_glob(scheme: str):
    from transforms.inputs.discover import match_glob

    return list(match_glob(f"{scheme}://bucket/in/*/*.jpg"))


def _list_voc_annotations(scheme: str):
    from transforms.inputs.discover_annotated import voc_files

    return voc_files(f"{scheme}://bucket/voc")


def _read_progress(scheme: str):
    from pipeline.output.progress import read_progress

    return read_progress(f"{scheme}://bucket/run")


# What a run asks of the store besides reading and writing images, each while the store may go
# away: discovery's listings (class folders, a glob, a VOC folder's annotations) and the progress
# reporter's read of the planned total (its listing answered, the store gone before the read).
_RUN_REQUESTS = {"class folders": _list_class_folders, "glob": _match_glob, "voc": _list_voc_annotations,
                 "progress": _read_progress}


@pytest.mark.parametrize("request_name", sorted(_RUN_REQUESTS))
def test_a_run_request_to_an_s3_endpoint_that_went_away_fails_at_once(request_name, monkeypatch):
    """Not after Beam's S3 filesystem's own retries (its S3IO, made for FileSystems, retries
    every request 7 times from 5 s: ~10 minutes, during which the run holds its lock): discovery
    lists through imgrec's client, which raises the store's fault as a StoreUnavailable."""
    from pipeline.output import progress

    monkeypatch.setattr(progress, "list_names", lambda folder: [progress.TOTAL_FILE])
    _gone_s3()
    fails_with_store_fault_within(60, lambda: _RUN_REQUESTS[request_name]("s3"),
                                  f"{request_name}: an endpoint nobody answers at")


def test_a_read_under_way_when_the_s3_endpoint_goes_away_fails_at_once(tmp_path):
    """The object was opened (its size asked) before the store went away: reading it fails with
    the store's fault, not after Beam's retry around its client's get_range (~10 minutes
    for each image a converter was reading)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline import stores
    from transforms import files

    with servers.moto_server(tmp_path / "moto.log") as endpoint:
        store = servers.S3Store(endpoint, "going-away")
        store.put("cat.jpg", (SAMPLE / "cat" / "cat_01.jpg").read_bytes())
        stores.use_filesystem_options(PipelineOptions(list(store.flags)))
        handle = files.open_read(store.url("cat.jpg"))

    fails_with_store_fault_within(60, handle.read, "a read from an endpoint that went away")


@pytest.mark.e2e
def test_an_s3_endpoint_that_goes_away_mid_run_fails_the_run_with_exit_1(small_input, tmp_path):
    with servers.moto_server(tmp_path / "moto.log") as endpoint:
        run = holding_the_lock(servers.S3Store(endpoint, "going-away"), small_input)
    fails_for_the_store(run, timeout=120)


# ------------------------------------------------------------------------------------------
# A GCS endpoint that goes away during a run (google-cloud-storage retries a request that cannot
# connect for 120 s, its default deadline, and a run makes several such requests in a row)


def _gone_gcs(monkeypatch, tmp_path) -> None:
    """This process's GCS options and environment point at a loopback port nobody answers at;
    imgrec's kept GCS clients (made for another endpoint) are dropped."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline import stores
    from transforms import object_stores

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    for name, value in servers.emulator_environment(endpoint, tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(object_stores, "_gcs_clients", {})
    stores.use_filesystem_options(PipelineOptions([f"--project={servers.PROJECT}"]))


def test_a_read_from_a_gcs_endpoint_that_went_away_fails_at_once(monkeypatch, tmp_path):
    """The store's fault is raised after a short retry, not after google-cloud-storage's default
    deadline (120 s a request)."""
    from transforms import files

    _gone_gcs(monkeypatch, tmp_path)
    fails_with_store_fault_within(60, lambda: files.read_input("gs://bucket/cat/cat_01.jpg", 2**20),
                                  "reading from an endpoint nobody answers at")


@pytest.mark.parametrize("request_name", sorted(_RUN_REQUESTS))
def test_a_run_request_to_a_gcs_endpoint_that_went_away_fails_at_once(request_name, monkeypatch, tmp_path):
    """Discovery's listings and the progress reporter's read fail with the store's fault, not
    after google-cloud-storage's retries (120 s each, the run's lock held meanwhile)."""
    from pipeline.output import progress

    monkeypatch.setattr(progress, "list_names", lambda folder: [progress.TOTAL_FILE])
    _gone_gcs(monkeypatch, tmp_path)
    fails_with_store_fault_within(60, lambda: _RUN_REQUESTS[request_name]("gs"),
                                  f"{request_name}: an endpoint nobody answers at")


def test_a_read_under_way_when_the_gcs_endpoint_goes_away_fails_at_once(tmp_path, monkeypatch):
    """The object was opened (its size asked) before the store went away: reading it fails with
    the store's fault, not after google-cloud-storage's retries."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline import stores
    from transforms import files, object_stores

    if not servers.fake_gcs_binary().exists():
        pytest.skip("fake-gcs-server is not built: run `python -m tests.stores.servers`")
    with servers.fake_gcs_server(tmp_path / "fake-gcs-server.log") as url:
        for name, value in servers.emulator_environment(url, tmp_path).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(object_stores, "_gcs_clients", {})
        store = servers.GcsStore("going-away")
        store.put("cat.jpg", (SAMPLE / "cat" / "cat_01.jpg").read_bytes())
        stores.use_filesystem_options(PipelineOptions(list(store.flags)))
        handle = files.open_read(store.url("cat.jpg"))
        assert handle.seek(0, 2) > 0 and handle.seek(0) == 0
    fails_with_store_fault_within(60, handle.read, "a read from an endpoint that went away")


@pytest.mark.e2e
def test_a_gcs_endpoint_that_goes_away_mid_run_fails_the_run_with_exit_1(small_input, tmp_path):
    """Not after google-cloud-storage's retries (120 s a request; 7-9 minutes for the run, its lock
    held meanwhile): the server stops once the run holds its lock. Each request then tries for
    GCS_SECONDS (a blip is ridden out) and the clean-up makes a few: 40-90 s here."""
    if not servers.fake_gcs_binary().exists():
        pytest.skip("fake-gcs-server is not built: run `python -m tests.stores.servers`")
    with servers.fake_gcs_server(tmp_path / "fake-gcs-server.log") as url:
        with servers.environment(servers.emulator_environment(url, tmp_path)):
            run = holding_the_lock(servers.GcsStore("going-away"), small_input)
    fails_for_the_store(run, timeout=240)


# ------------------------------------------------------------------------------------------
# Detection datasets on the store


@pytest.mark.e2e
def test_a_coco_dataset_on_a_store_makes_the_local_records(store, tmp_path):
    """COCO's instances.json and its images uploaded as they are: the annotation file is read and
    its `file_name`s resolved on the store; the shards are the local run's, byte for byte."""
    coco = REPO / "data" / "detection" / "coco"
    store.upload_tree(coco, "coco")
    convert(f"--input={coco / 'instances.json'}", f"--output={tmp_path / 'local'}", "--input_kind=coco", *CONFIG)
    convert(f"--input={store.url('coco/instances.json')}", f"--output={store.url('coco-out')}", "--input_kind=coco",
            *CONFIG, *store.flags)
    local = {name: data for name, data in snapshot(tmp_path / "local").items() if data != b"<dir>"}
    found = imgrecs(store, "coco-out")
    assert sorted(found) == sorted(local)
    assert {name: found[name] for name in local if name.endswith(".tfrecord") or "label_map" in name} == \
        {name: data for name, data in local.items() if name.endswith(".tfrecord") or "label_map" in name}
    assert json.loads(found["metadata.json"])["objects"] == json.loads(local["metadata.json"])["objects"]


@pytest.mark.e2e
def test_a_voc_folder_on_a_store_makes_the_local_records(store, tmp_path):
    """--input_kind=voc on a store: its Annotations/ is a prefix, not an object (before, the run was
    refused with 'no Annotations folder'); the shards are the local run's, byte for byte."""
    voc = REPO / "data" / "detection" / "voc"
    store.upload_tree(voc, "voc")
    convert(f"--input={voc}", f"--output={tmp_path / 'local'}", *CONFIG)
    convert(f"--input={store.url('voc')}", f"--output={store.url('voc-out')}", "--input_kind=voc", *CONFIG,
            *store.flags)
    local = {name: data for name, data in snapshot(tmp_path / "local").items() if data != b"<dir>"}
    found = imgrecs(store, "voc-out")
    assert sorted(found) == sorted(local)
    assert {name: data for name, data in found.items() if name.endswith(".tfrecord") or "label_map" in name} == \
        {name: data for name, data in local.items() if name.endswith(".tfrecord") or "label_map" in name}
    assert json.loads(found["metadata.json"])["objects"] == json.loads(local["metadata.json"])["objects"]


@pytest.mark.e2e
def test_an_annotated_input_on_a_store_without_its_kind_is_one_line_and_exit_2(store, tmp_path, capsys):
    """--input_kind=auto recognises COCO and VOC on local disks only. On a store, a VOC folder was
    converted as class folders (one class, 'JPEGImages', the XML files skipped: exit 0) and a
    COCO file as a JSONL manifest (exit 1, 'BadManifestLine: 1'); both are refused up front,
    naming the flag that converts them."""
    from pipeline.run import main

    detection = REPO / "data" / "detection"
    store.upload_tree(detection / "voc", "auto/voc")
    store.upload_tree(detection / "coco", "auto/coco")
    for given, flags, kind in ((store.url("auto/voc"), (), "voc"),
                               (store.url("auto/coco/instances.json"), (), "coco"),
                               (store.url("auto/coco/instances.json"), (f"--images_root={store.url('auto/coco')}",),
                                "coco")):
        code = main([f"--input={given}", f"--output={store.url('auto-out')}", *flags, *CONFIG, *store.flags])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and f"--input_kind={kind}" in err[-1], err
        assert err[-1].startswith("imgrec: error: ") and not store.keys("auto-out"), err
