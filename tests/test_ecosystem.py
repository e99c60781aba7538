"""imgrec next to the tools its users compare it with: Keras's class order, tf.distribute input
pipelines, Keras training, Airflow's Dataflow job-id parsing and option passing, the CLI."""
from __future__ import annotations

import ast
import json
import logging
import pathlib
import re
import subprocess
import sys

import cv2
import numpy as np
import pytest

from pipeline.options import parse_arguments
from tests.helpers import IN_MEMORY, REPO, SAMPLE, run_pipeline

pytestmark = pytest.mark.e2e

# --------------------------------------------------------------------------------------------
# Keras image_dataset_from_directory: label ids are its class_names order, always.


def _image(path: pathlib.Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), cv2.resize(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), (24, 24)))


LAYOUTS = {
    # every folder name an integer: Keras sorts them as strings
    "integer_names": {"0": 2, "1": 2, "2": 1, "9": 1, "10": 2, "11": 1},
    # an empty class folder and one holding only a text file still get ids
    "empty_classes": {"ant": 2, "bee": 0, "cat": 2, "dog": "text-only"},
    # hidden folders are not classes; nested files belong to their top folder
    "hidden_and_nested": {"ant": 2, ".cache": 2, "bee": "nested"},
    "mixed_case": {"Zebra": 1, "apple": 1, "Apple": 1, "_under": 1},
}


def make_layout(root: pathlib.Path, layout: dict) -> None:
    for seed, (name, content) in enumerate(layout.items()):
        folder = root / name
        folder.mkdir(parents=True)
        if content == "text-only":
            (folder / "README.txt").write_text("no images here")
        elif content == "nested":
            _image(folder / "sub" / "deeper" / "x.png", seed * 10)
        else:
            for i in range(content):
                _image(folder / f"img_{i}.png", seed * 10 + i)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_label_ids_follow_keras_class_names(tmp_path, name):
    import tensorflow as tf

    root = tmp_path / "images"
    make_layout(root, LAYOUTS[name])
    keras = tf.keras.utils.image_dataset_from_directory(str(root), image_size=(24, 24), batch_size=4, shuffle=False)
    metadata = run_pipeline(root, tmp_path / "out", "--split_names=train", "--split_ratios=1",
                            "--max_error_fraction=1", "--normalize=none")
    by_id = sorted(metadata.label_map.items(), key=lambda item: item[1])
    assert [label for label, _ in by_id] == keras.class_names
    assert [label_id for _, label_id in by_id] == list(range(len(keras.class_names)))


def test_a_macos_zip_folder_is_no_class_where_keras_makes_it_one(tmp_path):
    """An archive unzipped from macOS holds `__MACOSX/<class>/._<file>` (AppleDouble metadata,
    not pixels). Keras makes `__MACOSX` a class, so `dog` gets id 2; imgrec skips it."""
    import tensorflow as tf

    root = tmp_path / "images"
    make_layout(root, {"Cat": 2, "dog": 2})
    for name in ("Cat/._img_0.png", "Cat/._img_1.png", "dog/._img_0.png"):
        path = root / "__MACOSX" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + bytes(64))
    keras = tf.keras.utils.image_dataset_from_directory(str(root), image_size=(24, 24), batch_size=4, shuffle=False)
    metadata = run_pipeline(root, tmp_path / "out", "--split_names=train", "--split_ratios=1",
                            "--max_error_fraction=0", "--normalize=none")
    assert keras.class_names == ["Cat", "__MACOSX", "dog"]
    assert metadata.label_map == {"Cat": 0, "dog": 1}


# --------------------------------------------------------------------------------------------
# Reading on several hosts, and training


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> pathlib.Path:
    output = tmp_path_factory.mktemp("demo") / "out"
    run_pipeline(SAMPLE, output, "--num_shards=4")
    return output


def test_input_pipelines_read_disjoint_files_that_cover_the_split(demo):
    import tensorflow as tf

    from pipeline.read.reader import load_dataset

    def labels(context) -> list[int]:
        dataset = load_dataset(str(demo), "train", batch_size=None, input_context=context, with_metadata=True)
        return sorted(extras["source_path"] for _, _, extras in dataset.as_numpy_iterator())

    everything = labels(None)
    parts = [labels(tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i, num_replicas_in_sync=2))
             for i in range(2)]
    assert parts[0] and parts[1] and not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == everything


