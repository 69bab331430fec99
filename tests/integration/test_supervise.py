"""The batch-step supervisor with real processes and real signals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import VENV_BIN, base_env, wait_for

pytestmark = pytest.mark.integration

# A step that reports readiness, then records the first signal it gets and exits as the
# agents do when stopped by a signal: 128 + its number.
STEP = """
import signal, sys, pathlib
out = pathlib.Path(sys.argv[1])
def got(signum, frame):
    out.with_suffix('.signal').write_text(signal.Signals(signum).name)
    sys.exit(128 + signum)
for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
    signal.signal(s, got)
out.with_suffix('.ready').write_text('')
signal.pause()
"""


def start(hpclaunch_bin: Path, tmp_path: Path, *step: str) -> subprocess.Popen[str]:
    # A job on its second run with a budget of one requeue: a time-limit warning then
    # gives up without calling SLURM, and SIGTERM's question to scontrol fails at once
    # (not on PATH), which the supervisor takes as a cancellation. The real requeues
    # are tested on the sandbox (test_fault_tolerance.py).
    env = base_env(SLURM_JOB_ID="7", SLURM_RESTART_COUNT="1")
    env["PATH"] = str(VENV_BIN)
    return subprocess.Popen(
        [
            str(hpclaunch_bin),
            "supervise",
            "--max-requeues",
            "1",
            "--job-dir",
            str(tmp_path / "job"),
            "--",
            *step,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    ("sig", "status", "reason"),
    [
        (signal.SIGUSR1, 4, "over the requeue budget"),
        (signal.SIGUSR2, 4, "over the requeue budget"),
        (signal.SIGTERM, 143, "cancelled"),
        (signal.SIGINT, 130, "cancelled"),
    ],
)
def test_signals_reach_the_step(
    tmp_path: Path, hpclaunch_bin: Path, sig: signal.Signals, status: int, reason: str
) -> None:
    record = tmp_path / "step"
    with start(hpclaunch_bin, tmp_path, sys.executable, "-c", STEP, str(record)) as proc:
        try:
            wait_for(record.with_suffix(".ready").exists, what="the step to start")
            proc.send_signal(sig)
            assert proc.wait(timeout=20) == status
        finally:
            proc.kill()
    assert record.with_suffix(".signal").read_text() == sig.name
    history = json.loads((tmp_path / "job" / "history.json").read_text())
    assert [(r["requeue_count"], r["first_signal"], r["reason"]) for r in history["runs"]] == [
        (1, sig.name, reason)
    ]


def test_outside_a_job_it_refuses(hpclaunch_bin: Path) -> None:
    result = subprocess.run(
        [str(hpclaunch_bin), "supervise", "--", "true"],
        env=base_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "SLURM_JOB_ID=None: hpclaunch supervise runs as a job's batch step" in result.stderr


def test_exit_status_is_the_steps(tmp_path: Path, hpclaunch_bin: Path) -> None:
    with start(hpclaunch_bin, tmp_path, sys.executable, "-c", "raise SystemExit(7)") as proc:
        assert proc.wait(timeout=20) == 7


def test_a_step_killed_by_a_signal_it_was_not_sent_is_a_node_fault(
    tmp_path: Path, hpclaunch_bin: Path
) -> None:
    """The step (srun) killed by the OOM killer, say: a requeue is due, and this job
    on its second run with a budget of one gives up (status 4) instead of failing."""
    suicide = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    with start(hpclaunch_bin, tmp_path, sys.executable, "-c", suicide) as killed:
        _, err = killed.communicate(timeout=20)
    assert killed.returncode == 4, err
    assert "srun (the job step, on the batch host) was killed by SIGKILL" in err
    history = json.loads((tmp_path / "job" / "history.json").read_text())
    assert [(r["step_status"], r["reason"], r["action"]) for r in history["runs"]] == [
        (128 + signal.SIGKILL, "agent died", "give up")
    ]


def test_missing_step_command(tmp_path: Path, hpclaunch_bin: Path) -> None:
    with start(hpclaunch_bin, tmp_path, "no-such-srun-here") as proc:
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 3
    assert "'no-such-srun-here' is not on PATH" in err


def test_a_save_longer_than_the_signal_lead_allows_is_warned_of(
    tmp_path: Path, hpclaunch_bin: Path
) -> None:
    """An earlier run's save took 40 s; with --grace-period (the signal lead) 30 the
    workers get 22 s after the warning: the supervisor says so before the step, and
    records the lead for `hpclaunch status`."""
    job = tmp_path / "job"
    job.mkdir()
    record = {
        "step": 99,
        "sharded": True,
        "asynchronous": False,
        "blocked_s": 40.0,
        "total_s": 40.0,
        "bytes": 1,
        "ranks": 4,
        "ended": 1.0,
    }
    (job / "checkpoint-saves.jsonl").write_text(json.dumps(record) + "\n")
    env = base_env(SLURM_JOB_ID="7", SLURM_RESTART_COUNT="0")
    done = subprocess.run(
        [
            str(hpclaunch_bin),
            "supervise",
            "--max-requeues",
            "1",
            "--grace-period",
            "30",
            "--job-dir",
            str(job),
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "supervisor: the checkpoint save of step 99 took 40.0 s, but after the time-limit "
        "warning (--signal-lead 30 s) the workers get 22 s"
    ) in done.stderr
    assert json.loads((job / "history.json").read_text())["signal_lead_s"] == 30


def test_a_stale_supervisor_finishing_last_neither_requeues_nor_rewrites_the_history(
    tmp_path: Path, hpclaunch_bin: Path
) -> None:
    """Run 0's supervisor outlives its job (its batch host was cut off while SLURM
    requeued the job): run 1 starts, closes run 0 as lost and completes; then run 0's
    step ends at the time-limit warning. Run 0's supervisor sees the newer run: it does
    not requeue the job (no scontrol is called) and leaves run 1's history as it is."""
    job, record = tmp_path / "job", tmp_path / "step"

    def supervise(count: int, *step: str) -> subprocess.Popen[str]:
        env = base_env(SLURM_JOB_ID="7", SLURM_RESTART_COUNT=str(count))
        env["PATH"] = str(VENV_BIN)  # no scontrol: Restarts is unknown, a requeue would fail
        return subprocess.Popen(
            [
                str(hpclaunch_bin),
                "supervise",
                "--max-requeues",
                "3",
                "--job-dir",
                str(job),
                "--",
                *step,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    with supervise(0, sys.executable, "-c", STEP, str(record)) as stale:
        try:
            wait_for(record.with_suffix(".ready").exists, what="run 0's step to start")
            with supervise(1, sys.executable, "-c", "pass") as newer:
                _, newer_err = newer.communicate(timeout=30)
            assert newer.returncode == 0, newer_err
            stale.send_signal(signal.SIGUSR1)  # the time-limit warning: a requeue is due
            _, stale_err = stale.communicate(timeout=30)
        finally:
            stale.kill()
    assert stale.returncode == 0, stale_err
    assert "the job has moved on (run 1 has started)" in stale_err
    assert "not overwriting the history" in stale_err
    assert "requeueing the job" not in stale_err and "scontrol requeue" not in stale_err
    history = json.loads((job / "history.json").read_text())
    assert [(r["requeue_count"], r["reason"], r["action"]) for r in history["runs"]] == [
        (0, "lost", "SLURM requeues"),
        (1, "completed", "none"),
    ]
