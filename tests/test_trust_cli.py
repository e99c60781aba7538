"""Issue 8: typos and usage errors are refused with exit code 2 and one line, before any work.

Black-box: the command line, `python -m pipeline.run` in a subprocess where the process matters
(closed streams, permissions, signals), else its `main(argv)` in this process (the function the
command exits with), so each of the many refusals and runs costs no interpreter start; the one
`imgrec: error: ` line must name the bad flag or key and suggest the closest valid one.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import Callable

import cv2
import numpy as np
import pytest

from tests.helpers import (
    REPO,
    Watched,
    check_complete,
    error_line,
    imgrec_argv,
    imgrec_here,
    make_tree,
    run_here,
    run_module,
    subprocess_env,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture
def data(tmp_path) -> pathlib.Path:
    make_tree(tmp_path / "data", {"cat": 2, "dog": 2})
    return tmp_path / "data"


def assert_nothing_written(out) -> None:
    out = pathlib.Path(out)
    assert not out.exists() or not any(out.iterdir()), "a refused run wrote into the output"
    assert not any(out.parent.glob(f"{out.name}.*")), "a refused run staged beside the output"


def assert_refused(run, out: pathlib.Path) -> str:
    assert run.returncode == 2, run.brief()
    line = error_line(run)
    assert_nothing_written(out)
    return line


@pytest.fixture
def refused(capsys) -> Callable[..., str]:
    """`imgrec run` with these arguments in this process: exit code 2, one `imgrec: error: ` line
    on stderr and no traceback, nothing written; returns the line."""
    def check(input_path, out, *flags: str) -> str:
        run = imgrec_here(capsys, input_path, out, *flags)
        assert run.returncode == 2, run.brief()
        line = error_line(run)
        if "://" not in str(out):
            assert_nothing_written(out)
        return line
    return check


@pytest.mark.parametrize("flag, bad, closest", [
    ("--num_shard=4", r"num_shard(?!s)", "num_shards"),
    ("--max_eror_fraction=1", r"max_eror_fraction", "max_error_fraction"),
    ("--direct_num_wokers=2", r"direct_num_wokers", "direct_num_workers"),
], ids=["num_shard", "max_eror_fraction", "direct_num_wokers"])
def test_a_mistyped_flag_is_a_usage_error_naming_the_closest_flag(refused, tmp_path, data, flag, bad, closest):
    out = tmp_path / "out"
    line = refused(data, out, flag)
    assert re.search(bad, line), f"the bad flag is not named: {line}"
    assert closest in line, f"{closest} is not suggested: {line}"


@pytest.mark.parametrize("yaml_text, bad, closest", [
    ("beam:\n  direct_num_wokers: 2\n", r"direct_num_wokers", "direct_num_workers"),
    ("output:\n  num_shard: 2\n", r"num_shard(?!s)", "num_shards"),
    ("image:\n  heigth: 64\n", r"heigth", "height"),
    ("inptu:\n  kind: auto\n", r"inptu", "input"),
], ids=["beam.direct_num_wokers", "output.num_shard", "image.heigth", "section_inptu"])
def test_a_mistyped_config_key_is_a_usage_error_naming_the_closest_key(refused, tmp_path, data, yaml_text, bad,
                                                                       closest):
    config = tmp_path / "config.yaml"
    config.write_text(yaml_text)
    out = tmp_path / "out"
    line = refused(data, out, f"--config={config}")
    assert re.search(bad, line), f"the bad key is not named: {line}"
    assert re.search(rf"\b{closest}\b", line), f"{closest} is not suggested: {line}"


@pytest.mark.parametrize("flags, facts", [
    (("--split_ratios=0.5,0.6,0.1",), ("ratio",)),
    (("--encoding=jpg",), ("encoding", "jpg", "jpeg")),
    (("--num_shards=four",), ("--num_shards", "four")),
    (("--config=/nonexistent/imgrec.yaml",), ("/nonexistent/imgrec.yaml",)),
    (("--runner=Bogus",), ("--runner=Bogus", "Unexpected pipeline runner")),
    (("--split_ratios=nan,0.5,0.5",), ("split", "finite")),
    (("--split_names=../../escaped,val", "--split_ratios=0.5,0.5"), ("split names", "../../escaped")),
    (("--num_shards=1000000000",), ("num_shards",)),
    (("--class_names=cat,cat,dog",), ("class_names", "distinct")),
    (("--convert_processes=-1",), ("--convert_processes", "-1")),
    (("--convert_processes=999",), ("--convert_processes", "999", "up to")),
    (("--progress_interval=-1",), ("--progress_interval", "-1")),
    (("--runner=PortableRunner", "--job_endpoint=localhost:1"), ("--job_endpoint=localhost:1", "cannot connect")),
    (("--direct_running_mode=multi_processing", "--direct_num_workers=-1"), ("--direct_num_workers",)),
    (("--compare_to=latest",), ("compare_to", "skip_unchanged")),
    (("--target_shard_mb=inf",), ("--target_shard_mb", "inf")),
    (("--reuse_from=/nonexistent/dataset",), ("--reuse_from", "/nonexistent/dataset/metadata.json: No such file")),
], ids=["split_ratios", "encoding_choice", "int_value", "missing_config", "unknown_runner", "nan_ratio",
        "split_name_path", "num_shards_bound", "repeated_class", "negative_processes", "too_many_processes",
        "negative_interval",
        "unreachable_job_service", "negative_workers", "compare_to_alone", "infinite_shard_size",
        "missing_reuse_source"])
def test_a_usage_error_prints_one_line_and_exits_2(refused, tmp_path, data, flags, facts):
    out = tmp_path / "out"
    line = refused(data, out, *flags)
    for fact in facts:
        assert fact in line, f"{fact!r} missing from {line}"


@pytest.mark.parametrize("yaml_text, facts", [
    ("image:\n  height: 1.5\n", ("image.height", "whole number")),
    ("image:\n  height: true\n", ("image.height", "number")),
    ("image:\n  normalize: mean_std\n  encoding: raw\n  std: [0, 0, 0]\n", ("std",)),
    ("image:\n  height: 100000\n  width: 100000\n", ("100000x100000", "max_decoded_bytes")),
    ("splits:\n  ratios: [.nan, 0.5, 0.5]\n", ("finite",)),
    ("image:\n  background: [300, -5, 0]\n", ("background", "0..255", "[300, -5, 0]")),
    ("image:\n  background: [1, 2]\n", ("background", "three values")),
    ("image:\n  resize_mode: pad\n  pad_value: 999\n", ("pad_value", "999")),
    ("image:\n  normalize: mean_std\n  encoding: raw\n  std: [1.0e-46, 1, 1]\n", ("float32", "1e-46")),
    ("image:\n  normalize: mean_std\n  encoding: raw\n  std: [1.0e-300, 1, 1]\n", ("float32",)),
    ("image:\n  normalize: mean_std\n  encoding: raw\n  mean: [1.0e+39, 0, 0]\n", ("float32", "1e+39")),
], ids=["fractional_int", "bool_int", "zero_std", "huge_output", "nan_ratio", "background_range",
        "background_length", "pad_value_range", "std_zero_in_float32", "std_overflows_float32",
        "mean_overflows_float32"])
def test_a_degenerate_config_value_is_a_usage_error(refused, tmp_path, data, yaml_text, facts):
    config = tmp_path / "config.yaml"
    config.write_text(yaml_text)
    out = tmp_path / "out"
    line = refused(data, out, f"--config={config}")
    for fact in facts:
        assert fact in line, f"{fact!r} missing from {line}"


def test_a_config_that_is_not_utf8_is_a_usage_error(refused, tmp_path, data):
    config = tmp_path / "config.yaml"
    config.write_bytes(b"image:\n  height: 64  # caf\xe9\n")  # Latin-1 in a comment
    out = tmp_path / "out"
    line = refused(data, out, f"--config={config}")
    assert "not UTF-8" in line and str(config) in line


@pytest.mark.parametrize("input_url", ["nofs://bucket/data", "nofs://bucket/list.csv"], ids=["folder", "manifest"])
def test_an_input_on_no_beam_filesystem_is_a_usage_error(refused, tmp_path, input_url):
    out = tmp_path / "out"
    line = refused(input_url, out)
    assert f"--input={input_url}" in line and "filesystem" in line, line


@pytest.mark.skipif(importlib.util.find_spec("boto3") is not None, reason="boto3 is installed: s3:// would be tried")
@pytest.mark.parametrize("flag", ["--input", "--output"])
def test_s3_without_the_aws_extra_is_a_usage_error(refused, tmp_path, data, flag):
    """Beam knows s3:// but fails inside its S3 client without boto3 (apache-beam[aws])."""
    out = tmp_path / "out"
    line = refused("s3://bucket/data", out) if flag == "--input" else refused(data, "s3://bucket/out")
    assert line.startswith(f"imgrec: error: {flag}=s3://bucket/"), line


def test_an_output_among_the_inputs_is_refused_without_suggesting_overwrite(capsys, data):
    for output in (data, data / "cat"):
        run = imgrec_here(capsys, data, output)
        assert run.returncode == 2, run.brief()
        line = error_line(run)
        assert "in among" in line and "--overwrite" not in line, line


def test_a_run_ends_with_its_final_progress_line_however_short(tmp_path, capsys, data):
    (data / "notes.txt").write_text("not an image")
    run = imgrec_here(capsys, data, tmp_path / "out", "--progress_interval=30")
    assert run.returncode == 0, run.brief()
    assert "imgrec: processed 4/4 images (100%)" in run.stderr.splitlines(), run.brief()


@pytest.mark.slow
def test_progress_lines_show_during_a_run(tmp_path, capsys):
    """The counts come from the parts finished so far, while the run goes on (not only at its end)."""
    data = tmp_path / "data"
    make_tree(data, {"ant": 150, "bee": 150}, size=(400, 500))
    run = imgrec_here(capsys, data, tmp_path / "out", "--encoding=raw", "--normalize=unit", "--progress_interval=0.2")
    assert run.returncode == 0, run.brief()
    done = [int(m.group(1)) for m in re.finditer(r"^imgrec: processed (\d+)/300 images", run.stderr, re.M)]
    assert any(0 < n < 300 for n in done) and done[-1] == 300, run.brief()


def test_file_urls_name_local_input_and_output(tmp_path, capsys, data):
    """TensorFlow's gfile takes file:// URLs and Beam's filesystems do not: imgrec takes both."""
    manifest = tmp_path / "list.csv"
    manifest.write_text("path,label\n" + "".join(f"{p},{p.parent.name}\n" for p in sorted(data.rglob("*.*"))))
    for source in (f"file://{data}", f"file://{manifest}"):
        out = tmp_path / f"out-{pathlib.Path(source).suffix or 'folder'}"
        run = imgrec_here(capsys, source, f"file://{out}")
        assert run.returncode == 0, run.brief()
        metadata, records, rows = check_complete(out)
        root = manifest.parent if source.endswith(".csv") else data  # source paths are relative to the input root
        assert sorted(path for path, _, _ in records) == sorted(str(p.relative_to(root)) for p in data.rglob("*.*"))
        assert not rows
    first = tmp_path / "out-folder"
    run = imgrec_here(capsys, data, tmp_path / "again", f"--reuse_from=file://{first}")
    assert run.returncode == 0, run.brief()
    metadata, _, _ = check_complete(tmp_path / "again")
    assert metadata["reuse"] == {"from": str(first), "reused": 4, "converted": 0}


@pytest.mark.parametrize("text", ['{"splits": ["train", "test"]}', "[]", '{"format_version": 2, "splits": {}}'],
                         ids=["splits_list", "list", "no_versions"])
def test_compare_to_a_folder_that_is_no_imgrec_dataset_is_a_usage_error(refused, tmp_path, data, text):
    other = tmp_path / "other"
    other.mkdir()
    (other / "metadata.json").write_text(text)
    out = tmp_path / "out"
    line = refused(data, out, "--skip_unchanged", f"--compare_to={other}")
    assert "--compare_to" in line and "not the metadata of an imgrec dataset" in line, line


def test_a_missing_input_is_a_usage_error(refused, tmp_path):
    out = tmp_path / "out"
    line = refused(None, out)
    assert "--input" in line, line


@pytest.mark.parametrize("mode, parent_mode, problem", [
    (0o000, 0o755, "cannot list the folder"),
    (0o644, 0o755, "cannot enter the folder"),  # listed, but what it lists cannot be opened
    (0o755, 0o000, "cannot reach the folder"),  # not "no such folder": it is there
], ids=["unlistable", "not-enterable", "parent-not-searchable"])
def test_an_input_folder_that_cannot_be_read_is_a_usage_error(tmp_path, mode, parent_mode, problem):
    """Not Beam's traceback from the first step. Root reads any folder, so as root the command
    runs without the capabilities that override permissions."""
    folder, out = tmp_path / "parent" / "in", tmp_path / "out"
    make_tree(folder, {"cat": 1})
    folder.chmod(mode)
    folder.parent.chmod(parent_mode)
    prefix = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("root reads any folder, and setpriv is not installed to drop that")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    try:
        line = assert_refused(Watched([*prefix, *imgrec_argv(folder, out)]).finish(120), out)
    finally:
        folder.parent.chmod(0o755)
        folder.chmod(0o755)
    assert line == f"imgrec: error: --input={folder}: {problem}: Permission denied"


