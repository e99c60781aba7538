"""Helpers for the black-box trust tests (issue 8): real files, real subprocesses, real runners.

Nothing here imports pipeline/ or transforms/: the tests talk to imgrec only through its
command line (`python -m pipeline.run`, `python -m pipeline.inspect`) and the files it writes.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from typing import Iterable, Optional, Sequence

import cv2
import numpy as np
import psutil

REPO = pathlib.Path(__file__).resolve().parents[1]
PYTHON = sys.executable
IN_MEMORY = ("--runner=DirectRunner", "--direct_running_mode=in_memory")
MULTI_PROCESSING = ("--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2")
GiB = 2**30
ERROR_PREFIX = "imgrec: error: "


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e["PATH"] = f"{pathlib.Path(PYTHON).parent}{os.pathsep}{e.get('PATH', '')}"
    e.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return e


# ------------------------------------------------------------------------------------------
# Inputs


def write_image(path: pathlib.Path, seed: int, size: tuple[int, int] = (32, 32)) -> bytes:
    """A small distinct image, encoded by the path's suffix (.jpg/.png/...); returns its bytes."""
    rng = np.random.default_rng(seed)
    base = cv2.resize(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), size[::-1], interpolation=cv2.INTER_CUBIC)
    encodable = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
    suffix = path.suffix if path.suffix.lower() in encodable else ".png"
    ok, buf = cv2.imencode(suffix, base)
    assert ok
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.tobytes())
    return buf.tobytes()


_seed = [1000]


def next_seed() -> int:
    _seed[0] += 1
    return _seed[0]


def make_tree(root: pathlib.Path, classes: dict[str, int], size: tuple[int, int] = (32, 32),
              prefix: str = "") -> list[pathlib.Path]:
    """root/<class>/<prefix><class>_<i>.jpg|png, every image distinct (unique names across classes)."""
    paths = []
    for name, count in classes.items():
        for i in range(count):
            path = root / name / f"{prefix}{name}_{i:04d}{'.png' if i % 3 == 0 else '.jpg'}"
            write_image(path, seed=next_seed(), size=size)
            paths.append(path)
    return paths


def write_png_rows(path: pathlib.Path, width: int, height: int, bit_depth: int, color_type: int) -> None:
    """A valid all-zero PNG of any declared size, compressed row by row (never held in memory)."""
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[color_type]
    row = b"\x00" + bytes(width * channels * bit_depth // 8)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor = zlib.compressobj(9)
    parts = []
    for _ in range(height):
        parts.append(compressor.compress(row))
    parts.append(compressor.flush())
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"".join(parts))
                     + chunk(b"IEND", b""))


def write_csv(path: pathlib.Path, header: Optional[str], rows: Iterable[tuple[str, str]]) -> pathlib.Path:
    lines = ([header] if header is not None else []) + [f"{p},{label}" for p, label in rows]
    path.write_text("".join(line + "\n" for line in lines))
    return path


# ------------------------------------------------------------------------------------------
# Running imgrec


@dataclasses.dataclass
class Run:
    args: list
    returncode: Optional[int]
    stdout: str
    stderr: str
    elapsed: float
    peak_rss: int            # bytes, whole process tree, sampled
    timed_out: bool
    killed_for_memory: bool
    pid: int

    def brief(self) -> str:
        tail = "\n".join(line[:240] for line in self.stderr.strip().splitlines()[-12:])
        return (f"rc={self.returncode} timed_out={self.timed_out} killed_for_memory={self.killed_for_memory} "
                f"elapsed={self.elapsed:.1f}s peak_rss={self.peak_rss / 2**20:.0f}MiB\n"
                f"stdout tail: {self.stdout.strip()[-500:]}\nstderr tail:\n{tail}")


def tree(process: psutil.Process) -> list[psutil.Process]:
    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return [process]


def tree_rss(processes: Sequence[psutil.Process]) -> int:
    total = 0
    for p in processes:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def kill_all(processes: Iterable[psutil.Process]) -> None:
    """SIGKILL each process we started (by pid, via psutil so a reused pid is never hit)."""
    for p in processes:
        try:
            p.kill()
        except psutil.Error:
            pass


class Watched:
    """A started command whose process tree is sampled (RSS, descendants) until it ends."""

    def __init__(self, argv: Sequence[str], cwd: pathlib.Path = REPO, rss_limit: Optional[int] = None):
        self.argv = list(argv)
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self.began = time.monotonic()
        self.popen = subprocess.Popen(self.argv, cwd=cwd, env=env(), stdout=self._out, stderr=self._err)
        self.root = psutil.Process(self.popen.pid)
        self.seen: dict[int, psutil.Process] = {self.popen.pid: self.root}
        self.peak, self.rss_limit = 0, rss_limit
        self.timed_out = self.killed_for_memory = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def sample(self) -> bool:
        """Records the tree's RSS and members; kills it when over the memory limit. True while running."""
        if self.popen.poll() is not None:
            return False
        procs = tree(self.root)
        for p in procs:
            self.seen.setdefault(p.pid, p)
        self.peak = max(self.peak, tree_rss(procs))
        if self.rss_limit is not None and self.peak > self.rss_limit:
            self.killed_for_memory = True
            self.kill()
            return False
        return True

    def kill(self) -> None:
        kill_all(self.seen.values())
        self.popen.wait()

    def finish(self, timeout: float) -> Run:
        while self.sample():
            if time.monotonic() - self.began > timeout:
                self.timed_out = True
                self.kill()
                break
            time.sleep(0.05)
        self.popen.wait()
        elapsed = time.monotonic() - self.began
        kill_all(p for p in self.seen.values() if p.pid != self.popen.pid)  # nothing of ours may linger
        self._out.seek(0)
        self._err.seek(0)
        run = Run(self.argv, self.popen.returncode, self._out.read().decode("utf-8", "replace"),
                  self._err.read().decode("utf-8", "replace"), elapsed, self.peak, self.timed_out,
                  self.killed_for_memory, self.popen.pid)
        self._out.close()
        self._err.close()
        return run


