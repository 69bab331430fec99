"""An agent or the srun under the supervisor killed mid-training (the OOM killer, a
segfault, an administrator) is a node fault: the job is requeued and ends with exactly
the digest of an uninterrupted run, its history naming the node, with no process of
it left behind."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from hpclaunch import procs
from hpclaunch.slurm.hostlist import expand
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import EXAMPLES, Job, digest_of
from tests.integration.training_jobs import submit as submit_script

pytestmark = pytest.mark.integration

TRAIN = EXAMPLES / "train.py"
STEPS = ("--steps", "30", "--checkpoint-every", "5", "--step-time", "0.15")


@pytest.fixture(scope="module")
def uninterrupted(reference_digest: Callable[..., str]) -> str:
    return reference_digest(TRAIN, *STEPS)


def _job_processes(job: Job, *entries: bytes) -> list[int]:
    """The live processes of ``job`` whose environment holds every one of ``entries``."""
    table = procs.parents()
    found = set(procs.with_environ(f"SLURM_JOB_ID={job.id}".encode(), table))
    for entry in entries:
        found &= set(procs.with_environ(entry, table))
    return sorted(found)


def _agent_of(job: Job, node_id: int) -> int:
    """The pid of the agent of the job's node ``node_id`` (its step's task, the child
    of that node's slurmstepd)."""
    table = procs.parents()
    found = [
        pid
        for pid in _job_processes(job, f"SLURM_NODEID={node_id}".encode())
        if " agent " in procs.command_line(pid)
        and procs.command_line(table.get(pid, 0)).startswith("slurmstepd")
    ]
    assert len(found) == 1, f"agents of node {node_id}: {found}"
    return found[0]


def _srun_of(job: Job) -> int:
    """The pid of the srun the supervisor runs (a child of the batch step's supervisor)."""
    found = [pid for pid in _job_processes(job) if procs.command_line(pid).startswith("srun ")]
    assert found, f"no srun of job {job.id}"
    table = procs.parents()
    [srun] = [pid for pid in found if table.get(pid) not in found]  # srun forks a helper
    return srun


def test_a_killed_agent_is_a_node_fault_and_the_job_resumes(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit_script(sandbox, tmp_path, TRAIN, *STEPS)
    job.wait_checkpoint(9)
    node = expand(job.fields()["NodeList"])[1]
    os.kill(_agent_of(job, 1), signal.SIGKILL)
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    assert job.history() == [(0, "agent died", "requeue"), (1, "completed", "none")]
    runs = json.loads((job.job_dir / "history.json").read_text())["runs"]
    assert runs[0]["error"] == f"the agent on {node} was killed by SIGKILL", runs[0]
    assert f"supervisor: the agent on {node} was killed by SIGKILL" in job.log
    assert f"srun: error: {node}: task 1: Killed" in job.log  # srun's stderr is still there
    # Kept out of the next run, as a bad node is.
    assert runs[0]["excluded"] == [node] and job.fields()["ExcNodeList"] == node
    assert node not in expand(runs[1]["nodes"])
    starts = job.lines("START")
    assert [s["requeue"] for s in starts] == ["0", "1"] and int(str(starts[1]["step"])) >= 5


def test_a_killed_srun_requeues_the_job(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit_script(sandbox, tmp_path, TRAIN, *STEPS)
    job.wait_checkpoint(9)
    nodes = job.fields()["NodeList"]
    os.kill(_srun_of(job), signal.SIGKILL)
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    assert job.history() == [(0, "agent died", "requeue"), (1, "completed", "none")]
    runs = json.loads((job.job_dir / "history.json").read_text())["runs"]
    error = "srun (the job step, on the batch host) was killed by SIGKILL"
    assert runs[0]["error"] == error and f"supervisor: {error}" in job.log
    # No node to blame: the same nodes may run the job again.
    assert runs[0]["excluded"] == [] and runs[0]["nodes"] == nodes
    starts = job.lines("START")
    assert [s["requeue"] for s in starts] == ["0", "1"] and int(str(starts[1]["step"])) >= 5
