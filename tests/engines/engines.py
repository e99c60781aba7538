"""Real Beam engines on this machine, started as process groups for tests: Prism, a Flink session
cluster and a Spark standalone cluster, with Beam's job servers (built by `make engines`) and an
EXTERNAL worker pool.

What `python -m tests.engines.fetch` put in the cache (`IMGREC_ENGINES_CACHE`, default
`~/.cache/imgrec-engines`) is used from there; nothing is downloaded here. The versions are
engines/pom.xml's. Every process is started in a new session (its own process group) and stopped
by `tests.portable.stop_service` (SIGTERM, then SIGKILL, to the whole group), and every context
manager below stops what it started on the way out, whatever raised inside the block.

Servers are told to bind 127.0.0.1 where they can be. Prism, Beam's Python worker pool and
Beam's Java servers (the job server's job and artifact ports, the Fn API servers inside Flink's
TaskManagers and Spark's executors) listen on every interface whatever they are told, so the
tests run them, and the pipelines that talk to them, in a private network namespace that has
only a loopback interface (`unshare --net`, `nsenter`; needs root). Where no namespace can be
made, they run in the host's namespace.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import warnings
from typing import Callable, Iterator, Mapping, Optional, Sequence
from xml.etree import ElementTree

import yaml
from apache_beam.version import __version__ as BEAM_VERSION

from tests.helpers import REPO
from tests.portable import (
    Service,
    ServiceFailed,
    accepts_connections,
    brief,
    free_port,
    live_group_members,
    stop_service,
    subprocess_env,
    wait_for_group_exit,
)

CACHE = pathlib.Path(os.environ.get("IMGREC_ENGINES_CACHE", "~/.cache/imgrec-engines")).expanduser()
ENGINES_POM = REPO / "engines" / "pom.xml"  # the Maven project of Beam's job servers (make engines)
JOB_SERVER_POMS = (ENGINES_POM, REPO / "engines" / "flink" / "pom.xml", REPO / "engines" / "spark" / "pom.xml")


def pom_properties(pom: pathlib.Path = ENGINES_POM) -> dict[str, str]:
    """The <properties> of a pom.xml (no interpolation): engines/pom.xml holds every engine version."""
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    properties = ElementTree.parse(pom).getroot().find("m:properties", namespace)
    return {child.tag.split("}", 1)[1]: (child.text or "").strip() for child in properties}


# One place for the versions (engines/pom.xml): the clusters the tests start are those the job
# servers are built for. See docs/runners.md for why these.
_VERSIONS = pom_properties()
JOB_SERVER_BEAM_VERSION = _VERSIONS["beam.version"]   # Beam's Java runners (Maven)
FLINK_VERSION = _VERSIONS["flink.version"]            # PyPI apache-flink / apache-flink-libraries
FLINK_MINOR = _VERSIONS["flink.minor"]
SPARK_VERSION = _VERSIONS["spark.version"]            # PyPI pyspark, and the Spark in Spark's job server
PRISM_PACKAGE = "github.com/apache/beam/sdks/v2/go/cmd/prism"
IMGREC_WORKER_POOL_MODULE = "pipeline.worker_pool"  # what docs/runners.md tells cluster users to run
JOB_SERVER_JARS = {"flink": f"beam-runners-flink-{FLINK_MINOR}-job-server-{JOB_SERVER_BEAM_VERSION}.jar",
                   "spark": f"beam-runners-spark-3-job-server-{JOB_SERVER_BEAM_VERSION}.jar"}


def prism_binary() -> pathlib.Path:
    return CACHE / f"prism-v{BEAM_VERSION}" / "prism"


def flink_home() -> pathlib.Path:
    return CACHE / f"flink-{FLINK_VERSION}"


def spark_home() -> pathlib.Path:
    return CACHE / f"spark-{SPARK_VERSION}"


def job_servers_digest() -> str:
    """Names a build of the job servers: the poms' bytes decide what Maven builds."""
    digest = hashlib.sha256()
    for pom in JOB_SERVER_POMS:
        digest.update(pom.read_bytes())
    return digest.hexdigest()[:16]


def job_servers_dir() -> pathlib.Path:
    """Where `make engines` keeps the jars built from the poms as they are now."""
    return CACHE / "job-servers" / job_servers_digest()


