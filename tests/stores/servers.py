"""Real object-store servers on loopback for the store tests, and a small client for each.

- S3: moto's server (`moto[server]`, in the test extra), started as a process.
- GCS: fake-gcs-server, built by `python -m tests.stores.servers` (`go install
  github.com/fsouza/fake-gcs-server@VERSION` into $IMGREC_STORES_CACHE or ~/.cache/imgrec-stores;
  the Go module cache keeps the sources), started as a process.

google-cloud-storage talks to the emulator when STORAGE_EMULATOR_HOST is set. Its credentials are
found the usual way (Application Default Credentials), and without any Beam retries the search
for 30 s per process: the tests give an ADC file holding a static access token (type
`authorized_user` with a far `expiry`), which needs no network and which the emulator ignores.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Callable, Iterator, Optional, Protocol

FAKE_GCS_VERSION = "v1.56.1"
FAKE_GCS_PACKAGE = "github.com/fsouza/fake-gcs-server"
CACHE = pathlib.Path(os.environ.get("IMGREC_STORES_CACHE", "~/.cache/imgrec-stores")).expanduser()
S3_KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
PROJECT = "imgrec-test"


def fake_gcs_binary() -> pathlib.Path:
    return CACHE / f"fake-gcs-server-{FAKE_GCS_VERSION}" / "fake-gcs-server"


def fetch_fake_gcs() -> pathlib.Path:
    """Builds fake-gcs-server with `go install` unless it is cached."""
    binary = fake_gcs_binary()
    if not binary.exists():
        subprocess.run(["go", "install", f"{FAKE_GCS_PACKAGE}@{FAKE_GCS_VERSION}"], check=True,
                       env={**os.environ, "GOBIN": str(binary.parent)})
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_up(url: str, process: subprocess.Popen | None = None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            if (process is not None and process.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer") from None
            time.sleep(0.1)


class Netns(Protocol):
    """Where a server runs (tests/engines/engines.py's private network namespaces): how to start
    a command there, and how to call a function from there."""

    def wrap(self, argv: list[str]) -> list[str]: ...

    def call(self, function: Callable, *args): ...


class _HostNetwork:
    def wrap(self, argv: list[str]) -> list[str]:
        return argv

    def call(self, function: Callable, *args):
        return function(*args)


HOST_NETWORK = _HostNetwork()


@contextlib.contextmanager
def _server(argv: list[str], probe: str, log: pathlib.Path, netns: Netns) -> Iterator[None]:
    """A server process, up once `probe` answers; stopped at the end."""
    with open(log, "wb") as out:
        process = subprocess.Popen(netns.wrap(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        netns.call(_wait_until_up, probe, process)
        yield
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def moto_server(log: pathlib.Path, netns: Netns = HOST_NETWORK) -> Iterator[str]:
    """moto's S3 server on a free loopback port, a process of its own (so its work does not
    contend for the interpreter lock of the runs this process makes); yields its endpoint URL."""
    url = f"http://127.0.0.1:{free_port()}"
    port = url.rsplit(":", 1)[1]
    with _server([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", port], f"{url}/moto-api/", log,
                 netns):
        yield url


@contextlib.contextmanager
def fake_gcs_server(log: pathlib.Path, netns: Netns = HOST_NETWORK, port: Optional[int] = None) -> Iterator[str]:
    """fake-gcs-server (in memory, plain HTTP) on loopback (`port`, else a free one); yields its URL."""
    url = f"http://127.0.0.1:{port or free_port()}"
    port = url.rsplit(":", 1)[1]
    with _server([str(fake_gcs_binary()), "-host", "127.0.0.1", "-port", port, "-scheme", "http", "-backend", "memory",
                  "-external-url", url, "-log-level", "warn"], f"{url}/storage/v1/b", log, netns):
        yield url


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` while the block runs (then as it was)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def emulator_environment(url: str, folder: pathlib.Path) -> dict[str, str]:
    """The environment every process (imgrec's, Beam's workers, the converters) finds the GCS
    emulator at `url` by, with credentials that need no network."""
    return {"STORAGE_EMULATOR_HOST": url, "GOOGLE_CLOUD_PROJECT": PROJECT,
            "GOOGLE_APPLICATION_CREDENTIALS": str(emulator_credentials(folder))}


def emulator_credentials(folder: pathlib.Path) -> pathlib.Path:
    """An ADC file with a static token: google-auth uses it as it is, with no network."""
    path = folder / "adc.json"
    path.write_text(json.dumps({"type": "authorized_user", "client_id": "emulator", "client_secret": "emulator",
                                "refresh_token": "emulator", "token": "emulator", "expiry": "2999-01-01T00:00:00Z"}))
    return path


class Store:
    """One bucket on one of the servers, as the tests see it (not through imgrec)."""

    scheme = ""

    def __init__(self, bucket: str, flags: tuple[str, ...]):
        self.bucket, self.flags = bucket, flags

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def upload_tree(self, root: pathlib.Path, prefix: str) -> None:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self.put(f"{prefix}/{path.relative_to(root).as_posix()}", path.read_bytes())

    def objects(self, prefix: str) -> dict[str, bytes]:
        """Every object under `prefix/`, by its name below it."""
        return {key[len(prefix) + 1:]: self.get(key) for key in self.keys(prefix)}

    def unreachable(self, endpoint: str, monkeypatch) -> tuple[str, ...]:
        """The flags (and, through `monkeypatch`, the environment) of this store at `endpoint`."""
        raise NotImplementedError

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        raise NotImplementedError

    def keys(self, prefix: str) -> list[str]:
        raise NotImplementedError


class S3Store(Store):
    scheme = "s3"

    def __init__(self, endpoint: str, bucket: str):
        import boto3

        super().__init__(bucket, self._flags(endpoint))
        self.client = boto3.client("s3", endpoint_url=endpoint, **S3_KEYS)
        self.client.create_bucket(Bucket=bucket)

    @staticmethod
    def _flags(endpoint: str) -> tuple[str, ...]:
        return (f"--s3_endpoint_url={endpoint}", f"--s3_access_key_id={S3_KEYS['aws_access_key_id']}",
                f"--s3_secret_access_key={S3_KEYS['aws_secret_access_key']}",
                f"--s3_region_name={S3_KEYS['region_name']}")

    def unreachable(self, endpoint: str, monkeypatch) -> tuple[str, ...]:
        return self._flags(endpoint)

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def keys(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix + "/")
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


class GcsStore(Store):
    scheme = "gs"

    def __init__(self, bucket: str):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        super().__init__(bucket, (f"--project={PROJECT}",))
        self.client = storage.Client(project=PROJECT, credentials=AnonymousCredentials())
        self.handle = self.client.create_bucket(bucket)

    def unreachable(self, endpoint: str, monkeypatch) -> tuple[str, ...]:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        return self.flags

    def put(self, key: str, data: bytes) -> None:
        self.handle.blob(key).upload_from_string(data)

    def get(self, key: str) -> bytes:
        return self.handle.blob(key).download_as_bytes()

    def keys(self, prefix: str) -> list[str]:
        return sorted(blob.name for blob in self.client.list_blobs(self.bucket, prefix=prefix + "/"))


if __name__ == "__main__":
    print(fetch_fake_gcs(), file=sys.stderr)
