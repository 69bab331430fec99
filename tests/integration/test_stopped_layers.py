"""A layer of the job that stops (SIGSTOP here; in life a process stuck on a dead NFS
mount or in a deadlock) never holds the allocation until the time limit: the other
layers notice within the watch bound (``--watch-timeout``, 20 s here) and the
job ends or recovers by itself (hpclaunch.recovery.watch), with the digest of an
uninterrupted run and no process left behind. Whatever happens, the test kills what it
stopped, by pid."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hpclaunch import procs
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.slurm.hostlist import expand
from tests.integration.helpers import wait_for
from tests.integration.sandbox_fixture import Running
from tests.integration.test_agent_death import _agent_of, _job_processes, _srun_of
from tests.integration.training_jobs import EXAMPLES, Job, digest_of
from tests.integration.training_jobs import submit as submit_script

pytestmark = pytest.mark.integration

TRAIN = EXAMPLES / "train.py"
# Long enough that the other agents note progress for more than the bound after the
# stop (notes come every 10 s).
STEPS = ("--steps", "120", "--checkpoint-every", "10", "--step-time", "0.2")
BOUND_S = 20
WATCHED = ("--watch-timeout", str(BOUND_S))


@pytest.fixture(scope="module")
def uninterrupted(reference_digest: Callable[..., str]) -> str:
    return reference_digest(TRAIN, *STEPS)


def submit(sandbox: Running, folder: Path) -> Job:
    return submit_script(sandbox, folder, TRAIN, *STEPS, "--result", "result.json", options=WATCHED)


@contextmanager
def stopped(job: Job, pid: int) -> Iterator[float]:
    """``pid`` (a process of ``job``) stopped; when it was. Killed at the end, whatever
    happened, if it is still the job's."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield time.monotonic()
    finally:
        if pid in _job_processes(job):
            os.kill(pid, signal.SIGKILL)


def nothing_left(job: Job, pid: int) -> None:
    """No process of ``job`` is left, the one the test stopped neither: the job ended
    them all by itself (``Job.wait_end`` waited for that; the test's own kill of the
    stopped process comes after this)."""
    assert _job_processes(job) == [], f"left behind by job {job.id}: {_job_processes(job)}"
    left = procs.proc(pid)
    assert left is None or left.zombie, f"the stopped process {pid} of job {job.id} is left"


def _supervisor_of(job: Job) -> int:
    """The pid of the job's supervisor (the batch script execs it)."""
    found = [
        pid
        for pid in _job_processes(job)
        if " supervise " in procs.command_line(pid)
        and not procs.command_line(pid).startswith("srun")
    ]
    assert len(found) == 1, f"supervisors of job {job.id}: {found}"
    return found[0]


def test_a_stopped_agent_is_noticed_and_the_job_is_requeued_without_its_node(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit(sandbox, tmp_path)
    job.wait_checkpoint(9)
    node = expand(job.fields()["NodeList"])[1]
    agent = _agent_of(job, 1)
    with stopped(job, agent) as since:
        # Named in status while the others train on (its workers may still be training).
        wait_for(
            lambda: f"note: run 0: the agent on {node} noted no progress" in job.status(),
            timeout_s=90,
            what=f"hpclaunch status to name the agent on {node}",
        )
        assert job.wait_end() == "COMPLETED", job.log
        # noticed after the bound, acted on once the others stopped noting progress:
        # well before the time limit, the others' exit barrier (300 s) or any test wait
        assert time.monotonic() - since < 150
        nothing_left(job, agent)
    log = job.log
    assert f"supervisor: warning: the agent on {node} has noted no progress" in log, log
    assert job.history() == [(0, "agent silent", "requeue"), (1, "completed", "none")]
    runs = json.loads((job.job_dir / "history.json").read_text())["runs"]
    assert runs[0]["error"].startswith(f"the agent on {node} noted no progress"), runs[0]
    assert runs[0]["excluded"] == [node] and node not in expand(runs[1]["nodes"])
    result = job.lines("RESULT")[-1]
    assert result["started_at"] and int(str(result["started_at"])) > 0, result
    assert result["digest"] == uninterrupted


def test_a_stopped_srun_is_killed_and_the_job_resumes_on_the_same_nodes(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit(sandbox, tmp_path)
    job.wait_checkpoint(9)
    nodes = job.fields()["NodeList"]
    srun = _srun_of(job)
    with stopped(job, srun) as since:
        # The step's output no longer flows (srun carries it), so the training stalls
        # too and the step cannot end by itself: srun is killed after the bound.
        assert job.wait_end() == "COMPLETED", job.log
        assert time.monotonic() - since < 150
        nothing_left(job, srun)
    log = job.log
    error = (
        "srun (the job step, on the batch host) was stopped (state T) for 20 s; "
        "the supervisor killed it"
    )
    assert f"supervisor: {error}" in log, log
    assert job.history() == [(0, "srun stuck", "requeue"), (1, "completed", "none")]
    runs = json.loads((job.job_dir / "history.json").read_text())["runs"]
    assert runs[0]["error"] == error
    # No node to blame: the same nodes may run the job again.
    assert runs[0]["excluded"] == [] and runs[0]["nodes"] == nodes
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["started_at"] > 0 and result["digest"] == uninterrupted, result


def test_a_stopped_supervisor_is_replaced_by_an_agent_that_ends_the_job(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit(sandbox, tmp_path)
    job.wait_checkpoint(9)
    batch = job.fields()["BatchHost"]
    supervisor = _supervisor_of(job)
    with stopped(job, supervisor) as since:
        assert job.wait_end() == "COMPLETED", job.log
        assert time.monotonic() - since < 90
        nothing_left(job, supervisor)
    fields = job.fields()
    assert fields["Restarts"] == "0" and fields["ExitCode"] == "0:0", fields
    assert digest_of(job) == uninterrupted
    log = job.log
    assert log.count("takes its role") == 1, log  # exactly one agent took it
    assert log.count("has its role") == 1, log
    assert f"the supervisor on {batch} has not answered for" in log, log
    assert "the training finished: the job ends COMPLETED" in log, log
    deputy = json.loads(JobFolder(job.job_dir).deputy(0).read_text())
    assert deputy["why"] == "silent" and deputy["lost"] == batch, deputy
    assert job.history() == [(0, "completed", "none")]
