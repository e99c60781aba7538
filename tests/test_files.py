"""transforms.files: reading inputs (regular files only, size-capped) and writing atomically."""
from __future__ import annotations

import gzip
import hashlib
import os
import re
import time

import pytest

from transforms import files
from transforms.rejections import EmptyFile, FileTooLarge, InputRejected, UnreadableFile

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]  # a FIFO that is opened would hang


def test_read_input_reads_a_regular_file_whole(tmp_path):
    path = tmp_path / "a.jpg"
    path.write_bytes(b"\xff\xd8" + bytes(range(256)) * 10)
    assert files.read_input(str(path), 10_000) == path.read_bytes()
    assert files.read_input(f"file://{path}", 10_000) == path.read_bytes()
    assert files.read_input(str(path), len(path.read_bytes())) == path.read_bytes()  # exactly the cap


def test_a_file_over_the_cap_is_refused_from_its_size(tmp_path):
    path = tmp_path / "big.jpg"
    path.write_bytes(b"x" * 1001)
    with pytest.raises(FileTooLarge, match="1001 bytes, more than max_file_bytes=1000"):
        files.read_input(str(path), 1000)


def test_a_symlink_to_dev_zero_is_refused_not_read(tmp_path):
    link = tmp_path / "zero.jpg"
    link.symlink_to("/dev/zero")
    with pytest.raises(UnreadableFile, match="a character device, not a regular file"):
        files.read_input(str(link), 2**30)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "x.jpg"
    os.mkfifo(fifo)
    with pytest.raises(UnreadableFile, match="a FIFO, not a regular file"):
        files.read_input(str(fifo), 2**20)


