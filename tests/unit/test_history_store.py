"""history.json written by the current run only: the merge rule on plain values, the
locked compare-and-write with real files, and a stale supervisor that does not requeue."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from hpclaunch.jobdir.history import Action, History, Reason, finish
from hpclaunch.jobdir.history_store import LOCK_NAME, LOST_NOTE, merge, save_run
from hpclaunch.ops.status import gather
from hpclaunch.recovery.policy import Decision
from hpclaunch.recovery.supervisor import Supervisor
from hpclaunch.slurm.commands import CommandResult, FakeRunner, Slurm


def run(count: int, token: str, reason: str | None = None, started: float = 0.0) -> dict[str, Any]:
    action = None if reason is None else "none"
    return {
        "requeue_count": count,
        "token": token,
        "started": started or 100.0 + count,
        "reason": reason,
        "action": action,
        "error": None,
    }


def history(*runs: dict[str, Any], budget: int = 3) -> dict[str, Any]:
    return {"job_id": 7, "max_requeues": budget, "runs": list(runs)}


def reasons(data: dict[str, Any] | None) -> list[tuple[int, str | None]]:
    assert data is not None
    return [(r["requeue_count"], r["reason"]) for r in data["runs"]]


def test_the_first_write_is_ours() -> None:
    ours = history(run(0, "a"))
    assert merge(None, ours, "a") == (ours, None)


def test_the_newest_run_writes_and_closes_older_open_runs_as_lost() -> None:
    disk = history(run(0, "a"), run(1, "b", "completed"), budget=1)
    merged, why = merge(disk, history(run(2, "c"), budget=5), "c")
    assert why is None
    assert reasons(merged) == [(0, "lost"), (1, "completed"), (2, None)]
    assert merged is not None and merged["max_requeues"] == 5  # ours: the newest run's
    lost = merged["runs"][0]
    assert (lost["action"], lost["error"]) == (Action.SLURM_REQUEUES.value, LOST_NOTE)


def test_the_newest_run_replaces_only_its_own_entry() -> None:
    disk = history(run(0, "a", "time limit"), run(1, "b"))
    # the supervisor's memory of run 0 is older than the disk's: the disk's stays
    merged, _ = merge(disk, history(run(0, "a"), run(1, "b", "completed")), "b")
    assert reasons(merged) == [(0, "time limit"), (1, "completed")]


def test_a_stale_run_closed_by_a_newer_one_writes_nothing() -> None:
    disk = history(run(0, "a", "lost"), run(1, "b", "completed"))
    merged, why = merge(disk, history(run(0, "a", "bad nodes")), "a")
    assert merged is None
    assert why is not None and why.startswith("run 1 (started ")
    assert "recorded this run as 'lost'; not overwriting the history" in why


def test_a_stale_run_still_open_records_only_its_entry() -> None:
    disk = history(run(0, "a"), run(1, "b"), budget=1)
    merged, why = merge(disk, history(run(0, "a", "failed"), budget=9), "a")
    assert reasons(merged) == [(0, "failed"), (1, None)]
    assert merged is not None and merged["max_requeues"] == 1  # the newer run's header
    assert why is not None and why.endswith("recording only this run's entry")


def test_a_stale_run_missing_from_the_file_goes_in_by_requeue_count() -> None:
    disk = history(run(1, "b", "completed"))
    merged, _ = merge(disk, history(run(0, "a", "failed")), "a")
    assert reasons(merged) == [(0, "failed"), (1, "completed")]


def test_a_later_run_of_the_same_count_is_newer() -> None:
    disk = history(run(0, "a", "lost", started=100.0), run(0, "z", started=200.0))
    merged, why = merge(disk, history(run(0, "a", "completed", started=100.0)), "a")
    assert merged is None and why is not None


def test_a_run_not_in_ours_is_refused() -> None:
    with pytest.raises(ValueError, match="no run with token 'x'"):
        merge(None, history(run(0, "a")), "x")


TIME_LIMIT = Decision(Action.REQUEUE, Reason.TIME_LIMIT, 0)
COMPLETED = Decision(Action.NONE, Reason.COMPLETED, 0)


def test_a_stale_supervisor_finishing_last_keeps_every_run(tmp_path: Path) -> None:
    old = History.load(tmp_path, 7, 3)
    old_run = old.start({"SLURM_JOB_NODELIST": "n1"}, 0)
    assert save_run(tmp_path, old, old_run)
    new = History.load(tmp_path, 7, 3)  # the batch host of run 0 is cut off; SLURM requeued
    new_run = new.start({"SLURM_JOB_NODELIST": "n2"}, 1)
    assert save_run(tmp_path, new, new_run)
    finish(new_run, 0, None, COMPLETED)
    assert save_run(tmp_path, new, new_run)
    finish(old_run, 138, int(signal.SIGUSR1), TIME_LIMIT)  # the host is back: stale
    assert not save_run(tmp_path, old, old_run)
    data = json.loads((tmp_path / "history.json").read_text())
    assert reasons(data) == [(0, "lost"), (1, "completed")]
    assert data["requeues"] == 1  # SLURM requeued the lost run once
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LOCK_NAME, "history.json"])


def test_status_shows_the_lost_run(tmp_path: Path) -> None:

    test_a_stale_supervisor_finishing_last_keeps_every_run(tmp_path)
    status = gather(7, None, {"HOME": str(tmp_path / "home")}, tmp_path)
    assert [(r.requeue, r.reason, r.action) for r in status.runs] == [
        (0, "lost", "SLURM requeues"),
        (1, "completed", "none"),
    ]


def _scontrol(restarts: int) -> FakeRunner:
    def scontrol(argv: tuple[str, ...]) -> CommandResult:
        if argv[1] == "show":
            return CommandResult(argv, 0, f"JobId=7 JobState=RUNNING Restarts={restarts}\n", "")
        return CommandResult(argv, 0, "", "")

    def sinfo(argv: tuple[str, ...]) -> CommandResult:
        return CommandResult(argv, 0, "n1 allocated\n", "")

    return FakeRunner({"scontrol": scontrol, "sinfo": sinfo})


@pytest.mark.parametrize("restarts", [0, 1])
def test_a_supervisor_whose_job_moved_on_does_not_requeue(tmp_path: Path, restarts: int) -> None:
    runner = _scontrol(restarts)
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "n1"}
    supervisor = Supervisor(env, Slurm(runner), tmp_path, 3, 3)
    assert supervisor.before_step() is None
    bad_nodes = Decision(Action.REQUEUE, Reason.BAD_NODES, 0, ("n1",))
    acted = supervisor._act(bad_nodes)
    requeued = ("scontrol", "requeue", "7") in runner.calls
    if restarts == 0:  # the job is still this run's: the requeue goes ahead
        assert (acted, requeued) == (bad_nodes, True)
    else:  # SLURM requeued the job since this run started: not again
        assert (acted, requeued) == (Decision(Action.NONE, Reason.LOST, 0), False)


@pytest.mark.parametrize("restarts", [0, 1])
def test_a_cancel_is_recorded_at_slurms_signal(tmp_path: Path, restarts: int) -> None:
    """scancel: SLURM kills the supervisor KillWait seconds after its SIGTERM, which can
    be before srun returns (agents stuck in a save): the history says cancelled by then.
    A SIGTERM with SLURM's Restarts raised is SLURM's requeue."""
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "n1"}
    supervisor = Supervisor(env, Slurm(_scontrol(restarts)), tmp_path, 3, 3)
    assert supervisor.before_step() is None
    supervisor.on_first_signal(signal.SIGTERM)
    [run] = json.loads((tmp_path / "history.json").read_text())["runs"]
    ended = (run.get("reason"), run.get("action"))
    said = [("cancelled", "none"), ("requeued by SLURM", "SLURM requeues")][restarts]
    assert ended == said, run


def test_a_torn_history_is_set_aside_and_the_run_starts_a_new_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A crash in an in-place rewrite (a full job folder) can leave history.json torn:
    # the next run still steps, with a new history, the old file kept aside.
    history = History(7, 3)
    history.start({"SLURM_JOB_NODELIST": "n1"}, 0)
    history.save(tmp_path)
    path = tmp_path / "history.json"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NODELIST": "n1"}
    caplog.set_level("ERROR")
    supervisor = Supervisor(env, Slurm(_scontrol(1)), tmp_path, 3, 3)
    assert supervisor.history is not None
    assert [r.requeue_count for r in supervisor.history.runs] == [1]
    [aside] = tmp_path.glob("history.json.unreadable-*")
    assert aside.read_bytes() == whole[: len(whole) // 2]
    [line] = [r.getMessage() for r in caplog.records if "history" in r.getMessage()]
    assert line.startswith(f"supervisor: history: {path} could not be read (JSONDecodeError")
    assert f"this run starts a new history (the old file is kept as {aside})" in line
    assert supervisor.before_step() is None
    assert json.loads(path.read_text())["runs"][0]["requeue_count"] == 1
