"""The README's commands run as written: every ```sh and ```python block, in order, in a fresh
folder where `photos/` is the bundled sample (its class folders) and `data/detection/` the bundled
detection sample, as a user would paste them.

Blocks in other languages (```text, ```console, ```crontab) are shown, not run: output, and
commands that need a cluster, a cloud store or a scheduler (make test-engines and make
test-stores run those)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO, SAMPLE, SAMPLE_CLASSES

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```", re.S | re.M)


def runnable_blocks(markdown: str) -> list[tuple[str, str]]:
    return [(match.group(1), match.group(2)) for match in BLOCK.finditer(markdown)]


def test_readme_commands_run_as_written_on_the_sample(tmp_path):
    blocks = runnable_blocks((REPO / "README.md").read_text())
    assert any(kind == "sh" for kind, _ in blocks) and any(kind == "python" for kind, _ in blocks)
    for name in SAMPLE_CLASSES:
        shutil.copytree(SAMPLE / name, tmp_path / "photos" / name)
    shutil.copytree(REPO / "data" / "detection", tmp_path / "data" / "detection")
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]),
               TF_CPP_MIN_LOG_LEVEL="2")
    for kind, code in blocks:
        argv = ["bash", "-euo", "pipefail", "-c", code] if kind == "sh" else [sys.executable, "-c", code]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{kind} block failed:\n{code}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
