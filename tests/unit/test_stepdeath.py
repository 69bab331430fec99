"""Agents and srun killed by a signal: srun's lines, the policy, the budget."""

from __future__ import annotations

import io
import signal
import subprocess
import sys

import pytest

from hpclaunch.jobdir.failures import Finding, Verdict
from hpclaunch.jobdir.history import Action, History, Reason, finish
from hpclaunch.recovery.policy import Decision, Situation, decide
from hpclaunch.recovery.stepdeath import Death, Tee, deaths, describe

# What srun printed on the sandbox when node 2's agent was SIGKILLed mid-training.
SANDBOX = """\
srun: error: n2: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=2.0
slurmstepd-n1: error: *** STEP 2.0 ON n1 CANCELLED AT 2026-11-24T18:20:05 ***
srun: error: n1: task 0: Exited with exit code 143
srun: Force Terminated StepId=2.0
"""


def test_deaths_names_the_killed_nodes_only() -> None:
    assert deaths(SANDBOX.splitlines()) == (Death("n2", "SIGKILL"),)
    lines = [
        "srun: error: n3: tasks 2-3: Segmentation fault (core dumped)",
        "srun: error: n3: task 2: Killed",  # the same node again: its first death counts
        "srun: error: gpu-a01: task 0: Aborted\n",
        "srun: error: n4: task 3: Exited with exit code 1",
        "[rank1] srun: error: n5: task 1: Killed",  # a rank's own output, not srun's
    ]
    assert deaths(lines) == (Death("n3", "SIGSEGV"), Death("gpu-a01", "SIGABRT"))
    assert deaths(["srun: error: n2: task 1: Something new"]) == (Death("n2", "Something new"),)
    assert deaths([]) == ()


# A bad node's agent exited 1; srun then ended the step, and SLURM's SIGTERM killed
# the other agent before it could handle it (seen on the sandbox).
ENDED_BY_SRUN = """\
srun: error: n2: task 1: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=11.0
srun: error: n1: task 0: Terminated
srun: Force Terminated StepId=11.0
"""


def test_deaths_after_srun_ends_the_step_are_not_counted() -> None:
    assert deaths(ENDED_BY_SRUN.splitlines()) == ()
    lines = ENDED_BY_SRUN.splitlines()[1:]  # no task line before srun's own
    assert deaths(lines) == ()
    aborted = ["srun: Job step aborted: Waiting up to 7 seconds", "srun: error: n1: task 0: Killed"]
    assert deaths(aborted) == ()


def test_describe() -> None:
    assert describe((Death("n2", "SIGKILL"),), None) == "the agent on n2 was killed by SIGKILL"
    assert describe((), int(signal.SIGKILL)) == (
        "srun (the job step, on the batch host) was killed by SIGKILL"
    )


@pytest.mark.parametrize(
    ("situation", "expected"),
    [
        # a killed agent: a requeue without its node while both budgets last
        (
            Situation(137, None, 0, None, 3, died=("n2",)),
            Decision(Action.REQUEUE, Reason.AGENT_DIED, 0, ("n2",)),
        ),
        (
            Situation(137, None, 0, None, 3, died=("n2",), failure_requeues=2),
            Decision(Action.GIVE_UP, Reason.AGENT_DIED, 4, ("n2",)),
        ),
        (
            Situation(137, None, 3, None, 3, died=("n2",)),
            Decision(Action.GIVE_UP, Reason.AGENT_DIED, 4, ("n2",)),
        ),
        # srun killed: a requeue on the same nodes, from the same budget
        (
            Situation(137, None, 0, None, 3, srun_killed=True),
            Decision(Action.REQUEUE, Reason.AGENT_DIED, 0),
        ),
        (
            Situation(137, None, 1, None, 3, srun_killed=True, failure_requeues=2),
            Decision(Action.GIVE_UP, Reason.AGENT_DIED, 4),
        ),
        # the survivors' records of a lost peer (or their hang) do not hide the death
        (
            Situation(137, None, 0, None, 3, Finding(Verdict.HANG, (), "timed out"), died=("n2",)),
            Decision(Action.REQUEUE, Reason.AGENT_DIED, 0, ("n2",)),
        ),
        # but a bug or a full shared folder ends the job as before
        (
            Situation(1, None, 0, None, 3, Finding(Verdict.BUG, (), "ValueError"), died=("n2",)),
            Decision(Action.NONE, Reason.BUG, 1),
        ),
        # a signal the supervisor forwarded ended the step: not a death
        (
            Situation(137, int(signal.SIGTERM), 0, None, 3, died=("n2",)),
            Decision(Action.NONE, Reason.CANCELLED, 137),
        ),
        (
            Situation(137, int(signal.SIGUSR1), 0, None, 3, srun_killed=True),
            Decision(Action.REQUEUE, Reason.TIME_LIMIT, 0),
        ),
    ],
)
def test_decide_on_a_death(situation: Situation, expected: Decision) -> None:
    assert decide(situation) == expected


def test_a_death_counts_against_the_failure_requeue_budget() -> None:
    history = History(job_id=7, max_requeues=3)
    for count, reason in enumerate((Reason.AGENT_DIED, Reason.BAD_NODES, Reason.TIME_LIMIT)):
        run = history.start({"SLURM_JOB_NODELIST": "n[1-2]"}, count)
        finish(run, 137, None, Decision(Action.REQUEUE, reason, 0))
    assert history.failure_requeues == 2


def test_tee_passes_every_line_on_and_keeps_srun_errors(capfd: pytest.CaptureFixture[str]) -> None:
    text = "a rank's line\n" + SANDBOX + "no newline at the end"
    child = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.stderr.write({text!r})"], stderr=subprocess.PIPE
    )
    assert child.stderr is not None
    tee = Tee(child.stderr).start()
    assert child.wait() == 0
    assert tee.deaths() == (Death("n2", "SIGKILL"),)
    assert capfd.readouterr().err == text
    kept = [line for line in SANDBOX.splitlines(keepends=True) if line.startswith("srun: ")]
    assert tee.kept == kept and len(kept) == 4


def test_tee_of_an_empty_pipe() -> None:
    assert Tee(io.BytesIO(b"")).start().deaths() == ()