def test_files_imgrec_reads_back_must_be_regular_files(tmp_path):
    """An index or metadata.json replaced by a FIFO blocked the open forever, with the output's
    lock held (--skip_unchanged, export-tfds); a regular file, and a symlink to one, still read."""
    os.mkfifo(tmp_path / "index.idx")
    with pytest.raises(OSError, match="a FIFO, not a regular file"):
        files.read_bytes(str(tmp_path / "index.idx"))
    with pytest.raises(OSError, match="a folder, not a regular file"):
        files.read_bytes(str(tmp_path))
    (tmp_path / "real").write_bytes(b"0 20 ab 10 4\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert files.read_bytes(str(tmp_path / "link")) == b"0 20 ab 10 4\n"
    with files.open_read(str(tmp_path / "real")) as handle:
        assert handle.read(2) == b"0 " and handle.read() == b"20 ab 10 4\n"


@pytest.mark.parametrize("make,error,message", [
    (lambda p: None, UnreadableFile, "No such file"),
    (lambda p: p.mkdir(), UnreadableFile, "a folder, not a regular file"),
    (lambda p: p.write_bytes(b""), EmptyFile, "is empty"),
    (lambda p: p.symlink_to(p.parent / "gone.jpg"), UnreadableFile, "No such file"),
])
def test_unreadable_inputs_are_rejections(tmp_path, make, error, message):
    path = tmp_path / "input.jpg"
    make(path)
    with pytest.raises(error, match=message) as info:
        files.read_input(str(path), 2**20)
    assert isinstance(info.value, InputRejected) and info.value.stage == "read"
    assert str(path) in str(info.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_a_file_without_read_permission(tmp_path):
    path = tmp_path / "secret.jpg"
    path.write_bytes(b"data")
    path.chmod(0)
    with pytest.raises(UnreadableFile, match="Permission denied"):
        files.read_input(str(path), 100)


@pytest.mark.parametrize("path,local", [
    ("/data/x.jpg", "/data/x.jpg"), ("rel/x.jpg", "rel/x.jpg"), ("file:///data/x.jpg", "/data/x.jpg"),
    ("gs://bucket/x.jpg", None), ("s3://b/x", None),
])
def test_local_path(path, local):
    assert files.local_path(path) == local


def test_write_atomically_creates_folders_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "a" / "b" / "data.json"
    files.write_atomically(str(target), b"first")
    files.write_atomically(str(target), b"second")
    assert target.read_bytes() == b"second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["data.json"]


def test_a_failed_atomic_write_leaves_no_temporary(tmp_path):
    """The rename fails here (the destination is a non-empty folder); a full disk fails the
    write instead, and both go through the same clean-up."""
    target = tmp_path / "metadata.json"
    (target / "inside").mkdir(parents=True)
    with pytest.raises(OSError):
        files.write_atomically(str(target), b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metadata.json"]


def test_create_rename_exists_and_gzip(tmp_path):
    plain, packed = tmp_path / "sub" / "x.bin", tmp_path / "y.gz"
    with files.create(str(plain)) as handle:
        handle.write(b"hello")
    with files.create(str(packed), gzip=True) as handle:
        handle.write(b"hello" * 100)
    assert files.exists(str(plain)) and not files.exists(str(tmp_path / "nothing"))
    assert gzip.decompress(packed.read_bytes()) == b"hello" * 100
    files.rename(str(plain), str(tmp_path / "moved.bin"))
    assert files.read_bytes(str(tmp_path / "moved.bin")) == b"hello" and not plain.exists()


def test_size(tmp_path):
    path = str(tmp_path / "x.bin")
    with files.create(path) as handle:
        handle.write(b"hello" * 7)
    assert files.size(path) == files.size(f"file://{path}") == 35


def test_content_hash_is_sha256():
    assert files.content_hash(b"abc") == hashlib.sha256(b"abc").hexdigest()


@pytest.mark.parametrize("name", ["out[1]", "ds?", "d*", "a[!b]", "[", "x]y", "plain"])
def test_as_pattern_matches_only_the_path_itself(name):
    """Beam matches (and deletes) paths as patterns; the escaped path is literal to it."""
    from apache_beam.io.filesystem import FileSystem

    regex = re.compile(FileSystem.translate_pattern(files.as_pattern(f"gs://b/{name}")))
    assert regex.fullmatch(f"gs://b/{name}")
    assert not any(regex.fullmatch(f"gs://b/{other}") for other in ("out1", "ds1", "dx", "aa", "a", "xy", "plainx"))


def test_delete_takes_paths_literally(tmp_path):
    for name in ("ds?", "ds1", "keep"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "keep")
    files.delete([str(tmp_path / "ds?"), str(tmp_path / "link")])
    assert files.list_names(str(tmp_path)) == ["ds1", "keep"] and (tmp_path / "keep" / "f").exists()


def test_missing_credentials_are_named_so_not_a_connection_that_failed():
    """`--input=s3://...` with no credentials anywhere said `cannot connect (NoCredentialsError):
    Unable to locate credentials`: nothing had failed to connect."""
    from botocore.exceptions import NoCredentialsError
    from google.auth.exceptions import DefaultCredentialsError

    from transforms import object_stores

    assert object_stores.store_fault(NoCredentialsError()) == (
        "no usable credentials (NoCredentialsError): Unable to locate credentials")
    assert object_stores.store_fault(DefaultCredentialsError("not found")).startswith("no usable credentials (")


def test_gcs_requests_give_up_on_a_store_they_cannot_reach_and_ride_out_throttling(monkeypatch):
    """imgrec's GCS retry: a store nobody answers at is given up on after GCS_SECONDS (google's
    default retries it for 2 minutes, while the run holds its lock), with an error that says the
    store cannot be reached; a store that throttles (429) longer than that is still retried."""
    import http.server
    import socket
    import threading

    import requests
    from google.api_core.exceptions import from_http_response

    from transforms import object_stores

    monkeypatch.setattr(object_stores, "GCS_SECONDS", 0.5)

    def fetch(url: str) -> str:
        response = requests.get(url, timeout=5)
        if response.status_code >= 400:
            raise from_http_response(response)
        return response.text

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        began = time.monotonic()
        with pytest.raises(Exception) as raised:
            object_stores._gcs_request()["retry"](fetch)(f"http://127.0.0.1:{closed.getsockname()[1]}/b/bucket")
    assert time.monotonic() - began < 5
    assert object_stores.store_fault(raised.value).startswith("cannot connect")

    throttled_until = time.monotonic() + 2  # four times GCS_SECONDS

    class Throttling(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = (429, b"{}") if time.monotonic() < throttled_until else (200, b"ok")
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Throttling) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            assert object_stores._gcs_request()["retry"](fetch)(f"http://127.0.0.1:{server.server_port}/o") == "ok"
        finally:
            server.shutdown()


@pytest.mark.parametrize("path", ["s3://bucket", "s3://bucket/", "gs://bucket", "gs://bucket//"])
def test_a_buckets_root_is_a_usage_error_before_any_request(path):
    """`--output=s3://bucket` (or --input) sat silent for ~8 minutes, deaf to Ctrl-C and SIGTERM:
    Beam's S3 client retried the ValueError a path without a key gives. GCS said 'Cannot
    determine path without a blob name'. No store answers here: the check must not ask one."""
    from pipeline import stores
    from pipeline.errors import UsageError

    began = time.monotonic()
    with pytest.raises(UsageError, match=re.escape(f"--output={path}: a bucket's root; name a folder in it (")):
        stores.check_store("--output", path)
    assert time.monotonic() - began < 5
