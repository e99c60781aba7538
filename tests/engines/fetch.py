"""Gets the engines the engine tests start, from nothing, with the ordinary clients, into caches.

    python -m tests.engines.fetch [prism] [flink] [spark] [jobservers]   # default: all of them

- Prism: `go install github.com/apache/beam/sdks/v2/go/cmd/prism@v<apache-beam version>` with
  GOBIN=$CACHE/prism-v<version> (sources stay in the Go module cache).
- Flink: PyPI's apache-flink-libraries (an sdist holding flink-dist and lib/) and apache-flink
  (a wheel holding bin/ and conf/), fetched with `pip download --no-deps` (never installed:
  apache-flink pins an old apache-beam), unpacked into $CACHE/flink-<version> as a Flink
  distribution (bin/ conf/ lib/ opt/ plugins/).
- Spark: PyPI's pyspark 3.5 sdist, `pip download --no-deps`, whose deps/{bin,sbin,jars} make
  $CACHE/spark-<version>.
- Beam's Flink and Spark job servers: `mvn -B package` of the Maven project in engines/ (the
  runner modules from Maven Central, shaded into runnable jars; Maven keeps what it downloads
  in ~/.m2), moved to $CACHE/job-servers/<digest of the poms>/, which $CACHE/job-servers/current
  links to (the path docs/runners.md gives users). Flags for Maven (`-o` to build
  offline from ~/.m2, `-Dmaven.repo.local=DIR`) come from $IMGREC_MVN_FLAGS.

The versions are engines/pom.xml's. What is already there is kept. $CACHE is
$IMGREC_ENGINES_CACHE or ~/.cache/imgrec-engines; the versions, where each came from, and how
long each step took go to $CACHE/versions.json.
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

from tests.engines.engines import (
    BEAM_VERSION,
    CACHE,
    ENGINES_POM,
    FLINK_VERSION,
    JOB_SERVER_BEAM_VERSION,
    JOB_SERVER_JARS,
    PRISM_PACKAGE,
    SPARK_VERSION,
    flink_home,
    job_servers_dir,
    prism_binary,
    spark_home,
)


class FetchFailed(RuntimeError):
    pass


def run(argv: list[str], env: dict | None = None, cwd: pathlib.Path | None = None) -> str:
    print("+", " ".join(argv), flush=True)
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False)
    if done.returncode != 0:
        raise FetchFailed(f"{' '.join(argv)} exited with {done.returncode}:\n{done.stdout[-4000:]}")
    return done.stdout


def tool_version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False).stdout
    except FileNotFoundError:
        return "missing"
    return next((line.strip() for line in out.splitlines() if line.strip()), "")


def pip_download(dest: pathlib.Path, *args: str) -> pathlib.Path:
    """`pip download --no-deps`; returns the one file it saved (pip's own cache keeps a copy)."""
    before = set(dest.iterdir())
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--dest", str(dest),
         *args])
    new = sorted(set(dest.iterdir()) - before)
    if len(new) != 1:
        raise FetchFailed(f"pip download {' '.join(args)} saved {new}")
    return new[0]


def archive_root(archive: pathlib.Path, member: str) -> str:
    """The folder inside a tar archive that holds `member` (a relative path ending its name):
    sdists name their top folder apache-flink-libraries-V or apache_flink_libraries-V."""
    with tarfile.open(archive) as tar:
        for name in tar.getnames():
            if name.endswith("/" + member):
                return name[:-len(member)]
    raise FetchFailed(f"no {member} in {archive.name}")


def extract_tar(archive: pathlib.Path, prefix: str, target: pathlib.Path) -> None:
    """Members under `prefix` (a folder inside the archive), written below target."""
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.name.startswith(prefix) or not (member.isfile() or member.isdir()):
                continue
            dest = target / member.name[len(prefix):].lstrip("/")
            if member.isdir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            dest.chmod(member.mode & 0o777 | stat.S_IRUSR | stat.S_IWUSR)


