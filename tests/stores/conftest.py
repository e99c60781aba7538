"""Fixtures of the store tests (`make test-stores`): the S3 and GCS servers, started once per
session on loopback; one bucket on each, shared by the module's tests (each test its own prefix);
a small input (a few images of data/sample and the bad files that matter) and its conversion on
the local disk, which every store's output must equal."""
from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from tests.helpers import SAMPLE
from tests.stores import servers

# The built-in defaults; 8 shards a split for 6 images, so most shards are zero-byte files;
# two of the 8 inputs are bad (an empty file, a cut-off JPEG), so every error fraction is allowed.
# One converter process: each imports Beam for its store requests (~2 s of CPU), for 8 images.
CONFIG = ("--num_shards=8", "--max_error_fraction=1", "--convert_processes=1")
IMAGES = ("cat/cat_01.jpg", "cat/cat_05.png", "coffee/coffee_01.jpg", "coffee/coffee_08.webp", "rocket/rocket_02.jpg",
          "rocket/rocket_03_png16.png")


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    with servers.moto_server(tmp_path_factory.mktemp("s3") / "moto.log") as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def gcs_endpoint(tmp_path_factory):
    """fake-gcs-server, and the environment every process (imgrec's, Beam's workers, the
    converters) finds it by; skipped with the command to run when it was not fetched."""
    if not servers.fake_gcs_binary().exists():
        pytest.skip("fake-gcs-server is not built: run `python -m tests.stores.servers` (make test-stores does)")
    folder = tmp_path_factory.mktemp("gcs")
    with servers.fake_gcs_server(folder / "fake-gcs-server.log") as url:
        with servers.environment(servers.emulator_environment(url, folder)):
            yield url


@pytest.fixture(scope="module", params=["s3", "gs"])
def store(request) -> servers.Store:
    """A new, empty bucket on the S3 or the GCS server, for one module's tests."""
    bucket = f"imgrec-{request.module.__name__.rsplit('.', 1)[-1].replace('_', '-')}-{os.getpid()}"
    if request.param == "s3":
        return servers.S3Store(request.getfixturevalue("s3_endpoint"), bucket)
    request.getfixturevalue("gcs_endpoint")
    return servers.GcsStore(bucket)


@pytest.fixture(scope="session")
def small_input(tmp_path_factory) -> pathlib.Path:
    """Six images of three classes in five formats, an empty file and a JPEG cut off after its
    header (two dead letters)."""
    root = tmp_path_factory.mktemp("input") / "images"
    for name in IMAGES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SAMPLE / name, root / name)
    (root / "cat" / "empty.jpg").write_bytes(b"")
    (root / "coffee" / "cut.jpg").write_bytes((SAMPLE / "coffee" / "coffee_01.jpg").read_bytes()[:200])
    return root


@pytest.fixture(scope="session")
def local_reference(small_input, tmp_path_factory) -> pathlib.Path:
    """The small input converted on the local disk (in this process)."""
    from pipeline.run import convert

    out = tmp_path_factory.mktemp("reference") / "out"
    convert([f"--input={small_input}", f"--output={out}", *CONFIG])
    return out
