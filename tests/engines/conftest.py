"""Fixtures shared by the engine tests: the inputs, the DirectRunner reference, comparisons, timings.

The engine tests run only when asked for by marker (`pytest -m engines tests/engines`, which is
what `make test-engines` does after fetching the engines); a plain `pytest tests` leaves them out.
Each test's wall time, and the time of each engine start and pipeline run, are printed at the end
and written to out/test-engines/timings.json.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import pathlib
import time
from typing import Iterator, Optional

import pytest

from tests.engines import data
from tests.engines.engines import Netns, PipelineRun, run_imgrec
from tests.helpers import REPO, SAMPLE, subprocess_env
from tests.portable import brief
from tests.stores import servers

# The reference: what `--runner=DirectRunner --direct_running_mode=in_memory` runs when Prism
# can't be had (as in CI here). Named directly, because DirectRunner first tries Prism (Beam
# >= 2.65) and would run the reference on Prism wherever Beam can download or has cached it.
REFERENCE_RUNNER = ("--runner=FnApiRunner", "--direct_running_mode=in_memory", "--direct_num_workers=1")
TIMINGS_FILE = REPO / "out" / "test-engines" / "timings.json"

_timings: dict[str, dict] = {"tests": {}, "phases": {}}
# Each distinct failure message → the tests it failed (a fixture that fails fails them all).
_failures: dict[str, list[str]] = {}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "engines: starts a real Beam engine (Prism, Flink, Spark); run by make test-engines")


def pytest_collection_modifyitems(config, items):
    """Leave the engine tests out unless the marker expression names them."""
    if "engines" in (config.getoption("markexpr") or ""):
        return
    here = pathlib.Path(__file__).parent
    keep, drop = [], []
    for item in items:
        (drop if here in pathlib.Path(str(item.fspath)).parents else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_runtest_logreport(report):
    if "engines" not in report.keywords:
        return
    entry = _timings["tests"].setdefault(report.nodeid, {"seconds": 0.0})
    entry["seconds"] = round(entry["seconds"] + report.duration, 2)
    if report.when == "call" or report.outcome != "passed":
        entry["outcome"] = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        _failures.setdefault(crash.message if crash else str(report.longrepr), []).append(report.nodeid)


def record_phase(name: str, seconds: float) -> None:
    _timings["phases"][name] = round(seconds, 2)


def pytest_terminal_summary(terminalreporter):
    if not _timings["tests"]:
        return
    TIMINGS_FILE.parent.mkdir(parents=True, exist_ok=True)
    TIMINGS_FILE.write_text(json.dumps(_timings, indent=2) + "\n")
    write = terminalreporter.write_line
    terminalreporter.section("engine timings (wall seconds)")
    for name, seconds in _timings["phases"].items():
        write(f"{seconds:8.1f}  {name}")
    write("")
    for nodeid, entry in _timings["tests"].items():
        write(f"{entry['seconds']:8.1f}  {entry.get('outcome', '?'):8s} {nodeid.split('::', 1)[-1]}")
    write(f"(also in {TIMINGS_FILE.relative_to(REPO)})")
    # Last before pytest's short summary, so that the tail of a CI log says why.
    for message, nodeids in _failures.items():
        terminalreporter.section(f"why {len(nodeids)} engine test(s) failed, e.g. {nodeids[0].split('::', 1)[-1]}")
        for line in brief(message, tail=10).splitlines():
            write(line[:400])


class Timer:
    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc):
        record_phase(self.name, time.monotonic() - self.started)


# --- inputs and the reference -----------------------------------------------------------------------

@pytest.fixture(scope="session")
def inputs(tmp_path_factory) -> pathlib.Path:
    """The input folder every engine run converts (tests/engines/data.py)."""
    return data.write_images(tmp_path_factory.mktemp("engine-inputs") / "images")


def imgrec_flags(inputs: pathlib.Path, output: pathlib.Path, runner: tuple[str, ...],
                 config: Optional[pathlib.Path] = None) -> list[str]:
    """The command line of one run: the built-in defaults, or `config` (a runner's settings only)."""
    return [*([f"--config={config}"] if config else []), f"--input={inputs}", f"--output={output}", *runner]


@pytest.fixture(scope="session")
def reference(inputs, tmp_path_factory) -> pathlib.Path:
    """Output folder of the DirectRunner (FnApiRunner, in_memory) run on `inputs`; it holds a
    dead letter for each bad file, so the comparisons cover dead letters too."""
    work = tmp_path_factory.mktemp("reference")
    with Timer("reference run (FnApiRunner in_memory)"):
        run = run_imgrec(imgrec_flags(inputs, work / "out", REFERENCE_RUNNER), work / "imgrec.log")
    assert run.returncode == 0, f"reference run failed:\n{run.tail()}"
    dead_letters = "".join(path.read_text() for path in (work / "out").rglob("errors-*"))
    assert all(name in dead_letters for name in data.REJECTED), dead_letters[:2000]
    return work / "out"


# --- comparing a run with the reference ----------------------------------------------------------------

def load_metadata(output: pathlib.Path) -> dict:
    return json.loads((output / "metadata.json").read_text())


def file_digests(output: pathlib.Path, kind: str) -> dict[str, str]:
    """sha256 by relative name of the published shards and record index ("shards") or dead
    letters ("dead_letters")."""
    def wanted(name: str) -> bool:
        if name == "metadata.json":
            return False
        return name.startswith("errors-") == (kind == "dead_letters")
    return {str(p.relative_to(output)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(output.rglob("*")) if p.is_file() and wanted(p.name)}


def metadata_counts(metadata: dict) -> dict:
    return {"inputs": metadata["inputs"],
            "splits": {split: {"num_examples": info["num_examples"], "label_counts": info["label_counts"],
                               "shard_lengths": info["shard_lengths"]}
                       for split, info in metadata["splits"].items()},
            "duplicates": {k: metadata["duplicates"][k] for k in ("groups", "extra_copies", "dropped")}}


def comparable_metadata(metadata: dict) -> dict:
    """metadata.json less what differs between runs by design (run info, the output path) and
    the dead letters' file names (the dead_letters check compares those)."""
    metadata = json.loads(json.dumps(metadata))
    metadata.pop("run")
    metadata.pop("error_files")
    metadata["config"]["output"].pop("path")
    return metadata


def check_against_reference(check: str, output: pathlib.Path, expected: pathlib.Path) -> None:
    """One of the checks every engine run has to pass against the reference's output."""
    if check in ("shards", "dead_letters"):
        actual_files, expected_files = file_digests(output, check), file_digests(expected, check)
        assert sorted(actual_files) == sorted(expected_files), f"{check}: different files"
        differing = [name for name in expected_files if actual_files[name] != expected_files[name]]
        assert not differing, f"{check}: not byte-identical: {differing}"
    elif check == "metadata_counts":
        actual, wanted = load_metadata(output), load_metadata(expected)
        assert metadata_counts(actual) == metadata_counts(wanted)
        assert comparable_metadata(actual) == comparable_metadata(wanted)
    else:
        raise ValueError(check)


CHECKS = ("shards", "dead_letters", "metadata_counts")


def assert_run_ok(run: PipelineRun) -> None:
    assert run.returncode == 0, f"{' '.join(run.argv)} exited with {run.returncode}:\n{run.tail()}"
    assert not run.survivors, f"processes outlived the pipeline: {run.survivors}"


# --- object stores inside an engine's network namespace -------------------------------------------------

# fake-gcs-server's port in every test namespace (each has its own ports): the worker pools, started
# before the server, find it through the environment as on any GCS client (STORAGE_EMULATOR_HOST).
GCS_EMULATOR_PORT = servers.free_port()


@pytest.fixture(scope="session", autouse=True)
def gcs_emulator_environment(tmp_path_factory):
    """Every process the engine tests start (engines, worker pools, pipelines) with the GCS
    emulator's environment, as a cluster's hosts have their store's credentials."""
    url = f"http://127.0.0.1:{GCS_EMULATOR_PORT}"
    with servers.environment(servers.emulator_environment(url, tmp_path_factory.mktemp("gcs"))):
        yield


class InNamespace:
    """A store client whose every call runs inside the store's network namespace."""

    def __init__(self, netns: Netns, store: servers.Store):
        self._netns, self._store = netns, store
        self.flags = store.flags

    def __getattr__(self, name: str):
        method = getattr(self._store, name)
        return lambda *args: self._netns.call(method, *args)


@contextlib.contextmanager
def object_stores(netns: Netns, log_dir: pathlib.Path) -> Iterator[dict[str, InNamespace]]:
    """moto's S3 server and fake-gcs-server in `netns`, each with a new bucket, by scheme."""
    if not servers.fake_gcs_binary().exists():
        pytest.fail("fake-gcs-server is not built: run `python -m tests.stores.servers` (make test-engines does)")
    log_dir.mkdir(parents=True, exist_ok=True)
    with servers.moto_server(log_dir / "moto.log", netns) as s3_endpoint, \
            servers.fake_gcs_server(log_dir / "fake-gcs-server.log", netns, GCS_EMULATOR_PORT):
        yield {"s3": InNamespace(netns, netns.call(servers.S3Store, s3_endpoint, "imgrec-engines")),
               "gs": InNamespace(netns, netns.call(servers.GcsStore, "imgrec-engines"))}


def check_store_run(netns: Netns, source: str, target: str, runner: tuple[str, ...], work: pathlib.Path,
                    reference: pathlib.Path, config: Optional[pathlib.Path] = None) -> None:
    """data/sample uploaded to the `source` store, converted on an engine (`runner` flags) into
    the `target` store: the dataset there equals the local `reference` run's."""
    with object_stores(netns, work / "servers") as stores:
        stores[source].upload_tree(SAMPLE, "in")
        flags = [*imgrec_flags(stores[source].url("in"), stores[target].url("out"), runner, config),
                 *dict.fromkeys(stores[source].flags + stores[target].flags)]
        with Timer(f"{' '.join(runner[:1])} {source}:// to {target}://: imgrec"):
            run = run_imgrec(flags, work / "imgrec.log", netns, env=subprocess_env())
        assert_run_ok(run)
        output = work / "out"
        for name, data_ in stores[target].objects("out").items():
            (output / name).parent.mkdir(parents=True, exist_ok=True)
            (output / name).write_bytes(data_)
    check_against_reference("shards", output, reference)
    assert dead_letters(output, stores[source].url("in")) == dead_letters(reference, str(SAMPLE))
    assert metadata_counts(load_metadata(output)) == metadata_counts(load_metadata(reference))


def dead_letters(output: pathlib.Path, input_root: str) -> list[dict]:
    """The dead letters of a run, each naming its file below `input_root`."""
    letters = [json.loads(line) for path in sorted(output.glob("errors-*")) for line in path.read_text().splitlines()]
    return [{**letter, "path": letter["path"].removeprefix(input_root)} for letter in letters]


@pytest.fixture(scope="session")
def sample_reference(tmp_path_factory) -> pathlib.Path:
    """data/sample converted on the local disk by the reference runner."""
    work = tmp_path_factory.mktemp("sample-reference")
    run = run_imgrec(imgrec_flags(SAMPLE, work / "out", REFERENCE_RUNNER), work / "imgrec.log")
    assert run.returncode == 0, f"reference run failed:\n{run.tail()}"
    return work / "out"