def extract_zip(archive: pathlib.Path, prefix: str, target: pathlib.Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            if info.filename.startswith(prefix) and not info.is_dir():
                dest = target / info.filename[len(prefix):]
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)


def make_executable(folder: pathlib.Path) -> None:
    for path in folder.iterdir():
        if path.is_file() and path.suffix not in (".cmd", ".bat", ".jar"):
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def install_atomically(build, target: pathlib.Path) -> None:
    """build(staging_dir) fills a fresh folder next to target, which then becomes target."""
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(staging)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch_prism() -> dict:
    binary = prism_binary()
    info = {"package": f"{PRISM_PACKAGE}@v{BEAM_VERSION}", "binary": str(binary), "go": tool_version(["go", "version"])}
    if binary.exists():
        return {**info, "status": "cached"}
    if not shutil.which("go"):
        raise FetchFailed("Prism is built with Go (`go install`), and `go` is not on PATH")
    env = {**os.environ, "GOBIN": str(binary.parent)}
    run(["go", "install", f"{PRISM_PACKAGE}@v{BEAM_VERSION}"], env=env)
    return {**info, "status": "built"}


def fetch_flink(downloads: pathlib.Path) -> dict:
    home = flink_home()
    info = {"version": FLINK_VERSION, "home": str(home),
            "from": [f"pypi apache-flink-libraries=={FLINK_VERSION} (sdist: lib/, opt/, plugins/)",
                     f"pypi apache-flink=={FLINK_VERSION} (wheel: bin/, conf/)"]}
    if (home / "bin" / "jobmanager.sh").exists():
        return {**info, "status": "cached"}
    libraries = pip_download(downloads, "--no-binary=:all:", f"apache-flink-libraries=={FLINK_VERSION}")
    # Only bin/ and conf/ of the wheel are used, and they are the same in every wheel: ask for
    # one fixed wheel rather than whatever matches this interpreter (cp38-cp311 only).
    wheel = pip_download(downloads, "--only-binary=:all:", "--platform=manylinux2014_x86_64",
                         "--python-version=3.11", "--implementation=cp", "--abi=cp311",
                         f"apache-flink=={FLINK_VERSION}")

    root = archive_root(libraries, f"deps/lib/flink-dist-{FLINK_VERSION}.jar") + "deps/"

    def build(staging: pathlib.Path) -> None:
        for part in ("lib", "opt", "plugins"):
            extract_tar(libraries, root + part, staging / part)
        extract_tar(libraries, root + "bin", staging / "bin")  # bash-java-utils.jar
        extract_zip(wheel, "pyflink/bin/", staging / "bin")
        extract_zip(wheel, "pyflink/conf/", staging / "conf")
        make_executable(staging / "bin")
        if not (staging / "lib" / f"flink-dist-{FLINK_VERSION}.jar").exists():
            raise FetchFailed(f"no flink-dist-{FLINK_VERSION}.jar in {libraries.name}")
    install_atomically(build, home)
    return {**info, "status": "downloaded"}


def fetch_spark(downloads: pathlib.Path) -> dict:
    home = spark_home()
    info = {"version": SPARK_VERSION, "home": str(home), "from": f"pypi pyspark=={SPARK_VERSION} (sdist: deps/)"}
    if (home / "bin" / "spark-class").exists():
        return {**info, "status": "cached"}
    sdist = pip_download(downloads, "--no-binary=:all:", f"pyspark=={SPARK_VERSION}")

    def build(staging: pathlib.Path) -> None:
        root = f"pyspark-{SPARK_VERSION}/deps/"
        for part in ("bin", "sbin", "jars"):
            extract_tar(sdist, root + part, staging / part)
        make_executable(staging / "bin")
        make_executable(staging / "sbin")
        # bin/spark-class takes jars/ from a binary distribution's layout, marked by RELEASE.
        (staging / "RELEASE").write_text(f"Spark {SPARK_VERSION} (from PyPI pyspark=={SPARK_VERSION})\n")
        if not list((staging / "jars").glob(f"spark-core_*-{SPARK_VERSION}.jar")):
            raise FetchFailed(f"no spark-core jar in {sdist.name}")
    install_atomically(build, home)
    return {**info, "status": "downloaded"}


