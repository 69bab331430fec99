"""Fixtures of the integration tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.helpers import VENV_BIN
from tests.integration.sandbox_fixture import sandbox

__all__ = ["hpclaunch_bin", "sandbox"]


@pytest.fixture
def hpclaunch_bin() -> Path:
    """The installed console script."""
    path = VENV_BIN / "hpclaunch"
    assert path.exists(), f"{path} missing: install the package (scripts/setup)"
    return path
