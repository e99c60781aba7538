"""Shared fixtures: the bundled sample data, and running the real pipeline on a runner."""
from __future__ import annotations

import json
import os
import pathlib
import sys
from typing import Callable, Mapping, Sequence

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"

# Beam's worker pools start `python` from PATH (the portable runner tests use one).
os.environ["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

IN_MEMORY = ("--runner=DirectRunner", "--direct_running_mode=in_memory")
MULTI_PROCESSING = ("--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2")


def run_pipeline(input_path: os.PathLike | str, output: os.PathLike | str, *flags: str,
                 runner: Sequence[str] = IN_MEMORY) -> dict:
    """Runs the real pipeline to completion and returns the metadata.json it published."""
    from pipeline.run import run

    run([*runner, f"--input={input_path}", f"--output={output}", *flags])
    return json.loads((pathlib.Path(output) / "metadata.json").read_text())


@pytest.fixture
def sample_dir() -> pathlib.Path:
    return SAMPLE


def read_split_records(output: os.PathLike | str, metadata: dict, split: str) -> list[bytes]:
    """Every serialized record of one split, read back with TensorFlow (CRCs checked)."""
    import tensorflow as tf

    files = [str(pathlib.Path(output) / name) for name in metadata["splits"][split]["files"]]
    compression = "GZIP" if metadata["compression"] == "gzip" else ""
    return [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type=compression)]


def records_by_split(output: os.PathLike | str, metadata: dict) -> dict[str, list[bytes]]:
    """Sorted records per split: the multiset that must not depend on runner or re-run."""
    return {split: sorted(read_split_records(output, metadata, split)) for split in metadata["splits"]}


def written_datasets(tmp_path_factory, common: Sequence[str],
                     layouts: Mapping[str, Sequence[str]]) -> Callable[[str], tuple[str, dict]]:
    """For module-scoped fixtures: layout name → (output dir, metadata) of the sample data
    converted with `common` + that layout's flags, each written once, on first use."""
    cache: dict[str, tuple[str, dict]] = {}

    def get(name: str) -> tuple[str, dict]:
        if name not in cache:
            output = tmp_path_factory.mktemp(name) / "out"
            cache[name] = (str(output), run_pipeline(SAMPLE, output, *common, *layouts[name]))
        return cache[name]
    return get


def pytest_configure(config):
    config.addinivalue_line("markers", "unit: cheap pure-function tests (no pipeline, no subprocess)")
    config.addinivalue_line("markers", "slow: runs real programs for a minute or more (deselect with -m 'not slow')")
