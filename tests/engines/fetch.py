"""Gets the engines the engine tests start, from nothing, with the ordinary clients, into caches.

    python -m tests.engines.fetch [prism] [flink] [spark] [jars]   # default: all of them

- Prism: `go install github.com/apache/beam/sdks/v2/go/cmd/prism@v<apache-beam version>` with
  GOBIN=$CACHE/prism-v<version> (sources stay in the Go module cache).
- Flink: PyPI's apache-flink-libraries (an sdist holding flink-dist and lib/) and apache-flink
  (a wheel holding bin/ and conf/), fetched with `pip download --no-deps` (never installed:
  apache-flink pins an old apache-beam), unpacked into $CACHE/flink-<version> as a Flink
  distribution (bin/ conf/ lib/ opt/ plugins/).
- Spark: PyPI's pyspark 3.5 sdist, `pip download --no-deps`, whose deps/{bin,sbin,jars} make
  $CACHE/spark-<version>.
- Beam's Flink and Spark job servers: `mvn dependency:copy` of
  org.apache.beam:beam-runners-flink-<minor>-job-server and beam-runners-spark-3-job-server at the
  apache-beam version into $CACHE/jars (Maven keeps them in ~/.m2). Where Maven does not serve
  them, that is recorded and the tests that need them are skipped with the reason.

What is already there is kept. $CACHE is $IMGREC_ENGINES_CACHE or ~/.cache/imgrec-engines; the
versions, where each came from, and how long each step took go to $CACHE/versions.json.
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import re
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
    FLINK_JOB_SERVER,
    FLINK_VERSION,
    PRISM_PACKAGE,
    SPARK_JOB_SERVER,
    SPARK_VERSION,
    flink_home,
    maven_jar_path,
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

    def build(staging: pathlib.Path) -> None:
        root = f"apache_flink_libraries-{FLINK_VERSION}/deps/"
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


def fetch_jar(coordinates: str) -> dict:
    """`mvn dependency:copy` of one artifact (no transitive dependencies: job servers are shaded)."""
    target = maven_jar_path(coordinates)
    info = {"artifact": coordinates, "jar": str(target)}
    if target.exists():
        return {**info, "status": "cached"}
    if not shutil.which("mvn"):
        return {**info, "status": "unavailable", "error": "`mvn` is not on PATH"}
    argv = ["mvn", "-B", "-q", "-U", "dependency:copy", f"-Dartifact={coordinates}",
            f"-DoutputDirectory={target.parent}"]
    try:
        with tempfile.TemporaryDirectory() as empty:  # no pom.xml around: Maven's standalone project
            run(argv, cwd=pathlib.Path(empty))
    except FetchFailed as failure:
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in str(failure).splitlines()]
        errors = [line for line in lines if "ERROR" in line] or lines
        error = next((line for line in errors if "not found" in line or "Could not find" in line), errors[0])
        print(f"  {coordinates}: not available ({error.strip()[:300]})", flush=True)
        return {**info, "status": "unavailable", "command": " ".join(argv), "error": error.strip()}
    return {**info, "status": "downloaded"}


def main(argv: list[str]) -> int:
    wanted = set(argv) or {"prism", "flink", "spark", "jars"}
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
                 ("spark", lambda: fetch_spark(downloads))]
        steps += [(f"{name}_job_server", lambda c=c: fetch_jar(c))
                  for name, c in (("flink", FLINK_JOB_SERVER), ("spark", SPARK_JOB_SERVER))]
        for name, step in steps:
            if name.split("_")[0] not in wanted and not (name.endswith("job_server") and "jars" in wanted):
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