def finish_all(watched: Sequence[Watched], timeout: float) -> list[Run]:
    """Waits for several concurrent commands, sampling all of them."""
    while any([w.sample() for w in watched]):
        if any(time.monotonic() - w.began > timeout for w in watched):
            break
        time.sleep(0.05)
    return [w.finish(timeout) for w in watched]


def module_argv(module: str, args: Sequence[str]) -> list[str]:
    return [PYTHON, "-m", module, *args]


def imgrec_argv(input_path, output, *flags: str, runner: Sequence[str] = IN_MEMORY) -> list[str]:
    args = [*runner]
    if input_path is not None:
        args.append(f"--input={input_path}")
    if output is not None:
        args.append(f"--output={output}")
    return module_argv("pipeline.run", [*args, *flags])


def run_module(module: str, args: Sequence[str], *, timeout: float = 90, rss_limit: Optional[int] = None,
               cwd: pathlib.Path = REPO) -> Run:
    """Runs `python -m module args` to the end, sampling the process tree's RSS; a run that
    exceeds `timeout` or `rss_limit` is killed (with all its descendants) and reported as such."""
    return Watched(module_argv(module, args), cwd, rss_limit).finish(timeout)


def run_imgrec(input_path, output, *flags: str, runner: Sequence[str] = IN_MEMORY, timeout: float = 90,
               rss_limit: Optional[int] = None) -> Run:
    return Watched(imgrec_argv(input_path, output, *flags, runner=runner), rss_limit=rss_limit).finish(timeout)


def run_inspect(output, *flags: str, **kwargs) -> Run:
    return run_module("pipeline.inspect", [str(output), *flags], **kwargs)


def error_line(run: Run) -> str:
    """The one `imgrec: error: ` line a refusal prints to stderr (no traceback)."""
    assert "Traceback" not in run.stderr, run.brief()
    lines = [line for line in run.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    assert len(lines) == 1, f"expected exactly one line starting with {ERROR_PREFIX!r}\n{run.brief()}"
    return lines[0]


# ------------------------------------------------------------------------------------------
# Reading what was published


def metadata_of(output: pathlib.Path) -> dict:
    return json.loads((pathlib.Path(output) / "metadata.json").read_text())


def dead_letters(output: pathlib.Path, metadata: dict) -> list[dict]:
    return [json.loads(line) for name in metadata["error_files"]
            for line in (pathlib.Path(output) / name).read_text().splitlines() if line.strip()]


def feature_key(metadata: dict, role: str) -> str:
    (key,) = [k for k, d in metadata["features"].items() if d.get("role") == role]
    return key


def read_examples(output: pathlib.Path, metadata: dict) -> dict[str, list]:
    """split → parsed tf.train.Example of every record, read with TensorFlow (CRCs checked)."""
    import tensorflow as tf

    compression = "GZIP" if metadata.get("compression") == "gzip" else ""
    found = {}
    for split, info in metadata["splits"].items():
        files = [str(pathlib.Path(output) / name) for name in info["files"]]
        for name in files:
            assert os.path.isfile(name), f"metadata lists {name}, which is missing"
        found[split] = [tf.train.Example.FromString(r.numpy())
                        for r in tf.data.TFRecordDataset(files, compression_type=compression)]
    return found


def bytes_feature(example, key: str) -> str:
    return example.features.feature[key].bytes_list.value[0].decode("utf-8", "replace")


def int_feature(example, key: str) -> int:
    return example.features.feature[key].int64_list.value[0]


def check_complete(output: pathlib.Path, metadata: Optional[dict] = None) -> tuple[dict, list, list[dict]]:
    """A finished dataset: every listed file exists, TF reads every record, counts reconcile.
    Returns (metadata, [(source path, label text, label id)], dead letters)."""
    output = pathlib.Path(output)
    metadata = metadata or metadata_of(output)
    examples = read_examples(output, metadata)
    rows = dead_letters(output, metadata)
    src, text, label = (feature_key(metadata, r) for r in ("source_path", "label_text", "label"))
    records = []
    for split, info in metadata["splits"].items():
        assert len(examples[split]) == info["num_examples"] == sum(info["shard_lengths"]), split
        assert info["rejected"] == sum(1 for r in rows if r.get("split") == split), split
        records += [(bytes_feature(e, src), bytes_feature(e, text), int_feature(e, label)) for e in examples[split]]
    inputs = metadata["inputs"]
    assert inputs["written"] == len(records)
    assert inputs["rejected"] == len(rows)
    assert inputs["total"] == inputs["written"] + inputs["rejected"]
    for record in records:
        assert metadata["label_map"][record[1]] == record[2], record
    return metadata, records, rows


def published_files(output: pathlib.Path) -> set[str]:
    """Names in OUTPUT that a reader sees (not hidden)."""
    return {p.name for p in pathlib.Path(output).iterdir() if not p.name.startswith(".")}


def nothing_published(output: pathlib.Path) -> bool:
    output = pathlib.Path(output)
    return not output.exists() or not (output / "metadata.json").exists() and not any(
        p.name.endswith((".tfrecord", ".tfrecord.gz")) or p.name.startswith("errors-") for p in output.iterdir())


def snapshot(root: pathlib.Path) -> dict[str, bytes]:
    """relative path → bytes (b'<dir>' for folders) of everything under root."""
    root = pathlib.Path(root)
    return {str(p.relative_to(root)): (b"<dir>" if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def exited_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid
