"""pipeline.heap: a run keeps Python's collector off the objects its imports made, and the
command skips the collection at exit (together about 0.4 s of a 2,000-image run)."""
from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from tests.helpers import IN_MEMORY, REPO, make_good_images


@pytest.mark.e2e
def test_a_run_keeps_the_collector_off_what_existed_before_it_and_gives_it_back(tmp_path):
    from pipeline.run import main

    make_good_images(tmp_path / "imgs", per_class=2)
    frozen = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            frozen.append(gc.get_freeze_count())

    gc.collect()
    existing = len(gc.get_objects())
    gc.callbacks.append(watch)
    try:
        assert main([*IN_MEMORY, f"--input={tmp_path / 'imgs'}", f"--output={tmp_path / 'out'}"]) == 0
    finally:
        gc.callbacks.remove(watch)
    assert frozen, "no collection ran during the conversion"
    assert max(frozen) >= existing, f"{max(frozen)} objects frozen during the run, {existing} existed before it"
    assert gc.get_freeze_count() == 0, "the caller's objects were left out of its collector"


@pytest.mark.e2e
def test_the_command_exits_without_a_last_collection():
    code = ("import atexit, gc\n"
            "from pipeline.interrupts import exit_quietly\n"
            "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0))\n"
            "exit_quietly(3)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout.strip() == "frozen at exit: True"