def test_more_input_pipelines_than_files_is_refused(demo):
    import tensorflow as tf

    from pipeline.read.reader import load_dataset

    context = tf.distribute.InputContext(num_input_pipelines=5, input_pipeline_id=0, num_replicas_in_sync=5)
    with pytest.raises(ValueError, match="fewer than the 5 input pipelines"):
        load_dataset(str(demo), "train", input_context=context)


def test_input_pipelines_are_given_only_shard_files_with_records(tmp_path):
    """More shards than images leaves empty shard files: a pipeline given only those would read
    nothing (and stall synchronous training), so they are not counted as files to share."""
    import tensorflow as tf

    from pipeline.read.reader import load_dataset

    _image(tmp_path / "in" / "cat" / "a.png", 1)
    _image(tmp_path / "in" / "cat" / "b.png", 2)
    metadata = run_pipeline(tmp_path / "in", tmp_path / "out", "--num_shards=3", "--split_names=train",
                            "--split_ratios=1")
    lengths = metadata.splits["train"].shard_lengths
    # which shards the two images go to follows their paths (here under a random tmp_path): 1 or 2
    with_records = sum(1 for n in lengths if n)
    assert sum(lengths) == 2 and len(lengths) == 3 and with_records in (1, 2)

    def read(pipelines: int, index: int) -> int:
        context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=index)
        return sum(1 for _ in load_dataset(str(tmp_path / "out"), "train", batch_size=None, input_context=context))

    counts = [read(with_records, i) for i in range(with_records)]
    assert sum(counts) == 2 and min(counts) >= 1
    files = "1 shard file" if with_records == 1 else f"{with_records} shard files"
    with pytest.raises(ValueError, match=f"{files} with records, fewer than the "
                                         f"{with_records + 1} input pipelines"):
        read(with_records + 1, 0)


def test_an_empty_split_gives_every_input_pipeline_nothing():
    from pipeline.read.reader import shard_for_input_pipeline

    assert [shard_for_input_pipeline([], 3, i, "test") for i in range(3)] == [[], [], []]


# --------------------------------------------------------------------------------------------
# Airflow's apache-beam provider


# The Google provider's job-id pattern (airflow/providers/google/cloud/hooks/dataflow.py,
# apache-airflow-providers-google 22.8.0, Apache License 2.0), which BeamRunPythonPipelineOperator
# applies to every line the pipeline prints on stdout or stderr.
JOB_ID_PATTERN = re.compile(
    r"Submitted job: (?P<job_id_java>[^\"\n\s]*)|Created job with id: \[(?P<job_id_python>[^\"\n\s]*)\]"
)


def beam_options_to_args(options: dict) -> list:
    """airflow/providers/apache/beam/hooks/beam.py `beam_options_to_args` (provider 6.3.1, Apache
    License 2.0), without the Java-only false-flag table."""
    args = []
    for attr, value in options.items():
        if isinstance(value, bool):
            if value:
                args.append(f"--{attr}")
            elif attr == "use_public_ips":
                args.append("--no_use_public_ips")
        elif isinstance(value, list):
            args.extend([f"--{attr}={v}" for v in value])
        elif isinstance(value, dict):
            args.append(f"--{attr}={json.dumps(value)}")
        elif value is None:
            continue
        else:
            args.append(f"--{attr}={value}")
    return args


def test_dataflow_job_id_line_reaches_airflow():
    """imgrec's logging set-up keeps the line Beam's Dataflow client logs when it creates a job."""
    code = ("from pipeline.run import configure_logging; import logging; configure_logging(verbose=False); "
            "logging.getLogger('apache_beam.runners.dataflow.internal.apiclient')"
            ".info('Created job with id: [%s]', '2026-12-02_01_02_03-123')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    found = [m.group("job_id_python") for line in (done.stdout + done.stderr).splitlines()
             if (m := JOB_ID_PATTERN.search(line))]
    assert found == ["2026-12-02_01_02_03-123"]


