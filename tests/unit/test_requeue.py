"""The supervisor's policy and history: plain values."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from hpclaunch.jobdir.history import Action, History, HistoryError, Reason, finish
from hpclaunch.recovery.policy import Decision, Situation, decide
from hpclaunch.slurm.commands import parse_show_job

S, D = Situation, Decision
USR1, TERM = int(signal.SIGUSR1), int(signal.SIGTERM)


@pytest.mark.parametrize(
    ("situation", "expected"),
    [
        # the time-limit warning: one requeue by the supervisor while the budget lasts
        (S(138, USR1, 0, None, 3), D(Action.REQUEUE, Reason.TIME_LIMIT, 0)),
        (S(138, int(signal.SIGUSR2), 2, None, 3), D(Action.REQUEUE, Reason.TIME_LIMIT, 0)),
        (S(138, USR1, 3, None, 3), D(Action.GIVE_UP, Reason.OVER_BUDGET, 4)),
        # the step ended by itself after the warning: its own result, no requeue
        (S(0, USR1, 0, None, 3), D(Action.NONE, Reason.COMPLETED, 0)),
        (S(1, USR1, 0, None, 3), D(Action.NONE, Reason.FAILED, 1)),
        # SLURM requeues when its Restarts went up, whatever came first
        (S(143, TERM, 0, 1, 3), D(Action.SLURM_REQUEUES, Reason.REQUEUED_BY_SLURM, 0)),
        (S(138, USR1, 0, 1, 3), D(Action.SLURM_REQUEUES, Reason.REQUEUED_BY_SLURM, 0)),
        (S(143, TERM, 1, 1, 3), D(Action.NONE, Reason.CANCELLED, 143)),
        (S(143, TERM, 0, None, 3), D(Action.NONE, Reason.CANCELLED, 143)),
        # `hpclaunch cancel` wrote its note: never a requeue, even after the warning
        (S(138, USR1, 0, None, 3, cancelled=True), D(Action.NONE, Reason.CANCELLED, 138)),
        (S(143, TERM, 0, 1, 3, cancelled=True), D(Action.NONE, Reason.CANCELLED, 143)),
        # SIGTERM sent to the steps only (scancel --signal TERM, submitit's _interrupt):
        # a preemption without SLURM's requeue, so the supervisor requeues
        (S(143, TERM, 0, 0, 3, steps_only=True), D(Action.REQUEUE, Reason.STEPS_STOPPED, 0)),
        (S(143, TERM, 3, 3, 3, steps_only=True), D(Action.GIVE_UP, Reason.OVER_BUDGET, 4)),
        (
            S(143, TERM, 0, 0, 3, steps_only=True, cancelled=True),
            D(Action.NONE, Reason.CANCELLED, 143),
        ),
        # no signal: the step's own result
        (S(0, None, 0, None, 3), D(Action.NONE, Reason.COMPLETED, 0)),
        (S(1, None, 0, None, 3), D(Action.NONE, Reason.FAILED, 1)),
    ],
)
def test_decide(situation: Situation, expected: Decision) -> None:
    assert decide(situation) == expected


def test_history_round_trip(tmp_path: Path) -> None:
    history = History.load(tmp_path, 12, 3)
    assert history.runs == []
    run = history.start({"SLURM_JOB_NODELIST": "n[1-2]"}, 0)
    finish(run, 138, USR1, Decision(Action.REQUEUE, Reason.TIME_LIMIT, 0))
    history.save(tmp_path)
    again = History.load(tmp_path, 12, 3)
    again.start({"SLURM_JOB_NODELIST": "n[2-3]"}, 1)
    again.save(tmp_path)
    data = json.loads((tmp_path / "history.json").read_text())
    assert data["requeues"] == 1
    runs = [(r["requeue_count"], r["nodes"], r["first_signal"], r["action"]) for r in data["runs"]]
    assert runs == [(0, "n[1-2]", "SIGUSR1", "requeue"), (1, "n[2-3]", None, None)]
    assert [p.name for p in tmp_path.iterdir()] == ["history.json"]
    for broken in ("{", "[]", '{"runs": [{"surprise": 1}]}'):
        (tmp_path / "history.json").write_text(broken)
        with pytest.raises(HistoryError, match=r"history\.json is not a history .* move it aside"):
            History.load(tmp_path, 12, 3)


def test_parse_show_job() -> None:
    text = "JobId=5 JobName=train\n   Requeue=1 Restarts=2 BatchFlag=1\n   Command=/a b c\n"
    fields = parse_show_job(text)
    assert fields["Restarts"] == "2" and fields["JobName"] == "train"
    assert fields["Command"] == "/a"
