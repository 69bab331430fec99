"""slurmctld goes away and comes back, as for an upgrade or a failover, and a node's
slurmd is restarted: the sandbox does both on demand, running jobs survive them, and a
job whose time-limit warning comes while slurmctld is away is requeued once it is back
and ends with the digest of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpclaunch import procs
from hpclaunch.errors import SandboxError, SpecError
from hpclaunch.procs import Tracked
from hpclaunch.sandbox import state
from tests.integration.helpers import wait_for
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import EXAMPLES, Job, digest_of, submit

pytestmark = pytest.mark.integration

TRAIN = EXAMPLES / "train.py"
STEPS = ("--steps", "30", "--checkpoint-every", "5", "--step-time", "0.15")
# How long slurmctld stays away: the scenario.
OUTAGE_S = 40.0
# The time-limit warning's lead: the supervisor waits for slurmctld this long after it.
LEAD_S = 100


def scontrol(sandbox: Running, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["scontrol", *args], env=sandbox.env, capture_output=True, text=True, check=False
    )


def job_state(sandbox: Running, job: str) -> str:
    out = scontrol(sandbox, "show", "job", job).stdout
    return next(w.split("=", 1)[1] for w in out.split() if w.startswith("JobState="))


def sbatch(sandbox: Running, *argv: str) -> str:
    return subprocess.run(
        ["sbatch", "--parsable", *argv],
        env=sandbox.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def daemon(sandbox: Running, name: str) -> Tracked:
    current = state.read(sandbox.box.state_file)
    assert current is not None
    return current.procs[name]


def sleeping_tasks(job: str) -> list[Tracked]:
    """The job's ``sleep 600`` tasks, one per node (the other processes with its id, srun's
    helpers and the batch shell's, may come and go as the step starts)."""
    found = []
    for pid in procs.with_environ(f"SLURM_JOB_ID={job}".encode()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            tracked = Tracked.of(pid)
        except (OSError, ProcessLookupError):  # ended while it was looked at
            continue
        if Path(command[0].decode()).name == "sleep" and command[1:2] == [b"600"]:
            found.append(tracked)
    return found


def test_stop_and_start_controller_keep_the_running_job(sandbox: Running, tmp_path: Path) -> None:
    job = sbatch(sandbox, "-N2", f"--output={tmp_path}/out", "--wrap", "srun sleep 600")
    try:
        wait_for(lambda: job_state(sandbox, job) == "RUNNING", what=f"job {job} to run")
        wait_for(lambda: len(sleeping_tasks(job)) == 2, what=f"job {job}'s tasks to start")
        tasks = sleeping_tasks(job)
        sandbox.box.stop_controller()
        assert not daemon(sandbox, "slurmctld").alive()
        down = scontrol(sandbox, "show", "job", job)
        assert down.returncode == 1
        assert "Unable to contact slurm controller (connect failure)" in down.stderr
        assert sandbox.box.status()["dead"] == ["slurmctld"]
        sandbox.box.stop_controller()  # stopped already: nothing to do
        assert all(task.alive() for task in tasks)  # the job runs on
        sandbox.box.start_controller()
        assert job_state(sandbox, job) == "RUNNING"  # the state it saved
        assert sandbox.box.status()["up"] is True
        with pytest.raises(SandboxError, match="slurmctld is running; stop it first"):
            sandbox.box.start_controller()
    finally:
        if not daemon(sandbox, "slurmctld").alive():
            sandbox.box.start_controller()
        subprocess.run(["scancel", job], env=sandbox.env, check=True)
    wait_for(lambda: job_state(sandbox, job) == "CANCELLED", what=f"job {job} cancelled")


def test_restart_node_keeps_the_node_running_its_job(sandbox: Running, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job = sbatch(
        sandbox,
        "-N1",
        "-w",
        "n2",
        f"--output={out}",
        "--wrap",
        f"srun touch {tmp_path}/started; srun sleep 6; echo done",
    )
    wait_for(lambda: (tmp_path / "started").exists(), what=f"job {job} to start")
    old = daemon(sandbox, "n2")
    sandbox.box.restart_node("n2")
    new = daemon(sandbox, "n2")
    assert new != old and new.alive()
    assert sandbox.box.status()["nodes"]["n2"]["responding"] is True
    wait_for(lambda: job_state(sandbox, job) == "COMPLETED", timeout_s=60, what=f"job {job}")
    assert out.read_text().strip().endswith("done")
    # The old slurmd's reaper ends once the steps it adopted are gone.
    wait_for(lambda: not old.alive(), what="the old slurmd's reaper to exit")
    with pytest.raises(SpecError, match="no sandbox node is called 'n9'"):
        sandbox.box.restart_node("n9")


@pytest.fixture(scope="module")
def uninterrupted(reference_digest: Callable[..., str]) -> str:
    return reference_digest(TRAIN, *STEPS)


def supervisor_of(job: Job) -> Tracked:
    """The job's batch step: the ``hpclaunch supervise`` process (the script execs it)."""
    for pid in procs.with_environ(f"SLURM_JOB_ID={job.id}".encode()):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"supervise" in argv:
            return Tracked.of(pid)
    pytest.fail(f"no supervisor process of job {job.id}")


def test_the_warning_during_a_controller_outage_requeues_once_it_is_back(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    """slurmctld goes away, and SLURM's warning reaches the batch step (sent here by hand,
    as slurmstepd delivers it, so that it comes while slurmctld is away for sure); 40 s
    later slurmctld is back, within the warning's lead."""
    job = submit(sandbox, tmp_path, TRAIN, *STEPS, options=("--signal-lead", str(LEAD_S)))
    job.wait_checkpoint(9)
    supervisor = supervisor_of(job)
    sandbox.box.stop_controller()
    stopped = time.monotonic()
    try:
        os.kill(supervisor.pid, signal.SIGUSR1)
        wait_for(
            lambda: "attempt 2, next try in" in job.log,
            timeout_s=OUTAGE_S,
            what="the supervisor to try SLURM again",
        )
        assert "[rank0] STOPPED" in job.log  # the workers stopped and checkpointed
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped)))  # the outage itself
    finally:
        sandbox.box.start_controller()
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    assert job.history() == [(0, "time limit", "requeue"), (1, "completed", "none")]
    assert job.fields()["Restarts"] == "1"
    starts = job.lines("START")
    assert [s["requeue"] for s in starts] == ["0", "1"] and int(str(starts[1]["step"])) >= 10
    retries = [line for line in job.log.splitlines() if "SLURM's controller did not answer" in line]
    assert len(retries) >= 3, job.log  # logged, each with its attempt and the time left
    assert all("s left (until the job's time limit" in line for line in retries)
    assert "the job ends without a requeue" not in job.log


