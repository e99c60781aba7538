"""Helpers shared by the test modules: paths, small real image files, running the real pipeline
(in this process, or as `python -m pipeline.run` with its process tree watched) and reading what
it published back with TensorFlow. Fixtures live in conftest.py; this module has none.

The black-box tests (test_trust_*) use only the subprocess half and the dict view of metadata.json
(`metadata_of`, `check_complete`), so they see imgrec as a user does."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from typing import Callable, Iterable, Mapping, Optional, Sequence

import cv2
import numpy as np
import psutil

from transforms.dataset_format import METADATA_FILE, DatasetMetadata, tf_compression_type

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
# The 36 images of the sample (its two manifests at the root are not images).
SAMPLE_IMAGES = sorted(p for p in SAMPLE.glob("*/*") if p.is_file())
SAMPLE_CLASSES = ("cat", "coffee", "rocket")
SAMPLE_MANIFESTS = ("manifest.csv", "manifest.jsonl")

IN_MEMORY = ("--runner=DirectRunner", "--direct_running_mode=in_memory")
MULTI_PROCESSING = ("--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2")
GiB = 2**30
ERROR_PREFIX = "imgrec: error: "


def venv_first_on_path() -> None:
    """Beam's worker pools (the portable runner tests) and the converter pool start `python` from
    PATH: the interpreter running the tests must come first."""
    bin_dir = str(pathlib.Path(sys.executable).parent)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if parts[:1] != [bin_dir]:
        os.environ["PATH"] = os.pathsep.join([bin_dir, *(p for p in parts if p != bin_dir)])


def subprocess_env(extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """os.environ with the running interpreter's bin first on PATH, the repo on PYTHONPATH and
    TensorFlow's start-up lines off (unless the caller's environment sets them)."""
    env = dict(os.environ)
    bin_dir = str(pathlib.Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, *(p for p in env.get("PATH", "").split(os.pathsep)
                                              if p and p != bin_dir)])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                      if p and p != str(REPO))])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra or {})
    return env


# --------------------------------------------------------------------------------------------
# Running the pipeline and reading what it published


def metadata_of(output: os.PathLike | str) -> dict:
    """metadata.json as a user's program reads it."""
    return json.loads((pathlib.Path(output) / METADATA_FILE).read_text())


def read_metadata(output: os.PathLike | str) -> DatasetMetadata:
    """metadata.json parsed by imgrec's own format (so reading it also checks it)."""
    return DatasetMetadata.loads((pathlib.Path(output) / METADATA_FILE).read_text())


def run_pipeline(input_path: os.PathLike | str, output: os.PathLike | str, *flags: str,
                 runner: Sequence[str] = IN_MEMORY) -> DatasetMetadata:
    """Runs the real pipeline to completion and returns the metadata.json it published (parsed,
    so every run also checks the file against the format)."""
    from pipeline.run import convert

    conversion = convert([*runner, f"--input={input_path}", f"--output={output}", *flags])
    published = read_metadata(output)
    if conversion.unchanged_from is None:  # else the dataset was kept as it was
        assert conversion.metadata == published, "the run reported other metadata than it published"
    return published


def convert_sample(output: os.PathLike | str, *flags: str, runner: Sequence[str] = IN_MEMORY):
    """pipeline.run.convert on the sample: the `Conversion` (Beam result, metadata, engine)."""
    from pipeline.run import convert

    return convert([*runner, f"--input={SAMPLE}", f"--output={output}", *flags])


def read_records(output: os.PathLike | str, files: Iterable[str], compression: str) -> list[bytes]:
    """Every serialized record of `files` (names in `output`), read back with TensorFlow (CRCs checked)."""
    import tensorflow as tf

    paths = [str(pathlib.Path(output) / name) for name in files]
    for path in paths:
        assert os.path.isfile(path), f"metadata lists {path}, which is missing"
    return [bytes(r.numpy()) for r in tf.data.TFRecordDataset(paths, compression_type=tf_compression_type(compression))]


def read_split_records(output: os.PathLike | str, metadata: DatasetMetadata, split: str) -> list[bytes]:
    """Every serialized record of one split."""
    return read_records(output, metadata.splits[split].files, metadata.compression)


def records_by_split(output: os.PathLike | str, metadata: DatasetMetadata) -> dict[str, list[bytes]]:
    """Sorted records per split: the multiset that must not depend on runner or re-run."""
    return {split: sorted(read_split_records(output, metadata, split)) for split in metadata.splits}


def parse_records(records: Iterable[bytes], metadata: DatasetMetadata) -> list[dict]:
    """Records parsed with TensorFlow using the parse spec metadata.json describes."""
    import tensorflow as tf

    spec = {key: tf.io.FixedLenFeature((), tf.string if f["dtype"] == "string" else tf.int64)
            for key, f in metadata.features.items()}
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()} for r in records]


def dead_letters(output: os.PathLike | str) -> list[dict]:
    """Every dead letter of the dataset in `output` (the files its metadata.json lists)."""
    return [json.loads(line) for name in metadata_of(output)["error_files"]
            for line in (pathlib.Path(output) / name).read_text().splitlines() if line.strip()]


