"""Fixtures of the store tests (`make test-stores`): the S3 and GCS servers, started once per
session on loopback, and a fresh bucket on each for every test."""
from __future__ import annotations

import itertools
import os
import pathlib

import pytest

from tests.stores import servers

_buckets = itertools.count()
# The shipped local config; 8 shards a split, so some (of the 3 test images) are zero-byte files.
CONFIG = ("--config=local", "--num_shards=8")


@pytest.fixture(scope="session")
def s3_endpoint():
    with servers.moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def gcs_endpoint(tmp_path_factory):
    """fake-gcs-server, and the environment every process (imgrec's, Beam's workers, the
    converters) finds it by; skipped with the command to run when it was not fetched."""
    if not servers.fake_gcs_binary().exists():
        pytest.skip("fake-gcs-server is not built: run `python -m tests.stores.servers` (make test-stores does)")
    folder = tmp_path_factory.mktemp("gcs")
    with servers.fake_gcs_server(folder / "fake-gcs-server.log") as url:
        saved = {name: os.environ.get(name) for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS",
                                                         "GOOGLE_CLOUD_PROJECT")}
        os.environ.update(STORAGE_EMULATOR_HOST=url, GOOGLE_CLOUD_PROJECT=servers.PROJECT,
                          GOOGLE_APPLICATION_CREDENTIALS=str(servers.emulator_credentials(folder)))
        try:
            yield url
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture(params=["s3", "gs"])
def store(request) -> servers.Store:
    """A new, empty bucket on the S3 or the GCS server."""
    bucket = f"imgrec-{next(_buckets)}-{os.getpid()}"
    if request.param == "s3":
        return servers.S3Store(request.getfixturevalue("s3_endpoint"), bucket)
    request.getfixturevalue("gcs_endpoint")
    return servers.GcsStore(bucket)


@pytest.fixture(scope="session")
def local_reference(tmp_path_factory) -> pathlib.Path:
    """The sample converted on the local disk: what every store's output must equal."""
    from tests.helpers import SAMPLE
    from tests.trust_helpers import run_imgrec

    out = tmp_path_factory.mktemp("reference") / "out"
    run = run_imgrec(SAMPLE, out, *CONFIG)
    assert run.returncode == 0, run.brief()
    return out