def job_server_jar(engine: str) -> Optional[pathlib.Path]:
    """Beam's job-server jar for 'flink' or 'spark': $IMGREC_<ENGINE>_JOB_SERVER_JAR, else the
    one `make engines` built from the current poms, else None."""
    override = os.environ.get(f"IMGREC_{engine.upper()}_JOB_SERVER_JAR")
    if override:
        return pathlib.Path(override)
    path = job_servers_dir() / JOB_SERVER_JARS[engine]
    return path if path.is_file() else None


# --- processes -----------------------------------------------------------------------------------

def start_command(name: str, argv: Sequence[str], log_dir: pathlib.Path, env: Mapping[str, str],
                  ready: Callable[[], bool], timeout: float, port: int = 0,
                  cwd: Optional[pathlib.Path] = None) -> Service:
    """Starts `argv` in its own process group, logging to log_dir/name.{stdout,stderr}.log, and
    returns once `ready()` holds (a port answers, a REST call shows workers, ...)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = log_dir / f"{name}.stdout.log", log_dir / f"{name}.stderr.log"
    with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        process = subprocess.Popen([str(a) for a in argv], cwd=cwd or REPO, env=dict(env),
                                   stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                   start_new_session=True)
    service = Service(name, port, process, stdout_path, stderr_path)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return service
        except Exception:  # not up yet (connection refused, partial JSON, ...)
            pass
        if process.poll() is not None:
            stop_service(service)  # the group may hold children that outlive the leader
            raise ServiceFailed(f"{name} exited with code {process.returncode} before it was ready\n"
                                f"{service.output()}")
        if time.monotonic() > deadline:
            stop_service(service)
            raise ServiceFailed(f"{name} was not ready within {timeout:.0f} s\n{service.output()}")
        time.sleep(0.2)


@contextlib.contextmanager
def services_stopped_on_exit() -> Iterator[list[Service]]:
    """A list to append started services to; all are stopped (last first) when the block exits,
    and the block fails if any process of theirs is still alive afterwards."""
    started: list[Service] = []
    try:
        yield started
    finally:
        for service in reversed(started):
            stop_service(service)
        survivors = {s.name: live_group_members(s.process.pid) for s in started}
        survivors = {name: pids for name, pids in survivors.items() if pids}
        if survivors:
            raise AssertionError(f"processes survived their engine's teardown: {survivors}")


def http_json(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


# --- a network namespace with only loopback --------------------------------------------------------

class Netns:
    """Runs commands in a private network namespace that has only `lo` (127.0.0.1, ::1).

    A `sleep` process holds the namespace (made by `unshare --net`); commands join it with
    `nsenter --net=/proc/PID/ns/net`, and this process reaches into it from one thread that
    joined it (setns(2) moves only the calling thread). Nothing in it can reach or be reached
    from outside. Without a holder it is the host's namespace.
    """

    def __init__(self, holder: Optional[Service]):
        self.holder = holder
        self._inside: Optional[concurrent.futures.ThreadPoolExecutor] = None

    @property
    def isolated(self) -> bool:
        return self.holder is not None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        if self.holder is None:
            return [str(a) for a in argv]
        return ["nsenter", f"--net=/proc/{self.holder.process.pid}/ns/net", "--", *map(str, argv)]

    def call(self, function: Callable, *args):
        """function(*args), on a thread inside the namespace."""
        if self.holder is None:
            return function(*args)
        if self._inside is None:
            self._inside = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="netns",
                                                                 initializer=self._join)
        return self._inside.submit(function, *args).result()

    def _join(self) -> None:
        fd = os.open(f"/proc/{self.holder.process.pid}/ns/net", os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into the test namespace failed")
        finally:
            os.close(fd)

    def accepts_connections(self, port: int) -> bool:
        return self.call(accepts_connections, port, "127.0.0.1")

    def http_json(self, url: str):
        return self.call(http_json, url)

    def close(self) -> None:
        if self._inside is not None:
            self._inside.shutdown()


_CLONE_NEWNET = 0x40000000
HOST_NETNS = Netns(None)


def netns_supported() -> bool:
    if not (shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")):
        return False
    return subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, check=False).returncode == 0


@contextlib.contextmanager
def loopback_netns(log_dir: pathlib.Path, started: list[Service]) -> Iterator[Netns]:
    """A Netns (or, where namespaces can't be made, a pass-through one); its holder is appended
    to `started` so the caller's teardown stops it."""
    if not netns_supported():
        yield Netns(None)
        return
    own = os.readlink("/proc/self/ns/net")
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "netns.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(["unshare", "--net", "sleep", "infinity"], stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=out, start_new_session=True)
    holder = Service("netns", 0, process, log, log)
    # Not before unshare(2) has run: nsenter would join this (the host's) namespace instead.
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{process.pid}/ns/net") == own:
        if process.poll() is not None or time.monotonic() > deadline:
            stop_service(holder)
            raise ServiceFailed(f"unshare --net did not make a namespace\n{holder.output()}")
        time.sleep(0.01)
    started.append(holder)
    netns = Netns(holder)
    subprocess.run(netns.wrap(["ip", "link", "set", "lo", "up"]), check=True)
    try:
        yield netns
    finally:
        netns.close()


@contextlib.contextmanager
def private_netns(log_dir: pathlib.Path) -> Iterator[Netns]:
    """loopback_netns on its own: the namespace (holder) goes when the block exits."""
    with services_stopped_on_exit() as started, loopback_netns(log_dir, started) as netns:
        yield netns


# --- Prism --------------------------------------------------------------------------------------------

def beam_prism_cache_name() -> str:
    """The name Beam gives the Prism release it downloads for this machine (without .zip)."""
    import platform
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine().lower(), platform.machine().lower())
    return f"apache_beam-v{BEAM_VERSION}-prism-{platform.system().lower()}-{arch}"


