"""Helpers shared by the test modules: paths, running the real pipeline, reading its output back,
and writing small real image files. Fixtures live in conftest.py; this module has none."""
from __future__ import annotations

import json
import os
import pathlib
import struct
import sys
import zlib
from typing import Callable, Iterable, Mapping, Sequence

import cv2
import numpy as np

from transforms.dataset_format import METADATA_FILE, DatasetMetadata, tf_compression_type

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
# The 36 images of the sample (its two manifests at the root are not images).
SAMPLE_IMAGES = sorted(p for p in SAMPLE.glob("*/*") if p.is_file())
SAMPLE_CLASSES = ("cat", "coffee", "rocket")
SAMPLE_MANIFESTS = ("manifest.csv", "manifest.jsonl")

IN_MEMORY = ("--runner=DirectRunner", "--direct_running_mode=in_memory")
MULTI_PROCESSING = ("--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2")


def venv_first_on_path() -> None:
    """Beam's worker pools (the portable runner tests) and the converter pool start `python` from
    PATH: the interpreter running the tests must come first."""
    bin_dir = str(pathlib.Path(sys.executable).parent)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if parts[:1] != [bin_dir]:
        os.environ["PATH"] = os.pathsep.join([bin_dir, *(p for p in parts if p != bin_dir)])


# --------------------------------------------------------------------------------------------
# Running the pipeline and reading what it published


def read_metadata_json(output: os.PathLike | str) -> dict:
    return json.loads((pathlib.Path(output) / METADATA_FILE).read_text())


def read_metadata(output: os.PathLike | str) -> DatasetMetadata:
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


def read_split_records(output: os.PathLike | str, metadata: DatasetMetadata, split: str) -> list[bytes]:
    """Every serialized record of one split, read back with TensorFlow (CRCs checked)."""
    import tensorflow as tf

    files = [str(pathlib.Path(output) / name) for name in metadata.splits[split].files]
    compression = tf_compression_type(metadata.compression)
    return [bytes(r.numpy()) for r in tf.data.TFRecordDataset(files, compression_type=compression)]


def records_by_split(output: os.PathLike | str, metadata: DatasetMetadata) -> dict[str, list[bytes]]:
    """Sorted records per split: the multiset that must not depend on runner or re-run."""
    return {split: sorted(read_split_records(output, metadata, split)) for split in metadata.splits}


def parse_records(records: Iterable[bytes], metadata: DatasetMetadata) -> list[dict]:
    """Records parsed with TensorFlow using the parse spec metadata.json describes."""
    import tensorflow as tf

    spec = {key: tf.io.FixedLenFeature((), tf.string if f["dtype"] == "string" else tf.int64)
            for key, f in metadata.features.items()}
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()} for r in records]


def dead_letters(output: os.PathLike | str, metadata: DatasetMetadata) -> list[dict]:
    return [json.loads(line) for name in metadata.error_files
            for line in (pathlib.Path(output) / name).read_text().splitlines() if line]


def visible_files(output: os.PathLike | str) -> set[str]:
    """Every file under `output` (relative, recursive), hidden staging and lock included."""
    root = pathlib.Path(output)
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


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
# Small real files


def write_image(path: pathlib.Path, color=(0, 0, 255), size=(6, 10)) -> str:
    """A small solid-color image at `path` (format from the extension, BGR color); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.full((*size, 3), color, np.uint8))
    return str(path)


def write_photo(path: pathlib.Path, seed: int, size: tuple[int, int] = (40, 56)) -> bytes:
    """A small distinct photo-like JPEG/PNG (by suffix); returns its bytes."""
    rng = np.random.default_rng(seed)
    base = cv2.resize(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), size[::-1], interpolation=cv2.INTER_CUBIC)
    ok, buf = cv2.imencode(path.suffix, base)
    assert ok
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.tobytes())
    return buf.tobytes()


def make_good_images(root: pathlib.Path, per_class: int, classes=("ant", "bee"),
                     size=(40, 56)) -> list[pathlib.Path]:
    """`per_class` distinct photos per class folder, every fifth a PNG, the rest JPEGs."""
    paths = []
    for c, name in enumerate(classes):
        for i in range(per_class):
            path = root / name / f"{name}_{i:04d}{'.png' if i % 5 == 0 else '.jpg'}"
            write_photo(path, seed=c * 100_000 + i, size=size)
            paths.append(path)
    return paths


def write_text(path: pathlib.Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def png_declaring(width: int, height: int, bit_depth: int = 8, color_type: int = 2) -> bytes:
    """A PNG that declares a size and holds a few bytes of its pixel data: a bomb's header."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(64)))


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