def visible_files(output: os.PathLike | str) -> set[str]:
    """Every file under `output` (relative, recursive), hidden staging and lock included."""
    root = pathlib.Path(output)
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def feature_key(metadata: dict, role: str) -> str:
    (key,) = [k for k, d in metadata["features"].items() if d.get("role") == role]
    return key


def read_examples(output: pathlib.Path, metadata: dict) -> dict[str, list]:
    """split → parsed tf.train.Example of every record, read with TensorFlow (CRCs checked)."""
    import tensorflow as tf

    return {split: [tf.train.Example.FromString(r)
                    for r in read_records(output, info["files"], metadata.get("compression", "none"))]
            for split, info in metadata["splits"].items()}


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
    rows = dead_letters(output)
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


def written_datasets(tmp_path_factory, common: Sequence[str],
                     layouts: Mapping[str, Sequence[str]]) -> Callable[[str], tuple[str, DatasetMetadata]]:
    """For module-scoped fixtures: layout name → (output dir, metadata) of the sample data
    converted with `common` + that layout's flags, each written once, on first use."""
    cache: dict[str, tuple[str, DatasetMetadata]] = {}

    def get(name: str) -> tuple[str, DatasetMetadata]:
        if name not in cache:
            output = tmp_path_factory.mktemp(name) / "out"
            cache[name] = (str(output), run_pipeline(SAMPLE, output, *common, *layouts[name]))
        return cache[name]
    return get


# --------------------------------------------------------------------------------------------
# Running `python -m pipeline.run` and friends, the process tree watched


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
    """A started command whose process tree is sampled (RSS, descendants) until it ends; `env`
    adds variables to its environment (which every process it starts inherits)."""

    def __init__(self, argv: Sequence[str], cwd: pathlib.Path = REPO, rss_limit: Optional[int] = None,
                 env: Optional[Mapping[str, str]] = None):
        self.argv = list(argv)
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self.began = time.monotonic()
        self.popen = subprocess.Popen(self.argv, cwd=cwd, env=subprocess_env(env), stdout=self._out,
                                      stderr=self._err)
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
    return [sys.executable, "-m", module, *args]


def imgrec_args(input_path, output, *flags: str, runner: Sequence[str] = IN_MEMORY) -> list[str]:
    """The arguments of `imgrec run` (a `None` input or output is left out)."""
    args = [*runner]
    if input_path is not None:
        args.append(f"--input={input_path}")
    if output is not None:
        args.append(f"--output={output}")
    return [*args, *flags]


def imgrec_argv(input_path, output, *flags: str, runner: Sequence[str] = IN_MEMORY) -> list[str]:
    return module_argv("pipeline.run", imgrec_args(input_path, output, *flags, runner=runner))


def run_module(module: str, args: Sequence[str], *, timeout: float = 90, rss_limit: Optional[int] = None,
               cwd: pathlib.Path = REPO) -> Run:
    """Runs `python -m module args` to the end, sampling the process tree's RSS; a run that
    exceeds `timeout` or `rss_limit` is killed (with all its descendants) and reported as such."""
    return Watched(module_argv(module, args), cwd, rss_limit).finish(timeout)


def run_imgrec(input_path, output, *flags: str, runner: Sequence[str] = IN_MEMORY, timeout: float = 90,
               rss_limit: Optional[int] = None) -> Run:
    return Watched(imgrec_argv(input_path, output, *flags, runner=runner), rss_limit=rss_limit).finish(timeout)


def run_verify(output, *flags: str, **kwargs) -> Run:
    return run_module("pipeline.read.verify", [str(output), *flags], **kwargs)


def run_here(capsys, main: Callable[[list[str]], int], args: Sequence[str]) -> Run:
    """A command's `main(args)` (the function its entry point exits with) in this process, as a
    `Run`: for refusals and checks where the process does not matter, each without an
    interpreter start and Beam's or TensorFlow's import (1-3 s of CPU)."""
    capsys.readouterr()
    began = time.monotonic()
    code = main(list(args))
    out, err = capsys.readouterr()
    return Run(list(args), code, out, err, time.monotonic() - began, 0, False, False, os.getpid())


def imgrec_here(capsys, input_path, output, *flags: str, runner: Sequence[str] = IN_MEMORY) -> Run:
    """`imgrec run` in this process (`run_here`): for refusals, which end before any work."""
    from pipeline.run import main

    return run_here(capsys, main, imgrec_args(input_path, output, *flags, runner=runner))


def verify_here(capsys, output, *flags: str) -> Run:
    """`imgrec verify` in this process (`run_here`)."""
    from pipeline.read.verify import main

    return run_here(capsys, main, [str(output), *flags])


