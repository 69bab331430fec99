"""The job-wide attempt number an agent gives its workers (hpclaunch.node.recording_agent):
plain numbers."""

from __future__ import annotations

from hpclaunch.node.recording_agent import next_attempt


def test_attempt_numbers_never_go_back_when_the_rendezvous_round_does() -> None:
    assert next_attempt(0, None) == 0
    assert next_attempt(3, 1) == 3  # rounds that grow are the attempts
    assert next_attempt(0, 4) == 5  # the round counts from 0 again: its state was lost
    assert next_attempt(4, 4) == 5