def test_a_run_started_with_its_standard_streams_closed_converts_and_reports_as_usual(tmp_path, data):
    """`imgrec run ... 2>&- >&- <&-`: the next files opened would get descriptors 0-2, and
    libjpeg's warning about the damaged JPEG (written to fd 2) would land in one of them.
    `python -m pipeline.cli run`, as the `imgrec` script: `python -m pipeline.run` calls the same
    entry_point (which reopens the streams) before it imports anything but the standard library,
    pipeline.interrupts and pipeline.standard_streams, which cli imports too."""
    noise = np.random.default_rng(5).integers(0, 256, (96, 96, 3), dtype=np.uint8)
    jpeg = cv2.imencode(".jpg", noise)[1].tobytes()
    (data / "cat" / "damaged.jpg").write_bytes(jpeg[:len(jpeg) // 2] + b"\xff\xd9")
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", f"--input={data}", f"--output={out}",
                          "--max_error_fraction=1"], cwd=REPO, env=subprocess_env(), timeout=120,
                         preexec_fn=lambda: [os.close(fd) for fd in (0, 1, 2)])
    assert run.returncode == 0
    metadata, records, rows = check_complete(out)
    assert [(pathlib.Path(r["path"]).name, r["error"]) for r in rows] == [("damaged.jpg", "CorruptImage")]
    assert "premature end of data segment" in rows[0]["message"]


def test_an_output_that_cannot_be_written_does_not_change_the_exit_code(tmp_path, data):
    """A full disk under stdout (or `| head`, a reader gone): the exit code still says what
    happened, 0 for a published dataset and 2 for a usage error."""
    out = tmp_path / "out"
    with open("/dev/full", "w") as full:
        published = subprocess.run([sys.executable, "-m", "pipeline.run", f"--input={data}", f"--output={out}"],
                                   cwd=REPO, env=subprocess_env(), timeout=120, stdout=full, stderr=subprocess.DEVNULL)
        usage = subprocess.run([sys.executable, "-m", "pipeline.run", f"--input={data}", "--output="],
                               cwd=REPO, env=subprocess_env(), timeout=120, stdout=subprocess.DEVNULL, stderr=full)
    assert published.returncode == 0
    check_complete(out)
    assert usage.returncode == 2


def test_checking_and_exporting_keep_their_exit_code_when_stdout_cannot_be_written(tmp_path, capsys, data):
    """`imgrec verify DS > /dev/full` (or `| head -1`) ended in a traceback and exit 1 for a
    healthy dataset: what the report could not print must not change what the exit code says."""
    out = tmp_path / "out"
    assert imgrec_here(capsys, data, out, "--encoding=png", "--normalize=none").returncode == 0
    for command in (["verify", str(out), f"--out={tmp_path / 'pngs'}"], ["export-tfds", str(out)]):
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, "-m", "pipeline.cli", *command], cwd=REPO, env=subprocess_env(),
                                  timeout=120, stdout=full, stderr=subprocess.PIPE, text=True)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_a_usage_error_of_the_imgrec_command_is_one_line_and_exit_2():
    """The `imgrec` console script itself, as a user types it (the usage errors of each of its
    commands are checked by its `main` below, and the module entry points' further down)."""
    run = run_module("pipeline.cli", ["run", "--num_shard=4"], timeout=120)
    assert run.returncode == 2 and "usage:" not in run.stderr, run.brief()
    error_line(run)


@pytest.mark.parametrize("argv", [["verify"], ["verify", "--bogus", "x"], ["verify", "--samples=x", "x"],
                                  ["export-tfds"], ["export-tfds", "a", "b"]])
def test_every_commands_usage_error_is_one_line_and_exit_2(capsys, argv):
    """argparse printed its usage text and a second line naming the command ("imgrec verify: error:")."""
    from pipeline.cli import main

    run = run_here(capsys, main, argv)
    assert run.returncode == 2 and "usage:" not in run.stderr, run.brief()
    error_line(run)


@pytest.mark.parametrize("module", ["pipeline.read.verify", "pipeline.read.tfds_export"])
def test_commands_reading_datasets_print_no_tensorflow_start_up_lines(module):
    """Without TF_CPP_MIN_LOG_LEVEL, as a user runs them, TensorFlow's import printed four lines
    (absl's warning and the oneDNN notice, twice) before the one-line usage error."""
    clean = {k: v for k, v in subprocess_env().items() if not k.startswith("TF_")}
    done = subprocess.run([sys.executable, "-m", module], cwd=REPO, env=clean, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["imgrec: error: the following arguments are required: output"], done.stderr
