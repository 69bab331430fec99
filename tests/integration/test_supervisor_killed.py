"""The supervisor killed (SIGKILL) before it recorded its run's end, on the sandbox, with
examples/train.py: SLURM ends the job FAILED, and `hpclaunch status` does not show the
run as running but says what is known; the job requeued by hand resumes from its last
checkpoint with the digest of an uninterrupted run, and its new run closes the old
one in the history. No process is left."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from hpclaunch import procs
from tests.integration.helpers import wait_for
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import EXAMPLES, Job, digest_of, submit

pytestmark = pytest.mark.integration

TRAIN = EXAMPLES / "train.py"
STEPS = ("--steps", "30", "--checkpoint-every", "5", "--step-time", "0.15")


@pytest.fixture(scope="module")
def uninterrupted(reference_digest: Callable[..., str]) -> str:
    return reference_digest(TRAIN, *STEPS)


def supervisor_of(job: Job) -> int:
    """The pid of the job's supervisor (the batch step, `hpclaunch supervise`)."""
    found = [
        pid
        for pid in procs.with_environ(f"SLURM_JOB_ID={job.id}".encode())
        if " supervise " in procs.command_line(pid)
        and not procs.command_line(pid).startswith("srun ")
    ]
    assert len(found) == 1, f"supervisors of job {job.id}: {found}"
    return found[0]


def test_a_killed_supervisors_run_is_not_shown_running_and_the_next_run_closes_it(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit(sandbox, tmp_path / "job", TRAIN, *STEPS)
    job.wait_checkpoint(4)
    os.kill(supervisor_of(job), signal.SIGKILL)
    assert job.wait_end() == "FAILED", job.log
    assert job.history() == [(0, None, None)]  # it died before it could say anything
    text = job.status()
    assert "no end recorded (SLURM: FAILED)" in text and "running" not in text, text
    history = job.job_dir / "history.json"
    assert (
        f"  note: run 0 ended without its supervisor recording the end in {history} (the "
        "supervisor died first: killed, or its batch host lost); SLURM says FAILED" in text
    ), text
    saved = job.committed()
    job.run("scontrol", "requeue", str(job.id))
    wait_for(lambda: job.fields()["Restarts"] == "1", what=f"job {job.id} requeued")
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    runs = json.loads(history.read_text())["runs"]
    assert [(r["requeue_count"], r["reason"]) for r in runs] == [(0, "lost"), (1, "completed")]
    assert runs[0]["error"] == (
        "no end recorded: its supervisor could not write the history, or died first (its "
        "batch host lost, or the supervisor killed)"
    )
    assert job.lines("START")[-1]["step"] == saved[-1] + 1
    assert "lost -> SLURM requeues" in job.status()
