"""The job-wide attempt number an agent gives its workers (hpclaunch.node.recording_agent):
plain numbers."""

from __future__ import annotations

from pathlib import Path

from hpclaunch.jobdir import attempts
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.node.recording_agent import next_attempt


def test_attempt_numbers_never_go_back_when_the_rendezvous_round_does() -> None:
    assert next_attempt(0, None) == 0
    assert next_attempt(3, 1) == 3  # rounds that grow are the attempts
    assert next_attempt(0, 4) == 5  # the round counts from 0 again: its state was lost
    assert next_attempt(4, 4) == 5


def test_a_spare_that_never_ran_numbers_on_from_the_attempts_logs() -> None:
    # A spare joins after an etcd wipe (round 1 again) with no attempt of its own: it
    # takes one past the highest attempt logged, not the round (whose rank logs exist).
    assert next_attempt(1, None, 4) == 5
    assert next_attempt(5, None, 4) == 5  # rounds that grow: the round
    assert next_attempt(4, None, 4) == 4  # others began this round first
    assert next_attempt(0, None, None) == 0  # nothing logged yet
    assert next_attempt(1, 4, 9) == 5  # an agent that ran goes by its own attempts


def test_the_highest_attempt_is_read_from_every_node_s_log(tmp_path: Path) -> None:
    folder = JobFolder(tmp_path)
    assert attempts.highest(folder, 0) is None
    attempts.append(folder, 0, attempts.AttemptEvent("n1", 3, attempts.BEGIN, 1.0))
    attempts.append(folder, 0, attempts.AttemptEvent("n2", 4, attempts.BEGIN, 2.0))
    attempts.append(folder, 1, attempts.AttemptEvent("n2", 9, attempts.BEGIN, 2.0))
    assert attempts.highest(folder, 0) == 4
