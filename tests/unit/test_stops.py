"""A stop the supervisor did not see (hpclaunch.recovery.stops): the signal that
stopped every agent, read from their exit statuses and their notes in the job folder."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpclaunch.jobdir import agent_ends
from hpclaunch.jobdir.agent_ends import AgentEnd
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.recovery import stops

TERM, USR1, USR2 = signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ([143, 143], TERM),
        ([140, 140, 140], USR2),
        # submitit's _interrupt() sends SIGTERM, then SIGUSR2: a warning wins
        ([143, 140], USR2),
        ([138, 143, 140], USR1),
        ([130], signal.SIGINT),
        # any other end: not a stop
        ([143, 0], None),
        ([143, 1], None),
        ([137], None),  # SIGKILL: a death, not a stop
        ([129], None),  # SIGHUP
        ([], None),
    ],
)
def test_the_signal_that_stopped_every_agent(
    statuses: list[int], expected: signal.Signals | None
) -> None:
    assert stops.stopped_by(statuses) == expected


@dataclass(frozen=True)
class Step:
    status: int = 0
    signals: tuple[int, ...] = ()
    died: tuple[object, ...] = ()
    srun_signal: int | None = None


def test_a_quiet_step_whose_agents_all_noted_a_stop_was_stopped(tmp_path: Path) -> None:
    folder = JobFolder(tmp_path)
    agent_ends.write(folder, 1, AgentEnd("n1", 143))
    assert stops.unseen(tmp_path, 1, ["n1", "n2"], Step()) is None  # n2 noted nothing yet
    agent_ends.write(folder, 1, AgentEnd("n2", 140))
    assert stops.unseen(tmp_path, 1, ["n1", "n2"], Step()) == USR2
    assert stops.unseen(tmp_path, 0, ["n1", "n2"], Step()) is None  # another run's notes
    # The supervisor saw a signal, or an agent was killed: not an unseen stop.
    assert stops.unseen(tmp_path, 1, ["n1", "n2"], Step(signals=(int(USR1),))) is None
    assert stops.unseen(tmp_path, 1, ["n1", "n2"], Step(died=("n2",))) is None
    assert stops.unseen(tmp_path, 1, ["n1", "n2"], Step(srun_signal=9)) is None
    assert stops.unseen(None, 1, ["n1", "n2"], Step()) is None


@pytest.mark.parametrize(
    ("first", "status", "ended", "expected"),
    [
        # srun timed out waiting for the stopped agents and said 0 (scancel): stopped
        (TERM, 0, {"n1": 143, "n2": 143}, 143),
        (TERM, 0, {"n1": 143}, 143),  # n2's agent was killed before it noted its end
        (TERM, 0, {}, 143),
        (USR1, 0, {"n1": 0, "n2": 138}, 138),  # the time-limit warning: requeued after
        # every agent ended its training with 0 before the signal reached it: completed
        (TERM, 0, {"n1": 0, "n2": 0}, None),
        # no signal, or srun said how the step ended: its status stands
        (None, 0, {}, None),
        (TERM, 143, {"n1": 143, "n2": 143}, None),
        (signal.SIGHUP, 0, {}, None),
    ],
)
def test_a_step_that_srun_says_ended_0_after_a_signal(
    first: int | None, status: int, ended: dict[str, int], expected: int | None
) -> None:
    assert stops.stopped_status(first, status, ended, ["n1", "n2"]) == expected


def test_the_agents_notes_tell_a_stopped_step_from_a_completed_one(tmp_path: Path) -> None:
    folder = JobFolder(tmp_path)
    agent_ends.write(folder, 0, AgentEnd("n1", 0))
    agent_ends.write(folder, 0, AgentEnd("n2", 143))
    stopped = Step(0, (int(TERM),))
    assert stops.not_completed(tmp_path, 0, ["n1", "n2"], stopped) == 143
    agent_ends.write(folder, 0, AgentEnd("n2", 0))
    assert stops.not_completed(tmp_path, 0, ["n1", "n2"], stopped) is None
    assert stops.not_completed(tmp_path, 0, ["n1", "n2"], Step(143, (int(TERM),))) is None


def test_missing_end_notes_are_said_missing_not_taken_for_stopped_agents(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A full job folder refuses the agents' end notes: the step is taken as stopped (a
    # requeue after the warning is the safe side), and the line says only what is known.
    stopped = Step(0, (int(TERM),))
    caplog.set_level("WARNING")
    assert stops.not_completed(tmp_path, 0, ["n1", "n2"], stopped) == 143
    [line] = [r.getMessage() for r in caplog.records]
    assert line == (
        "supervisor: the step ended with status 0 after SIGTERM, but the agents' end notes "
        "do not say that every agent finished its training (no agent's end note was found: "
        "never written, or the job folder could not take it): the step is taken as stopped "
        "by SIGTERM, not completed"
    )
    agent_ends.write(JobFolder(tmp_path), 0, AgentEnd("n1", 0))
    caplog.clear()
    assert stops.not_completed(tmp_path, 0, ["n1", "n2"], stopped) == 143
    assert "(exit statuses noted: n1 0; none from n2: never written, or the job folder" in (
        caplog.records[0].getMessage()
    )
