"""Beam's Python job service and an EXTERNAL worker pool, started as subprocesses for tests.

`local_portable_services()` starts

- `python -m apache_beam.runners.portability.local_job_service_main --port=N`: the Job API
  (what a Flink or Spark job server provides) backed by Beam's FnApiRunner, and
- `python -m apache_beam.runners.worker.worker_pool_main --service_port=M`: a worker pool that
  starts one `python -c "...SdkHarness(...).run()"` process per requested SDK worker,

on free loopback ports, waits until both accept connections, and stops both (with the worker
processes they started) when the block exits. The worker pool starts `python` from PATH and
the workers import the pipeline's modules, so the venv's bin comes first on PATH and the
repository is on PYTHONPATH (as a worker image would have the package installed).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time
from typing import Iterator, Mapping, Sequence

from tests.helpers import REPO, subprocess_env

JOB_SERVICE_MODULE = "apache_beam.runners.portability.local_job_service_main"
WORKER_POOL_MODULE = "apache_beam.runners.worker.worker_pool_main"


class ServiceFailed(RuntimeError):
    """A service exited or did not accept connections in time; the message holds its output."""


def brief(text: str, tail: int = 8) -> str:
    """The first line of `text` and its last `tail` non-empty lines: what a long error (a
    service's logs) says, short enough for the end of a CI log."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) <= tail + 1:
        return "\n".join(lines)
    return "\n".join([lines[0], f"  ... ({len(lines) - tail - 1} lines)", *lines[-tail:]])


_handed_out: set[int] = set()


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel picks from for outgoing connections and bind(0)."""
    try:
        low, high = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port that is free on the loopback interface now, and not handed out before.

    Chosen below the ephemeral range: a port from bind(0) stays in that range after we close it,
    and any outgoing connection (a readiness poll, a JVM talking to its master) may take it as
    its local port before the server that was given it binds it.
    """
    low, _high = ephemeral_port_range()
    candidates = list(range(max(1024, low - 12000), low))
    random.shuffle(candidates)
    port = next((p for p in candidates if p not in _handed_out and port_is_free(p)), None)
    if port is None:  # no room below the ephemeral range on this machine
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    _handed_out.add(port)
    return port


def accepts_connections(port: int, host: str = "localhost") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclasses.dataclass
class Service:
    name: str
    port: int
    process: subprocess.Popen
    stdout_path: pathlib.Path
    stderr_path: pathlib.Path

    def output(self, limit: int = 8000) -> str:
        parts = []
        for label, path in (("stderr", self.stderr_path), ("stdout", self.stdout_path)):
            text = path.read_text(errors="replace") if path.exists() else ""
            if len(text) > limit:
                text = "...\n" + text[-limit:]
            parts.append(f"--- {self.name} {label} ({path}) ---\n{text}")
        return "\n".join(parts)


def start_service(name: str, module: str, args: Sequence[str], port: int, log_dir: pathlib.Path,
                  env: Mapping[str, str], timeout: float) -> Service:
    """Starts `python -m module args` in its own process group; returns once `port` accepts."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = log_dir / f"{name}.stdout.log", log_dir / f"{name}.stderr.log"
    with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=dict(env),
                                   stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                   start_new_session=True)
    service = Service(name, port, process, stdout_path, stderr_path)
    deadline = time.monotonic() + timeout
    while not accepts_connections(port):
        if process.poll() is not None:
            raise ServiceFailed(f"{name} exited with code {process.returncode} before listening on "
                                f"port {port}\n{service.output()}")
        if time.monotonic() > deadline:
            stop_service(service)
            raise ServiceFailed(f"{name} did not accept connections on port {port} within {timeout:.0f} s\n"
                                f"{service.output()}")
        time.sleep(0.1)
    return service


def stop_service(service: Service, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, to the service's whole process group (its workers included)."""
    pgid = service.process.pid  # start_new_session: the service leads its own group
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            service.process.wait(timeout=grace)
        # SIGTERM skips Python's atexit, so the pool's workers outlive it unless killed too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        if wait_for_group_exit(pgid, grace):
            return


def live_group_members(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies (from /proc; elsewhere killpg(pgid, 0))."""
    proc = pathlib.Path("/proc")
    if not (proc / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except ProcessLookupError:
            return []
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def wait_for_group_exit(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while live_group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@dataclasses.dataclass
class PortableServices:
    job_service: Service
    worker_pool: Service

    @property
    def job_endpoint(self) -> str:
        return f"localhost:{self.job_service.port}"

    @property
    def worker_pool_endpoint(self) -> str:
        return f"localhost:{self.worker_pool.port}"

    def runner_flags(self) -> tuple[str, ...]:
        return ("--runner=PortableRunner", f"--job_endpoint={self.job_endpoint}",
                "--environment_type=EXTERNAL", f"--environment_config={self.worker_pool_endpoint}")

    def output(self) -> str:
        return f"{self.job_service.output()}\n{self.worker_pool.output()}"


@contextlib.contextmanager
def local_portable_services(work_dir: pathlib.Path, timeout: float = 60.0,
                            worker_pool_module: str = WORKER_POOL_MODULE) -> Iterator[PortableServices]:
    """Job service + EXTERNAL worker pool (Beam's, or another with the same command line, such
    as imgrec's `pipeline.worker_pool`) for `--runner=PortableRunner`; logs go to work_dir."""
    env = subprocess_env()
    started: list[Service] = []
    try:
        job_port = free_port()
        started.append(start_service(
            "job_service", JOB_SERVICE_MODULE,
            [f"--port={job_port}", f"--staging_dir={work_dir / 'job_staging'}"],
            job_port, work_dir, env, timeout))
        worker_port = free_port()
        started.append(start_service(
            "worker_pool", worker_pool_module, [f"--service_port={worker_port}"],
            worker_port, work_dir, env, timeout))
        yield PortableServices(*started)
    finally:
        for service in reversed(started):
            stop_service(service)
