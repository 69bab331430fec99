"""Fixtures of the integration tier."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.etcd_agents import uninterrupted_digest as etcd_digest
from tests.integration.helpers import VENV_BIN
from tests.integration.sandbox_fixture import Running, sandbox
from tests.integration.training_jobs import uninterrupted_digest

__all__ = ["etcd_reference", "hpclaunch_bin", "reference_digest", "sandbox"]


@pytest.fixture(scope="session")
def reference_digest(
    sandbox: Running, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., str]:
    """The digest of a run that nothing interrupts, of ``script`` with ``args``: one job
    per script and arguments for the whole session (the run is deterministic, so every
    module that compares against the same run shares it)."""
    found: dict[tuple[str, ...], str] = {}

    def digest(script: Path, *args: str) -> str:
        key = (str(script), *args)
        if key not in found:
            folder = tmp_path_factory.mktemp("uninterrupted")
            found[key] = uninterrupted_digest(sandbox, folder, script, *args)
        return found[key]

    return digest


@pytest.fixture(scope="session")
def etcd_reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The digest of the two-agent etcd training (tests.integration.etcd_agents) that
    nothing interrupts: one run for the modules that take etcd away mid-training."""
    return etcd_digest(tmp_path_factory.mktemp("etcd-reference"), 8301)


@pytest.fixture
def hpclaunch_bin() -> Path:
    """The installed console script."""
    path = VENV_BIN / "hpclaunch"
    assert path.exists(), f"{path} missing: install the package (scripts/setup)"
    return path
