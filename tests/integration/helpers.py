"""Helpers for tests that run real processes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
# Fake job ids (random, from here up) of agents run on this host, above every test
# worker's sandbox job ids (sandbox_fixture.first_job_id): a scan for the processes
# of a sandbox job never finds a local agent's, nor the other way round.
LOCAL_JOB_IDS = 100_000


def wait_for(
    condition: Callable[[], bool], timeout_s: float = 20.0, what: str = "condition"
) -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def base_env(**extra: str) -> dict[str, str]:
    """A minimal child environment: the venv's bin first, system tools after."""
    env = {
        "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
    }
    env.update(extra)
    return env
