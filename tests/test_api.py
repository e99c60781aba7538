"""`import imgrec`: the public Python API, as a user's notebook or training script calls it."""
from __future__ import annotations

import io
import subprocess
import sys

import pytest

from imgrec.api import as_flags
from tests.helpers import SAMPLE


@pytest.mark.unit
def test_keyword_settings_become_the_command_lines_flags():
    assert as_flags({"height": 160, "overwrite": True, "drop_duplicates": False, "split_ratios": (0.8, 0.2),
                     "reuse_from": None}) == ["--height=160", "--overwrite", "--no_drop_duplicates",
                                              "--split_ratios=0.8,0.2"]


@pytest.mark.e2e
def test_convert_load_and_verify_through_the_public_api(tmp_path):
    import imgrec

    out = tmp_path / "out"
    done = imgrec.convert(str(SAMPLE), str(out), runner="DirectRunner", direct_running_mode="in_memory",
                          height=32, width=32, encoding="png", normalize="none")
    assert done.metadata.inputs.written == 36
    images, labels = next(iter(imgrec.load_dataset(str(out), "train", batch_size=4)))
    assert images.shape == (4, 32, 32, 3) and labels.shape == (4,)
    assert imgrec.verify(str(out), samples=0, stream=io.StringIO())
    with pytest.raises(imgrec.UsageError, match="already holds a finished dataset"):
        imgrec.convert(str(SAMPLE), str(out), runner="DirectRunner")


@pytest.mark.unit
@pytest.mark.parametrize("verbose", [True, False])
def test_convert_takes_verbose_as_the_command_takes_v(tmp_path, verbose):
    """`verbose=True` (the command's `-v`) was refused as "unknown option --verbose", and
    `verbose=False` as "--no_verbose"; the run now gets as far as its input."""
    import imgrec

    with pytest.raises(imgrec.UsageError, match="no_such_folder"):
        imgrec.convert(str(tmp_path / "no_such_folder"), str(tmp_path / "out"), verbose=verbose)


@pytest.mark.e2e
def test_python_dash_m_imgrec_is_the_imgrec_command():
    """`python -m imgrec run` answers as `imgrec run` (imgrec/__main__.py calls the script's entry
    point). The command's whole run of the sample, with its summary line, is `imgrec run` in
    tests/test_ecosystem.py; a conversion in a process that imported imgrec is the test above."""
    done = subprocess.run([sys.executable, "-m", "imgrec", "run", "--help"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("usage: imgrec run"), done.stderr[-2000:]