def test_a_controller_away_past_the_time_limit_ends_the_job_with_one_line(
    sandbox: Running, tmp_path: Path
) -> None:
    """The warning's lead (20 s) runs out before slurmctld is back: the job ends FAILED
    with exit status 3 and one line naming the command, the time and SLURM's answer."""
    job = submit(sandbox, tmp_path, TRAIN, *STEPS, options=("--signal-lead", "20"))
    job.wait_checkpoint(4)
    supervisor = supervisor_of(job)
    sandbox.box.stop_controller()
    try:
        os.kill(supervisor.pid, signal.SIGUSR1)
        wait_for(lambda: not supervisor.alive(), timeout_s=60, what="the supervisor to give up")
    finally:
        sandbox.box.start_controller()
    assert job.wait_end() == "FAILED", job.log
    assert job.fields()["ExitCode"] == "3:0" and job.fields()["Restarts"] == "0"
    assert job.history() == [(0, "time limit", "requeue failed")]
    [ending] = [line for line in job.log.splitlines() if "the job ends" in line]
    assert ending.startswith(
        f"hpclaunch[job {job.id}]: supervisor: the job ends without a requeue: "
        f"scontrol requeue {job.id}: gave up waiting for SLURM's controller after "
    ), ending
    assert " s (until the job's time limit, --signal-lead 20 s after the signal; " in ending
    assert ending.endswith(f"SLURM said: Unexpected message received for job {job.id}"), ending
