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