def fetch_job_servers() -> dict:
    """Both job servers from one `mvn package` of engines/, unless this build of the poms is cached."""
    target = job_servers_dir()
    info = {"beam": JOB_SERVER_BEAM_VERSION, "dir": str(target), "jars": sorted(JOB_SERVER_JARS.values()),
            "from": f"mvn package of {ENGINES_POM.parent.name}/ (Maven Central, cached in ~/.m2)"}
    if all((target / name).is_file() for name in JOB_SERVER_JARS.values()):
        link_current(target)
        return {**info, "status": "cached"}
    if not shutil.which("mvn"):
        raise FetchFailed("Beam's job servers are built with Maven (`mvn`), which is not on PATH")
    argv = ["mvn", "-B", "-q", *shlex.split(os.environ.get("IMGREC_MVN_FLAGS", "")), "-f", str(ENGINES_POM),
            "package"]
    run(argv, cwd=ENGINES_POM.parent)
    target.parent.mkdir(parents=True, exist_ok=True)

    def build(staging: pathlib.Path) -> None:
        for engine, name in JOB_SERVER_JARS.items():
            shutil.move(ENGINES_POM.parent / engine / "target" / name, staging / name)
    install_atomically(build, target)
    link_current(target)
    for older in target.parent.iterdir():  # builds of earlier poms: 450 MB each
        if older not in (target, current_link(target)) and not older.name.startswith("."):
            shutil.rmtree(older, ignore_errors=True)
    return {**info, "command": " ".join(argv), "status": "built"}


def current_link(build: pathlib.Path) -> pathlib.Path:
    return build.parent / "current"


def link_current(build: pathlib.Path) -> None:
    """Points job-servers/current at `build` (replacing the link in one rename)."""
    link = current_link(build)
    if link.is_symlink() and os.readlink(link) == build.name:
        return
    staging = link.with_name(".current.tmp")
    staging.unlink(missing_ok=True)
    staging.symlink_to(build.name)
    staging.replace(link)


def main(argv: list[str]) -> int:
    known = ("prism", "flink", "spark", "jobservers")
    if set(argv) - set(known):
        print(f"usage: python -m tests.engines.fetch [{'] ['.join(known)}]", file=sys.stderr)
        return 2
    wanted = set(argv) or set(known)
    CACHE.mkdir(parents=True, exist_ok=True)
    report_path = CACHE / "versions.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report.update({"apache_beam": BEAM_VERSION, "python": platform.python_version(),
                   "java": tool_version(["java", "-version"]),
                   "maven": re.sub(r"\x1b\[[0-9;]*m", "", tool_version(["mvn", "-v"])),
                   "cache": str(CACHE)})
    failures = []
    with tempfile.TemporaryDirectory(prefix=".downloads-", dir=CACHE) as tmp:
        downloads = pathlib.Path(tmp)
        steps = [("prism", fetch_prism), ("flink", lambda: fetch_flink(downloads)),
                 ("spark", lambda: fetch_spark(downloads)), ("jobservers", fetch_job_servers)]
        for name, step in steps:
            if name not in wanted:
                continue
            started = time.monotonic()
            try:
                result = step()
            except FetchFailed as failure:
                failures.append(name)
                result = {"status": "failed", "error": str(failure)[-2000:]}
                print(f"{name}: FAILED\n{failure}", file=sys.stderr, flush=True)
            result["seconds"] = round(time.monotonic() - started, 1)
            report[name] = result
            print(f"{name}: {result['status']} in {result['seconds']} s", flush=True)
    report_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"versions and sources: {report_path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
