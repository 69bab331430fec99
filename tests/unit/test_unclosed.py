"""Runs the history leaves open after they ended: what `hpclaunch status` says of them,
from plain values (hpclaunch.ops.unclosed)."""

from __future__ import annotations

import pytest

from hpclaunch.ops.unclosed import error_of, note, texts
from hpclaunch.slurm.states import JobState

LOG = (
    "hpclaunch[job 7]: supervisor: step ended with status 0\n"
    "hpclaunch[job 7]: supervisor: could not write the job's history /j/7/history.json: "
    "No space left on device (ENOSPC); the job goes on and ends as its step does. "
    "Fix: free space on its filesystem\n"
    "hpclaunch[job 7]: supervisor: job completed\n"
)


def test_a_run_still_running_gets_no_text() -> None:
    assert texts([(0, None)], JobState.RUNNING, None) == {}
    assert texts([(0, None)], None, None) == {}  # SLURM not asked: nothing is known


@pytest.mark.parametrize(
    ("state", "error", "text"),
    [
        (JobState.COMPLETED, "No space left on device (ENOSPC)", "history not writable"),
        (JobState.FAILED, None, "no end recorded"),
    ],
)
def test_the_last_open_run_of_an_ended_job_says_slurms_state(
    state: JobState, error: str | None, text: str
) -> None:
    assert texts([(0, "time limit"), (1, None)], state, error) == {
        1: f"{text} (SLURM: {state.value})"
    }


def test_a_requeued_job_and_an_earlier_open_run() -> None:
    assert texts([(0, None), (1, None)], JobState.PENDING, None) == {
        0: "no end recorded (run 1 followed)",
        1: "no end recorded (SLURM: requeued)",
    }
    assert texts([(0, None), (1, None)], JobState.RUNNING, None) == {
        0: "no end recorded (run 1 followed)"
    }


def test_the_note_says_why_when_the_batch_log_does() -> None:
    said = note(1, JobState.COMPLETED, "No space left on device (ENOSPC)", "/j/7/history.json")
    assert said == (
        "run 1's end is not in /j/7/history.json: its supervisor could not write it "
        "(No space left on device (ENOSPC)); SLURM says COMPLETED, and the batch log says "
        "the rest"
    )
    dead = note(0, JobState.FAILED, None, "/j/7/history.json")
    assert dead.startswith("run 0 ended without its supervisor recording the end in /j/7/")
    assert dead.endswith(
        "(the supervisor died first: killed, or its batch host lost); SLURM says FAILED"
    )


def test_the_supervisors_line_is_found_in_the_batch_log() -> None:
    assert error_of(LOG) == "No space left on device (ENOSPC)"
    assert error_of("hpclaunch[job 7]: supervisor: job completed\n") is None