def error_line(run: Run) -> str:
    """The one `imgrec: error: ` line a refusal prints to stderr (no traceback)."""
    assert "Traceback" not in run.stderr, run.brief()
    lines = [line for line in run.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    assert len(lines) == 1, f"expected exactly one line starting with {ERROR_PREFIX!r}\n{run.brief()}"
    return lines[0]


# --------------------------------------------------------------------------------------------
# Small real files


def write_image(path: pathlib.Path, color=(0, 0, 255), size=(6, 10)) -> str:
    """A small solid-color image at `path` (format from the extension, BGR color); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.full((*size, 3), color, np.uint8))
    return str(path)


def write_photo(path: pathlib.Path, seed: int, size: tuple[int, int] = (32, 32)) -> bytes:
    """A small distinct photo-like image, encoded by the path's suffix (PNG for a suffix OpenCV
    cannot write); returns its bytes."""
    rng = np.random.default_rng(seed)
    base = cv2.resize(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), size[::-1], interpolation=cv2.INTER_CUBIC)
    encodable = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
    ok, buf = cv2.imencode(path.suffix if path.suffix.lower() in encodable else ".png", base)
    assert ok
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.tobytes())
    return buf.tobytes()


def make_tree(root: pathlib.Path, classes: Mapping[str, int], size: tuple[int, int] = (32, 32),
              prefix: str = "") -> list[pathlib.Path]:
    """root/<class>/<prefix><class>_<i>.jpg|png (every third a PNG), every image distinct, and a
    pure function of the arguments (so every runner converts the same bytes)."""
    paths = []
    for name, count in classes.items():
        for i in range(count):
            path = root / name / f"{prefix}{name}_{i:04d}{'.png' if i % 3 == 0 else '.jpg'}"
            write_photo(path, seed=zlib.crc32(f"{prefix}{name}/{i}".encode("utf-8", "surrogateescape")), size=size)
            paths.append(path)
    return paths


def write_text(path: pathlib.Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def write_csv(path: pathlib.Path, header: Optional[str], rows: Iterable[tuple[str, str]]) -> pathlib.Path:
    lines = ([header] if header is not None else []) + [f"{p},{label}" for p, label in rows]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def zero_png(width: int, height: int, bit_depth: int = 8, color_type: int = 2) -> bytes:
    """A valid all-zero PNG of any declared size (its rows filter 0, all pixels 0), never held
    decoded in memory: 8 MiB of zeros deflated once, then that flushed block repeated (each starts
    afresh at a byte boundary), the rest as the last block, and the checksum of that many zeros."""
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[color_type]
    total = height * (1 + width * channels * bit_depth // 8)
    count, rest = divmod(total, 2**23)
    block = zlib.compressobj(9, zlib.DEFLATED, -15)
    last = zlib.compressobj(9, zlib.DEFLATED, -15)
    data = b"".join([b"\x78\xda", (block.compress(bytes(2**23)) + block.flush(zlib.Z_FULL_FLUSH)) * count,
                     last.compress(bytes(rest)), last.flush(), struct.pack(">I", (total % 65521) << 16 | 1)])
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", data) + png_chunk(b"IEND", b"")


def write_png_rows(path: pathlib.Path, width: int, height: int, bit_depth: int, color_type: int) -> None:
    """`zero_png` written to `path`."""
    path.write_bytes(zero_png(width, height, bit_depth, color_type))


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_declaring(width: int, height: int, bit_depth: int = 8, color_type: int = 2) -> bytes:
    """A PNG that declares a size and holds a few bytes of its pixel data: a bomb's header."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(bytes(64)))


@functools.lru_cache(maxsize=1)
def tile_bomb() -> bytes:
    """A 16x16 RGBA TIFF in one 8192x8192 tile: its header tells 16x16 pixels and passes every
    check, and OpenCV allocates the whole tile (256 MiB) to decode it."""
    import io

    import tifffile

    buffer = io.BytesIO()
    tifffile.imwrite(buffer, np.zeros((16, 16, 4), np.uint8), tile=(8192, 8192), compression="zlib",
                     photometric="rgb", extrasamples=[2])
    return buffer.getvalue()


def rejection_tuple(rejection) -> tuple:
    return rejection.path, rejection.stage, rejection.error


def test_pipeline():
    """A TestPipeline on the FnApiRunner: the engine the DirectRunner itself runs Python pipelines
    on, without the DirectRunner's per-pipeline translation checks (half the fixed cost)."""
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.testing.test_pipeline import TestPipeline

    return TestPipeline(runner=FnApiRunner())


test_pipeline.__test__ = False  # a helper, not a test


def beam_matcher(check: Callable[[list], None]) -> Callable[[Iterable], None]:
    """An assert_that matcher from a plain function that asserts on the whole output list."""
    from apache_beam.testing.util import BeamAssertException

    def matcher(actual):
        try:
            check(list(actual))
        except AssertionError as exc:
            raise BeamAssertException(str(exc)) from exc
    return matcher


def split_found(found: Iterable) -> tuple[list, list[tuple[str, str, str]]]:
    """Discovery's generator output → (candidates, [(path, error, message)] of rejections)."""
    import apache_beam as beam

    candidates, rejected = [], []
    for item in found:
        if isinstance(item, beam.pvalue.TaggedOutput):
            rejected.append((item.value.path, item.value.error, item.value.message))
        else:
            candidates.append(item)
    return candidates, rejected