def install_prism_in_beam_cache(home: pathlib.Path) -> pathlib.Path:
    """Puts the built Prism where Beam keeps the one it downloads from GitHub
    (HOME/.apache_beam/cache/prism/bin/<release>.zip). From then on, `--runner=DirectRunner`
    runs on Prism without downloading anything (and `--runner=PrismRunner` needs no
    --prism_location). Returns the zip's path."""
    import zipfile
    name = beam_prism_cache_name()
    target = home / ".apache_beam" / "cache" / "prism" / "bin" / f"{name}.zip"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".zip.partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as archive:
        archive.write(prism_binary(), name)
    partial.rename(target)
    return target


@dataclasses.dataclass
class PrismEngine:
    netns: Netns
    job_service: Service
    worker_pool: Service

    @property
    def job_endpoint(self) -> str:
        return f"localhost:{self.job_service.port}"

    def runner_flags(self, environment: str) -> tuple[str, ...]:
        """Flags for a pipeline run in `self.netns` against this Prism.

        - "loopback": `--runner=PrismRunner --prism_location=BINARY`, Beam's own way: the
          launching process starts its own Prism and runs the SDK harness in-process (LOOPBACK,
          PrismRunner's default). This server is not used.
        - "external": this Prism server, with user code in this worker pool's processes.
        - "direct": none, so the default `--runner=DirectRunner` with no running-mode flags, run
          with HOME where `install_prism_in_beam_cache` put Prism (where Beam's own DirectRunner
          would start it).
        """
        if environment == "direct":
            return ()
        if environment == "loopback":
            return ("--runner=PrismRunner", f"--prism_location={prism_binary()}")
        return ("--runner=PortableRunner", f"--job_endpoint={self.job_endpoint}",
                "--environment_type=EXTERNAL", f"--environment_config=localhost:{self.worker_pool.port}")


@contextlib.contextmanager
def prism_engine(log_dir: pathlib.Path, timeout: float = 60) -> Iterator[PrismEngine]:
    binary = prism_binary()
    if not binary.exists():
        raise FileNotFoundError(f"{binary} is missing: run `python -m tests.engines.fetch` (make test-engines does)")
    env = subprocess_env()
    with services_stopped_on_exit() as started, loopback_netns(log_dir, started) as netns:
        job_port = free_port()
        started.append(start_command(
            "prism", netns.wrap([binary, f"--job_port={job_port}", "--serve_http=false", "--log_kind=text"]),
            log_dir, env, ready=lambda: netns.accepts_connections(job_port), timeout=timeout, port=job_port))
        pool_port = free_port()
        started.append(start_command(
            "worker_pool", netns.wrap([sys.executable, "-m", IMGREC_WORKER_POOL_MODULE, f"--service_port={pool_port}"]),
            log_dir, env, ready=lambda: netns.accepts_connections(pool_port), timeout=timeout, port=pool_port))
        yield PrismEngine(netns, started[-2], started[-1])


# --- Flink session cluster ------------------------------------------------------------------------

@dataclasses.dataclass
class FlinkCluster:
    rest_port: int
    conf_dir: pathlib.Path
    slots: int
    started: list[Service]  # the JobManager, then every TaskManager started; all stopped on exit
    start_worker: Callable[[], Service]  # one more TaskManager (after kill_worker, its replacement)
    netns: Netns

    @property
    def master(self) -> str:
        """What Beam calls the Flink master: the JobManager's REST address."""
        return f"127.0.0.1:{self.rest_port}"

    @property
    def services(self) -> list[Service]:
        return list(self.started)

    def workers(self) -> int:
        return len(self.taskmanagers())

    def taskmanagers(self) -> list[dict]:
        return self.netns.http_json(f"http://{self.master}/taskmanagers")["taskmanagers"]

    def kill_worker(self) -> None:
        """kill -9 the newest TaskManager's JVM."""
        kill_hard(self.started[-1])

    def jobs_running(self) -> int:
        jobs = self.netns.http_json(f"http://{self.master}/jobs/overview")["jobs"]
        return sum(1 for job in jobs if job["state"] not in ("FINISHED", "FAILED", "CANCELED"))


def kill_hard(service: Service) -> None:
    """SIGKILL to a service's own process (a JVM: the start scripts exec it), not its group."""
    os.kill(service.process.pid, signal.SIGKILL)
    service.process.wait(timeout=30)


def flink_config(ports: Mapping[str, int], tmp_dir: pathlib.Path, slots: int) -> dict:
    """A one-machine session cluster: everything on 127.0.0.1, on the given (free) ports."""
    shipped = yaml.safe_load((flink_home() / "conf" / "config.yaml").read_text())
    return {
        # Flink's own config.yaml sets these JVM flags for Java 17 (--add-opens/--add-exports).
        "env": {"java": {"opts": {"all": shipped["env"]["java"]["opts"]["all"]}}},
        "jobmanager": {"bind-host": "127.0.0.1", "rpc": {"address": "127.0.0.1", "port": ports["jm_rpc"]},
                       "memory": {"process": {"size": "1024m"}}},
        # Each TaskManager gets its own rpc and data ports (start_taskmanager).
        "taskmanager": {"bind-host": "127.0.0.1", "host": "127.0.0.1", "numberOfTaskSlots": slots,
                        # Beam's batch stages read many inputs at once (a Flatten of 8 is one task
                        # with 8 input gates): 2 slots need more than the default 10% for buffers.
                        "memory": {"process": {"size": "1536m"}, "network": {"min": "256m", "max": "256m"}}},
        # A killed TaskManager is noticed in seconds (default: 50 s), which the fault test waits for.
        "heartbeat": {"interval": 2000, "timeout": 10000},
        "rest": {"address": "127.0.0.1", "bind-address": "127.0.0.1", "port": ports["rest"]},
        "blob": {"server": {"port": ports["blob"]}},
        "parallelism": {"default": slots},
        "io": {"tmp": {"dirs": str(tmp_dir)}},
    }


def write_flink_conf(conf_dir: pathlib.Path, tmp_dir: pathlib.Path, slots: int = 2) -> dict[str, int]:
    ports = {name: free_port() for name in ("jm_rpc", "rest", "blob")}
    conf_dir.mkdir(parents=True, exist_ok=True)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    config = flink_config(ports, tmp_dir, slots)
    (conf_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False, width=1 << 16))
    for name in ("log4j-console.properties", "log4j.properties"):
        shutil.copy(flink_home() / "conf" / name, conf_dir / name)
    return ports


@contextlib.contextmanager
def flink_cluster(work_dir: pathlib.Path, netns: Netns = HOST_NETNS, timeout: float = 120,
                  slots: int = 2) -> Iterator[FlinkCluster]:
    """A JobManager and one TaskManager (`slots` slots) started with Flink's own scripts
    (`bin/jobmanager.sh start-foreground`, `bin/taskmanager.sh start-foreground`), in `netns`."""
    home = flink_home()
    if not (home / "bin" / "jobmanager.sh").exists():
        raise FileNotFoundError(f"{home} is missing: run `python -m tests.engines.fetch` (make test-engines does)")
    conf_dir, log_dir = work_dir / "flink-conf", work_dir / "flink-log"
    ports = write_flink_conf(conf_dir, work_dir / "flink-tmp", slots)
    env = {**os.environ, "FLINK_CONF_DIR": str(conf_dir), "FLINK_LOG_DIR": str(log_dir)}
    rest = f"http://127.0.0.1:{ports['rest']}"
    with services_stopped_on_exit() as started:
        started.append(start_command(
            "jobmanager", netns.wrap([home / "bin" / "jobmanager.sh", "start-foreground"]), log_dir, env,
            ready=lambda: "taskmanagers" in netns.http_json(f"{rest}/overview"), timeout=timeout, port=ports["rest"]))

        def start_taskmanager() -> Service:
            """A TaskManager on fresh ports, ready once the JobManager lists it."""
            rpc, data = free_port(), free_port()
            count = sum(1 for s in started if s.name.startswith("taskmanager"))
            service = start_command(
                f"taskmanager-{count}" if count else "taskmanager",
                netns.wrap([home / "bin" / "taskmanager.sh", "start-foreground", "-D", f"taskmanager.rpc.port={rpc}",
                            "-D", f"taskmanager.data.port={data}"]), log_dir, env,
                ready=lambda: any(tm["id"].startswith(f"127.0.0.1:{rpc}-") for tm in
                                  netns.http_json(f"{rest}/taskmanagers")["taskmanagers"]),
                timeout=timeout, port=rpc)
            started.append(service)
            return service

        start_taskmanager()
        yield FlinkCluster(ports["rest"], conf_dir, slots, started, start_taskmanager, netns)


@contextlib.contextmanager
def cluster(engine: str, work_dir: pathlib.Path, netns: Netns = HOST_NETNS, attempts: int = 2) -> Iterator:
    """flink_cluster or spark_cluster: a value with .master, .services and .workers() (the number
    of registered workers).

    A start that fails is tried again (in a fresh folder, on fresh ports) up to `attempts` times
    in all, with a warning that holds the failure: a JVM on a loaded machine can miss its
    deadline, and the engine tests are about imgrec on the engine, not about its start-up.
    """
    start = flink_cluster if engine == "flink" else spark_cluster
    for attempt in range(1, attempts + 1):
        with contextlib.ExitStack() as stack:
            try:
                running = stack.enter_context(start(work_dir if attempt == 1 else work_dir / f"attempt-{attempt}",
                                                    netns))
            except ServiceFailed as failure:
                if attempt == attempts:
                    raise
                warnings.warn(f"{engine} did not start (attempt {attempt} of {attempts}), trying again: "
                              f"{brief(str(failure))}", stacklevel=3)  # the caller's `with`
                continue
            yield running
            return


# --- Spark standalone cluster ----------------------------------------------------------------------

@dataclasses.dataclass
class SparkCluster:
    port: int
    webui_port: int
    started: list[Service]  # the Master, then every Worker started; all stopped on exit
    start_worker: Callable[[], Service]  # one more Worker (after kill_worker, its replacement)
    netns: Netns

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def services(self) -> list[Service]:
        return list(self.started)

    def workers(self) -> int:
        return self.status()["aliveworkers"]

    def status(self) -> dict:
        return self.netns.http_json(f"http://127.0.0.1:{self.webui_port}/json/")

    def kill_worker(self) -> None:
        """kill -9 the newest Worker's JVM (its executors notice and exit)."""
        kill_hard(self.started[-1])

    def jobs_running(self) -> int:
        """Applications the Master runs (Beam's Spark job server starts one per job)."""
        return len(self.status()["activeapps"])


