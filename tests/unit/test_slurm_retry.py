"""SLURM commands on the job wait out an unreachable controller (hpclaunch.slurm.retry),
with a fake clock and SLURM's answers as recorded on the sandbox (slurm-wlm 22.05.8)
with slurmctld stopped and running. The sandbox test of the same is
tests/integration/test_controller_outage.py."""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, field

import pytest

from hpclaunch.errors import ExitCode, SlurmError, SlurmNotFound
from hpclaunch.recovery.job_commands import requeue_job
from hpclaunch.recovery.supervisor import StepResult, Supervisor
from hpclaunch.slurm.commands import CommandResult, FakeRunner, Slurm
from hpclaunch.slurm.retry import (
    Patience,
    SlurmUnreachable,
    Window,
    backoff_s,
    describe,
    persist,
    unreachable,
)

JOB = 7
# What scontrol printed on the sandbox, slurmctld stopped (each after ~4 s) ...
DOWN = {
    "requeue": f"Unexpected message received for job {JOB}",
    "update": f"Unexpected message received for job {JOB}",
    "show": "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
}
PING_DOWN = "Slurmctld(primary) at vm is DOWN\n"
# ... and slurmctld running, refusing.
DISABLED = f"Requested operation is presently disabled for job {JOB}"
INVALID = f"Invalid job id specified for job {JOB}"
SHOW_JOB = f"JobId={JOB} JobName=train\n   JobState=RUNNING Reason=None Requeue=1 Restarts=0\n"


