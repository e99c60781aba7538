"""Every type hint Beam checks is true: the whole pipeline, with Beam's strictest checks, on each
input kind and each planning branch (a false hint failed every run on Beam 2.78)."""
from __future__ import annotations

import pytest

from tests.helpers import SAMPLE, run_pipeline

pytestmark = pytest.mark.e2e

STRICT = ("--type_check_additional=all", "--runtime_type_check")


# An incremental run takes the reuse branch too: once, as its planning is the same for every input kind.
@pytest.mark.parametrize("source, flags, reuse", [
    ("folders", ("--split_method=stratified", "--drop_duplicates"), True),
    ("folders", ("--split_method=hash", "--split_key=path"), False),
    ("manifest.csv", (), False),
    ("manifest.jsonl", (), False),
    ("glob", (), False),
])
def test_pipeline_passes_beams_type_checks(tmp_path, source, flags, reuse):
    path = {"folders": SAMPLE, "glob": f"{SAMPLE}/*/*.jpg"}.get(source, SAMPLE / source)
    metadata = run_pipeline(path, tmp_path / "out", *STRICT, *flags)
    assert metadata.inputs.written > 0
    if reuse:
        again = run_pipeline(path, tmp_path / "again", *STRICT, *flags, f"--reuse_from={tmp_path / 'out'}")
        assert again.inputs.written == metadata.inputs.written
