"""The zygote's contract with the agent, on real processes (no torch): a worker's group
exists as soon as its pid is known, an ended worker's pid is not reused before the agent
lets go of it, a dead zygote reads as dead workers, and a worker ends as python does."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).with_name("zygote_driver.py")


def drive(scenario: str, folder: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(DRIVER), scenario, str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return seen


def test_a_worker_leads_its_group_before_its_pid_is_handed_out(tmp_path: Path) -> None:
    # The agent signals the group: a pid handed out before the worker's setsid would
    # make that signal miss (ESRCH) and the worker outlive its stop.
    seen = drive("group_at_once", tmp_path)
    assert seen["leaders"] == [True] * 20
    assert seen["ended"] is True
    assert seen["codes"] == [-int(signal.SIGKILL)] * 20


def test_a_worker_takes_a_stop_signal_as_soon_as_its_pid_is_handed_out(tmp_path: Path) -> None:
    # The zygote ignores the step's signals; a worker that still did would outlive its
    # stop until SIGKILL, after the grace period.
    seen = drive("stopped_at_once", tmp_path)
    assert seen["ended"] is True
    assert seen["codes"] == [-int(signal.SIGTERM)] * 20


def test_a_missing_script_fails_as_python_does(tmp_path: Path) -> None:
    seen = drive("missing_script", tmp_path)
    assert seen["code"] == 2
    assert seen["stderr"] == (
        f"{sys.executable}: can't open file {seen['missing']!r}: "
        "[Errno 2] No such file or directory\n"
    )


def test_an_ended_worker_keeps_its_pid_until_released(tmp_path: Path) -> None:
    seen = drive("kept_until_released", tmp_path)
    assert seen["code"] == 7
    assert seen["before"] == "Z"  # reported, not reaped: no other process can take the pid
    assert seen["after"] == "gone"
    assert seen["forgotten"] is True


def test_a_dead_zygote_reads_as_dead_workers_and_starts_nothing(tmp_path: Path) -> None:
    seen = drive("zygote_killed", tmp_path)
    assert seen["woke"] is True and seen["gone"] is True
    assert seen["codes"] == [-int(signal.SIGKILL)] * 2
    assert "the zygote" in seen["refused"] and "ended" in seen["refused"]
    assert all(state in ("gone", "Z") for state in seen["workers"])  # died with it


def test_a_worker_ends_as_python_does(tmp_path: Path) -> None:
    seen = drive("finishing", tmp_path)
    assert seen["code"] == 0, seen["stderr"]
    assert seen["files"] == {
        "main.txt": "written by the script, never closed",
        "helper.txt": "written by a module, never closed",
        "records.log": "buffered until logging shuts down\n",
        "child.txt": "child done",  # multiprocessing joined its child before the exit
    }