@dataclass
class FakeClock:
    now_s: float = 0.0
    sleeps: list[float] = field(default_factory=list)

    def now(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now_s += seconds


@dataclass
class Controller:
    """scontrol against a slurmctld that is away until ``back_at`` (never: None), and
    that then answers ``refusal`` to a requeue, if one is given."""

    clock: FakeClock
    back_at: float | None
    refusal: str | None = None
    restarts: int = 0

    def up(self) -> bool:
        return self.back_at is not None and self.clock.now() >= self.back_at

    def __call__(self, argv: tuple[str, ...]) -> CommandResult:
        verb = argv[1]
        if verb == "ping":
            if self.up():
                return CommandResult(argv, 0, "Slurmctld(primary) at vm is UP\n")
            return CommandResult(argv, 1, PING_DOWN)
        if not self.up():
            self.clock.now_s += 4.0  # scontrol's own tries, about MessageTimeout
            return CommandResult(argv, 1, "", DOWN[verb] + "\n")
        if verb == "requeue" and self.refusal is not None:
            return CommandResult(argv, 1, "", self.refusal + "\n")
        if verb == "requeue":
            self.restarts += 1
        if verb == "show":
            return CommandResult(
                argv, 0, SHOW_JOB.replace("Restarts=0", f"Restarts={self.restarts}")
            )
        return CommandResult(argv, 0)


def slurm_for(controller: Controller) -> tuple[Slurm, FakeRunner]:
    runner = FakeRunner({"scontrol": controller})
    return Slurm(runner), runner


def requeues(runner: FakeRunner) -> list[tuple[str, ...]]:
    return [call for call in runner.calls if call[1] == "requeue"]


def test_a_requeue_waits_out_a_controller_restart(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    controller = Controller(clock, back_at=40.0)
    slurm, runner = slurm_for(controller)
    window = Window(120.0, "until the job's time limit", clock=clock)
    with caplog.at_level(logging.INFO):
        persist(lambda s: s.requeue(JOB), slurm, window, who="supervisor: ")
    assert controller.restarts == 1
    # Attempts at 0, 5, 11, 19, 31 (4 s each, then 1, 2, 4, 8 s of backoff), then 45.
    assert clock.sleeps == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert len(requeues(runner)) == 6
    first = caplog.records[0].getMessage()
    assert first == (
        f"supervisor: scontrol requeue {JOB} failed, SLURM's controller did not answer "
        f"(Unexpected message received for job {JOB}); attempt 1, next try in 1 s, 116 s "
        "left (until the job's time limit)"
    )
    *retries, answered = (r.getMessage() for r in caplog.records)
    assert [line.split("; ")[1].split(",")[0] for line in retries] == [
        f"attempt {n}" for n in range(1, 6)
    ]
    assert answered == (
        f"supervisor: scontrol requeue {JOB}: SLURM's controller answered at attempt 6, "
        "45 s after the first"
    )


@pytest.mark.parametrize("refusal", [DISABLED, INVALID])
def test_a_refusal_is_not_retried(refusal: str) -> None:
    clock = FakeClock()
    slurm, runner = slurm_for(Controller(clock, back_at=0.0, refusal=refusal))
    with pytest.raises(SlurmError) as raised:
        persist(lambda s: s.requeue(JOB), slurm, Window(120.0, "x", clock=clock))
    assert not isinstance(raised.value, SlurmUnreachable)
    assert len(requeues(runner)) == 1 and clock.sleeps == []
    assert describe(raised.value) == f"scontrol requeue {JOB} failed: {refusal}"


def test_running_out_of_time_ends_with_one_clear_line() -> None:
    clock = FakeClock()
    slurm, runner = slurm_for(Controller(clock, back_at=None))
    window = Window(30.0, "until the job's time limit", clock=clock)
    with pytest.raises(SlurmUnreachable) as raised:
        persist(lambda s: s.requeue(JOB), slurm, window)
    # Attempts at 0, 5, 11, 19, and at 31 (after a last wait cut to the 7 s left).
    assert clock.sleeps == [1.0, 2.0, 4.0, 7.0] and len(requeues(runner)) == 5
    assert describe(raised.value) == (
        f"scontrol requeue {JOB}: gave up waiting for SLURM's controller after 34 s (until "
        "the job's time limit; 5 attempts of this command); SLURM said: Unexpected message "
        f"received for job {JOB}"
    )
    assert raised.value.exit_code is ExitCode.SLURM


def test_a_closed_window_still_gets_one_attempt() -> None:
    clock = FakeClock(now_s=100.0)
    slurm, runner = slurm_for(Controller(clock, back_at=0.0))
    persist(lambda s: s.requeue(JOB), slurm, Window(50.0, "x", clock=clock))
    assert len(requeues(runner)) == 1


def test_unreachable_tells_an_outage_from_a_refusal() -> None:
    def failed(stderr: str, returncode: int | None = 1) -> SlurmError:
        return SlurmError(("scontrol", "requeue", "7"), returncode, stderr, "scontrol failed")

    up = Slurm(FakeRunner({"scontrol": lambda argv: CommandResult(argv, 0, "is UP")}))
    down = Slurm(FakeRunner({"scontrol": lambda argv: CommandResult(argv, 1, PING_DOWN)}))
    for text in (*DOWN.values(), "Socket timed out on send/recv operation"):
        assert unreachable(failed(text), up)
    assert unreachable(failed("", returncode=None), up)  # the command timed out
    assert not unreachable(failed(DISABLED), up)
    # An answer not known either way: scontrol ping settles it.
    assert not unreachable(failed("Some new error"), up)
    assert unreachable(failed("Some new error"), down)
    with pytest.raises(SlurmNotFound) as missing:
        Slurm(FakeRunner({})).requeue(JOB)
    assert not unreachable(missing.value, down)  # no scontrol here: nothing to wait for


def test_the_backoff_doubles_up_to_ten_seconds() -> None:
    assert [backoff_s(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_the_window_runs_from_the_signal_or_from_the_first_command() -> None:
    clock = FakeClock(now_s=10.0)
    after_signal = Patience(signal_lead_s=120, after_failure_s=300, clock=clock)
    after_signal.signalled()
    clock.now_s = 50.0
    after_signal.signalled()  # the first signal counts
    assert after_signal.window().deadline == 130.0
    assert "until the job's time limit" in after_signal.window().why
    failed = Patience(signal_lead_s=120, after_failure_s=300, clock=clock)
    assert failed.window() == Window(350.0, "--slurm-patience 300 s", opened=50.0)
    clock.now_s = 60.0
    assert failed.window().deadline == 350.0


def test_a_requeue_whose_answer_was_lost_is_not_repeated() -> None:
    """The first requeue timed out after the controller had done it: the second is
    refused ("Job is pending execution"), and Restarts shows that it went through."""
    clock = FakeClock()
    controller = Controller(clock, back_at=0.0)

    def scontrol(argv: tuple[str, ...]) -> CommandResult:
        if argv[1] == "requeue" and controller.restarts == 1:
            return CommandResult(argv, 1, "", f"Job is pending execution for job {JOB}\n")
        result = controller(argv)
        if argv[1] == "requeue":
            raise SlurmError(argv, None, "", "scontrol requeue 7 did not finish within 5 s")
        return result

    runner = FakeRunner({"scontrol": scontrol})
    requeue_job(Slurm(runner), JOB, ["n2"], Window(60.0, "x", clock=clock), requeue_count=0)
    # The refusal is told from an outage by scontrol ping; Restarts says it went through.
    assert [call[1] for call in runner.calls] == ["requeue", "requeue", "ping", "show", "update"]
    assert runner.calls[-1] == ("scontrol", "update", f"JobId={JOB}", "ExcNodeList=n2")
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # restored


def test_the_supervisor_ends_the_job_with_one_line_when_slurm_stays_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    slurm, runner = slurm_for(Controller(clock, back_at=None))
    run = Supervisor(
        {"SLURM_JOB_ID": str(JOB)},
        slurm,
        None,
        3,
        2,
        Patience(signal_lead_s=60, after_failure_s=300, clock=clock),
    )
    run.on_first_signal(signal.SIGUSR1)
    with caplog.at_level(logging.WARNING):
        status = run.after_step(StepResult(138, (signal.SIGUSR1,)))
    assert status == int(ExitCode.SLURM)
    # scontrol show job (for Restarts) was tried until 63 s, past the lead; the requeue
    # then got one attempt of its own (4 s, as scontrol takes with slurmctld away).
    assert clock.now() == 67.0 and len(requeues(runner)) == 1
    ending = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert ending == [
        f"supervisor: the job ends without a requeue: scontrol requeue {JOB}: gave up waiting "
        "for SLURM's controller after 67 s (until the job's time limit, --signal-lead 60 s "
        "after the signal; 1 attempt of this command); SLURM said: Unexpected message "
        f"received for job {JOB}"
    ]


def test_the_supervisor_requeues_once_the_controller_is_back() -> None:
    clock = FakeClock()
    controller = Controller(clock, back_at=40.0)
    slurm, runner = slurm_for(controller)
    run = Supervisor(
        {"SLURM_JOB_ID": str(JOB)},
        slurm,
        None,
        3,
        2,
        Patience(signal_lead_s=120, after_failure_s=300, clock=clock),
    )
    run.on_first_signal(signal.SIGUSR1)
    assert run.after_step(StepResult(138, (signal.SIGUSR1,))) == 0
    assert controller.restarts == 1 and len(requeues(runner)) == 1
    assert run.patience.window().deadline == 120.0


def test_slurm_patience_goes_from_the_job_to_the_supervisor() -> None:
    from hpclaunch.errors import SpecError
    from hpclaunch.job.render import supervisor_settings
    from hpclaunch.job.spec import JobSpec

    assert "--slurm-patience" not in supervisor_settings(JobSpec("t.py")).to_argv()
    argv = supervisor_settings(JobSpec("t.py", slurm_patience_s=600)).to_argv()
    assert argv[argv.index("--slurm-patience") + 1] == "600"
    with pytest.raises(SpecError, match="-1 is below the minimum of 0"):
        JobSpec("t.py", slurm_patience_s=-1)
