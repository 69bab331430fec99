"""A bookkeeping write that fails: its one line (hpclaunch.jobdir.unwritten), and the
history closed in place where its folder takes no new file (hpclaunch.jobdir.history_store)."""

from __future__ import annotations

import errno
import json
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpclaunch.jobdir import history_store
from hpclaunch.jobdir.history import Action, History, Reason
from hpclaunch.jobdir.unwritten import Unwritten, line
from hpclaunch.recovery.policy import Decision
from hpclaunch.recovery.supervisor import Supervisor
from hpclaunch.slurm.commands import FakeRunner, Slurm

COMPLETED = Decision(Action.NONE, Reason.COMPLETED, 0)


def test_the_line_names_the_file_the_error_and_the_fix() -> None:
    full = OSError(errno.ENOSPC, "No space left on device")
    assert line("the job's history", "/j/7/history.json", full, "the job goes on") == (
        "could not write the job's history /j/7/history.json: No space left on device "
        "(ENOSPC); the job goes on. Fix: free space on its filesystem"
    )
    immutable = OSError(errno.EPERM, "Operation not permitted")
    said = line("the job's history", "/j/7/history.json", immutable, "the job goes on")
    assert "Operation not permitted (EPERM)" in said
    assert "`lsattr -d /j/7` shows an `i`, and `chattr -i /j/7` (as root) clears it" in said
    odd = line("a note", "/j/7/n", OSError(errno.EIO, "Input/output error"), "nothing else")
    assert odd.endswith("Fix: check the job folder's filesystem (`df -h /j/7`, `mount`)")


def test_each_failure_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    said = Unwritten(logging.getLogger("test"), "supervisor: ")
    full = OSError(errno.ENOSPC, "No space left on device")
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            said.say("the job's history", "/j/h", full, "x")
        said.say("the job's history", "/j/h", OSError(errno.EROFS, "Read-only file system"), "x")
    assert [r.getMessage()[:48] for r in caplog.records] == [
        "supervisor: could not write the job's history /j",
    ] * 2


def test_padded_keeps_the_size_or_refuses() -> None:
    assert history_store.padded(b'{"a": 1}\n', 12) == b'{"a": 1}\n   '
    assert history_store.padded(b'{"a": 1}\n', 4) is None


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[Path]:
    """A folder that takes no new file (`chattr +i`), as an administrator leaves one."""
    folder = tmp_path / "job"
    folder.mkdir()
    yield folder
    subprocess.run(["chattr", "-i", str(folder)], check=False, capture_output=True)


def freeze(folder: Path) -> None:
    done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"chattr +i needs root and a filesystem that has it: {done.stderr!r}")


ENV = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "n1"}


def test_a_supervisor_closes_its_run_in_place_in_an_immutable_folder(
    immutable: Path, caplog: pytest.LogCaptureFixture
) -> None:
    supervisor = Supervisor(ENV, Slurm(FakeRunner({})), immutable, 3, 3)
    assert supervisor.before_step() is None
    freeze(immutable)
    with caplog.at_level(logging.WARNING):
        supervisor._record(0, None, COMPLETED)
    runs = json.loads((immutable / "history.json").read_text())["runs"]
    assert [(r["reason"], r["action"]) for r in runs] == [("completed", "none")]
    assert "could not be replaced (Operation not permitted); rewritten in place" in caplog.text
    assert History.load(immutable, 7).runs[0].step_status == 0


def test_a_history_that_cannot_be_written_at_all_is_one_line(
    immutable: Path, caplog: pytest.LogCaptureFixture
) -> None:
    supervisor = Supervisor(ENV, Slurm(FakeRunner({})), immutable, 3, 3)
    assert supervisor.before_step() is None
    history = immutable / "history.json"
    subprocess.run(["chattr", "+i", str(history)], check=False, capture_output=True)
    freeze(immutable)
    try:
        with caplog.at_level(logging.ERROR):
            supervisor._record(0, None, COMPLETED)
            supervisor._record(0, None, COMPLETED)
    finally:
        subprocess.run(["chattr", "-i", str(history)], check=False, capture_output=True)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        f"supervisor: could not write the job's history {history}: Operation not permitted "
        "(EPERM); the job goes on and ends as its step does (SLURM's state says how); "
        "`hpclaunch status` compares the history with SLURM's state. Fix: the folder refuses "
        f"changes, an immutable attribute most likely: `lsattr -d {immutable}` shows an `i`, "
        f"and `chattr -i {immutable}` (as root) clears it"
    ]
    assert json.loads(history.read_text())["runs"][0]["reason"] is None  # still open