def test_airflow_dag_options_are_accepted(tmp_path):
    """The argv the README's DAG makes (BeamRunPythonPipelineOperator adds labels) parses."""
    options = {"labels": ["airflow-version=v3-3-2"], "config": "seed", "input": str(SAMPLE),
               "output": str(tmp_path / "{date}"), "skip_unchanged": True, "reuse_from": "latest",
               "overwrite": False, "compare_to": None}
    parsed = parse_arguments(["--runner=DirectRunner", *beam_options_to_args(options)])
    assert parsed.spec.output.skip_unchanged and parsed.spec.output.reuse_from == "latest"



def airflow_pipeline_options(markdown: str) -> dict:
    """The `pipeline_options` dict of the DAG in docs/operations.md, as a literal."""
    block = re.search(r"```python\n(from airflow.*?)```", markdown, re.S).group(1)
    call = ast.parse(block).body[-1].value
    return ast.literal_eval(next(k.value for k in call.keywords if k.arg == "pipeline_options"))


@pytest.mark.timeout(300)
def test_the_operations_airflow_dag_runs_as_airflow_renders_it(tmp_path, capsys):
    """Airflow renders pipeline_options with Jinja before the task runs: the DAG's output
    `.../{{ ds }}` reached imgrec as a fixed folder (`.../2026-12-02`), and its
    `reuse_from: latest` was refused (exit 2: 'latest' needs an output template), every day.
    Run here on the sample, the store paths made local and the runner the DirectRunner."""
    from pipeline.run import main

    options = airflow_pipeline_options((REPO / "docs" / "operations.md").read_text())
    rendered = {key: re.sub(r"\{\{\s*ds\s*\}\}", "2026-12-02", value) if isinstance(value, str) else value
                for key, value in options.items()}
    rendered.update(input=str(SAMPLE), setup_file=None,
                    output=rendered["output"].replace("gs://my-bucket/", f"{tmp_path}/"))
    argv = [*IN_MEMORY, *beam_options_to_args(rendered), "--labels=airflow-version=v3-3-2"]
    assert main(argv) == 0, capsys.readouterr().err
    assert main(argv) == 0, capsys.readouterr().err  # a retry of the task the same day
    assert "unchanged: inputs and config match the dataset" in capsys.readouterr().out

def test_beam_logs_stay_quiet_but_job_lines_do_not():
    from pipeline.run import configure_logging

    configure_logging(verbose=False)
    assert not logging.getLogger("apache_beam.runners.portability.fn_api_runner").isEnabledFor(logging.WARNING)
    assert not logging.getLogger("imgrec").isEnabledFor(logging.INFO)
    assert logging.getLogger("apache_beam.runners.dataflow.internal.apiclient").isEnabledFor(logging.INFO)
    configure_logging(verbose=True)
    assert logging.getLogger("apache_beam.runners.portability.fn_api_runner").isEnabledFor(logging.INFO)


# --------------------------------------------------------------------------------------------
# The imgrec command


def test_imgrec_command_runs_with_a_shipped_config_from_any_folder(tmp_path):
    """`imgrec run --config=seed` finds the packaged config, from a folder outside the repo."""
    imgrec = pathlib.Path(sys.executable).parent / "imgrec"
    done = subprocess.run([str(imgrec), "run", "--config=seed", f"--input={SAMPLE}", f"--output={tmp_path / 'out'}",
                           *IN_MEMORY], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "inputs: 38 = 36 written + 2 skipped (not images) + 0 rejected" in done.stdout
    assert "images/s" in done.stdout  # the summary's time line
    verify = subprocess.run([str(imgrec), "verify", str(tmp_path / "out"), "--samples=0"], capture_output=True,
                            text=True, cwd=tmp_path, timeout=300)
    assert verify.returncode == 0 and "OK: all" in verify.stdout


def test_help_answers_without_importing_beam():
    code = ("import sys; from pipeline.cli import main; main(['run', '--help']); "
            "assert 'apache_beam' not in sys.modules, 'help imported Beam'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: imgrec run"), done.stderr
