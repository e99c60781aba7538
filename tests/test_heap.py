"""pipeline.heap: a run and a check keep Python's collector off the objects that existed before
them (the imports'), and the commands skip the collection at exit (together about 0.4 s of a
2,000-image run)."""
from __future__ import annotations

import contextlib
import gc
import subprocess
import sys
from typing import Iterator

import pytest

from tests.helpers import IN_MEMORY, REPO, make_tree


@contextlib.contextmanager
def frozen_during() -> Iterator[list[int]]:
    """The frozen object count at every collection that starts inside the block, and a check
    that the objects existing before the block were among them, and are back in reach after."""
    counts: list[int] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            counts.append(gc.get_freeze_count())

    gc.collect()
    existing = len(gc.get_objects())
    gc.callbacks.append(watch)
    try:
        yield counts
    finally:
        gc.callbacks.remove(watch)
    assert counts, "no collection ran in the block"
    # Some of those objects (the block's own temporaries) are gone by the time it freezes.
    assert max(counts) >= 0.99 * existing, f"{max(counts)} objects frozen in the block, {existing} existed before it"
    assert gc.get_freeze_count() == 0, "the caller's objects were left out of its collector"


@pytest.mark.e2e
def test_a_run_and_a_check_keep_the_collector_off_what_existed_before_them(tmp_path):
    from pipeline.run import main as run
    from pipeline.verify import main as verify

    make_tree(tmp_path / "imgs", {"ant": 2, "bee": 2})
    with frozen_during():
        assert run([*IN_MEMORY, f"--input={tmp_path / 'imgs'}", f"--output={tmp_path / 'out'}"]) == 0
    with frozen_during():
        assert verify([str(tmp_path / "out"), "--samples=0"]) == 0


@pytest.mark.e2e
def test_the_command_exits_without_a_last_collection():
    code = ("import atexit, gc\n"
            "from pipeline.interrupts import exit_quietly\n"
            "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0))\n"
            "exit_quietly(3)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout.strip() == "frozen at exit: True"