@contextlib.contextmanager
def spark_cluster(work_dir: pathlib.Path, netns: Netns = HOST_NETNS, timeout: float = 120, cores: int = 2,
                  memory: str = "2g") -> Iterator[SparkCluster]:
    """A standalone Master and one Worker started with `bin/spark-class` (as `sbin/start-*.sh`
    would, but in the foreground so that they are our child processes)."""
    home = spark_home()
    spark_class = home / "bin" / "spark-class"
    if not spark_class.exists():
        raise FileNotFoundError(f"{home} is missing: run `python -m tests.engines.fetch` (make test-engines does)")
    log_dir, conf_dir = work_dir / "spark-log", work_dir / "spark-conf"
    conf_dir.mkdir(parents=True, exist_ok=True)  # empty: no spark-defaults.conf or spark-env.sh from elsewhere
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_CONF_DIR": str(conf_dir), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOCAL_DIRS": str(work_dir / "spark-tmp"), "SPARK_LOG_DIR": str(log_dir)}
    port, webui = free_port(), free_port()
    status = lambda: netns.http_json(f"http://127.0.0.1:{webui}/json/")  # noqa: E731
    with services_stopped_on_exit() as started:
        started.append(start_command(
            "spark-master", netns.wrap([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                        "--port", port, "--webui-port", webui]),
            log_dir, env, ready=lambda: status()["status"] == "ALIVE", timeout=timeout, port=port))

        def start_worker() -> Service:
            """A Worker on fresh ports, ready once the Master lists it alive."""
            worker_port, worker_webui = free_port(), free_port()
            count = sum(1 for s in started if s.name.startswith("spark-worker"))
            service = start_command(
                f"spark-worker-{count}" if count else "spark-worker",
                netns.wrap([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                            "--port", worker_port, "--webui-port", worker_webui, "--cores", cores, "--memory", memory,
                            "--work-dir", work_dir / "spark-work", f"spark://127.0.0.1:{port}"]),
                log_dir, env, timeout=timeout, port=worker_port,
                ready=lambda: any(w["port"] == worker_port and w["state"] == "ALIVE" for w in status()["workers"]))
            started.append(service)
            return service

        start_worker()
        yield SparkCluster(port, webui, started, start_worker, netns)


# --- Beam's job servers (Java) for Flink and Spark, with a Python worker pool ------------------------

@dataclasses.dataclass
class PortableEngine:
    """A Beam job server in front of a cluster, and the EXTERNAL worker pool for Python code."""

    job_server: Service
    worker_pool: Service

    def runner_flags(self) -> tuple[str, ...]:
        return ("--runner=PortableRunner", f"--job_endpoint=127.0.0.1:{self.job_server.port}",
                "--environment_type=EXTERNAL", f"--environment_config=127.0.0.1:{self.worker_pool.port}")


def loopback_flags(engine: str, running: "FlinkCluster | SparkCluster", jar: pathlib.Path) -> tuple[str, ...]:
    """Beam's own FlinkRunner or SparkRunner with the job-server jar `make engines` built: Beam
    starts the job server for the run, and the Python code runs in the launching process
    (LOOPBACK). What docs/runners.md gives users whose network has only a Maven mirror."""
    if engine == "flink":
        return ("--runner=FlinkRunner", f"--flink_master={running.master}", f"--flink_version={FLINK_MINOR}",
                f"--flink_job_server_jar={jar}", "--environment_type=LOOPBACK", f"--parallelism={running.slots}")
    return ("--runner=SparkRunner", f"--spark_master_url={running.master}", f"--spark_job_server_jar={jar}",
            "--environment_type=LOOPBACK")


# What Spark's launcher adds for Java 17 (JavaModuleOptions); `java -jar` adds nothing by itself.
SPARK_JAVA17_OPTIONS = tuple(f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in (
    "java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net", "java.nio", "java.util",
    "java.util.concurrent", "java.util.concurrent.atomic", "jdk.internal.ref", "sun.nio.ch", "sun.nio.cs",
    "sun.security.action", "sun.util.calendar"))


