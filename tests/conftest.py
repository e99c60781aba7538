"""Fixtures only; shared helpers are in tests/helpers.py."""
from __future__ import annotations

import pytest

from tests.helpers import venv_first_on_path


@pytest.fixture(scope="session", autouse=True)
def _venv_python_first_on_path() -> None:
    """Worker pools started by Beam and by imgrec run `python` from PATH."""
    venv_first_on_path()