def job_server_command(engine: str, jar: pathlib.Path, cluster: "FlinkCluster | SparkCluster", ports: Mapping[str, int],
                       artifacts_dir: pathlib.Path) -> list[str]:
    """`java -jar` Beam's Flink or Spark job server, serving on 127.0.0.1, for `cluster`. A Flink
    job server reads the cluster's config.yaml, as Flink's own client does: jobs get its default
    parallelism (one task per slot) unless the pipeline sets --parallelism."""
    if engine == "flink":  # slf4j-simple logs without a time unless told
        java_options = ["-Dorg.slf4j.simpleLogger.showDateTime=true",
                        "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS"]
        master_flags = [f"--flink-master={cluster.master}", f"--flink-conf-dir={cluster.conf_dir}"]
    else:
        java_options = ["-XX:+IgnoreUnrecognizedVMOptions", *SPARK_JAVA17_OPTIONS]
        master_flags = [f"--spark-master-url={cluster.master}"]
    return ["java", *java_options, "-jar", str(jar), "--job-host=127.0.0.1", f"--job-port={ports['job']}",
            f"--artifact-port={ports['artifact']}", f"--expansion-port={ports['expansion']}",
            f"--artifacts-dir={artifacts_dir}", *master_flags]


@contextlib.contextmanager
def job_server(engine: str, jar: pathlib.Path, cluster: "FlinkCluster | SparkCluster", log_dir: pathlib.Path,
               timeout: float = 120) -> Iterator[PortableEngine]:
    """Beam's job server for `engine` plus an EXTERNAL worker pool (which the cluster's workers
    reach: on one machine, they do), in the cluster's network namespace: Beam's Java servers
    listen on every interface whatever --job-host says (its ServerFactory binds the port only)."""
    env = subprocess_env({"SPARK_LOCAL_IP": "127.0.0.1"})
    netns = cluster.netns
    ports = {name: free_port() for name in ("job", "artifact", "expansion", "pool")}
    with services_stopped_on_exit() as started:
        started.append(start_command(
            f"{engine}-job-server", netns.wrap(job_server_command(engine, jar, cluster, ports, log_dir / "artifacts")),
            log_dir, env, ready=lambda: netns.accepts_connections(ports["job"]), timeout=timeout, port=ports["job"]))
        started.append(start_command(
            "worker_pool", netns.wrap([sys.executable, "-m", IMGREC_WORKER_POOL_MODULE,
                                       f"--service_port={ports['pool']}", "--host=127.0.0.1"]),
            log_dir, env, ready=lambda: netns.accepts_connections(ports["pool"]), timeout=timeout,
            port=ports["pool"]))
        yield PortableEngine(started[0], started[1])


# --- running imgrec ------------------------------------------------------------------------------------

@dataclasses.dataclass
class PipelineRun:
    argv: list[str]
    returncode: int
    seconds: float
    log: pathlib.Path
    survivors: list[int]

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def run_imgrec(flags: Sequence[str], log_path: pathlib.Path, netns: Optional[Netns] = None,
               timeout: float = 900, env: Optional[Mapping[str, str]] = None,
               terminate_when: Optional[Callable[[], bool]] = None,
               meanwhile: Optional[Callable[[], bool]] = None) -> PipelineRun:
    """`python -m pipeline.run FLAGS` as a subprocess (in its own process group, in `netns`
    if given); waits for it, then kills and reports any process it left behind. With
    `terminate_when`, SIGTERM goes to the driver as soon as that turns true (a scheduler's timeout).
    `meanwhile` is called while the driver runs until it returns True (it did what it waits for:
    kill a worker in the middle of the conversion, say)."""
    argv = [sys.executable, "-m", "pipeline.run", *flags]
    wrapped = netns.wrap(argv) if netns else argv  # nsenter execs: the pid is the driver's
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(wrapped, cwd=REPO, env=dict(env or subprocess_env()), stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        service = Service("imgrec", 0, process, log_path, log_path)
        try:
            while (terminate_when or meanwhile) and process.poll() is None and time.monotonic() - started < timeout:
                if terminate_when is not None and terminate_when():
                    process.terminate()
                    break
                if meanwhile is not None and meanwhile():
                    meanwhile = None
                time.sleep(0.01)
            returncode = process.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            returncode = -9
        finally:
            seconds = time.monotonic() - started
            wait_for_group_exit(process.pid, 10)  # Beam stops the Prism it started on exit
            survivors = live_group_members(process.pid)
            stop_service(service)
    return PipelineRun(argv, returncode, seconds, log_path, survivors)
