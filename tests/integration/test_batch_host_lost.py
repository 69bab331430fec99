"""A ``--no-kill`` job whose batch host is lost (its supervisor and srun with it) still
ends by itself: a surviving agent takes the supervisor's role, exactly once. With an
etcd of the user's own the survivors train on and the job ends COMPLETED; with the
sidecar (on the lost host) the job is requeued without the host and resumes to the
digest of an uninterrupted run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hpclaunch.jobdir.layout import JobFolder, RankFile
from hpclaunch.slurm.hostlist import expand
from tests.integration.etcd_fixture import EtcdServer
from tests.integration.helpers import wait_for
from tests.integration.sandbox_fixture import Running
from tests.integration.test_etcd_sandbox import (
    etcd_on_host,  # noqa: F401 (a fixture)
    etcd_servers_of,
)
from tests.integration.test_fault_tolerance import submit as submit_training
from tests.integration.training_jobs import Job

pytestmark = pytest.mark.integration

ARGS = ("--steps", "40", "--checkpoint-every", "5", "--step-time", "0.3", "--result", "result.json")
ELASTIC = ("--nodes", "2:3", "--no-kill", "--rdzv", "etcd")


@pytest.fixture(scope="module")
def uninterrupted_on_three(sandbox: Running, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The digest of the same training on 3 nodes that nothing interrupts."""
    folder = tmp_path_factory.mktemp("uninterrupted-3")
    job = submit_training(sandbox, folder, *ARGS, options=("--nodes", "3"))
    assert job.wait_end() == "COMPLETED", job.log
    result = json.loads((folder / "result.json").read_text())
    assert result["world_size"] == 6 and result["started_at"] == 0, result
    return str(result["digest"])


def lose_the_batch_host(sandbox: Running, job: Job) -> tuple[str, list[str]]:
    """Kill the job's batch host once a checkpoint is committed; its name, the nodes."""
    job.wait_checkpoint(9)
    fields = job.fields()
    nodes, batch = expand(fields["NodeList"]), fields["BatchHost"]
    assert len(nodes) == 3 and batch == nodes[0], f"SLURM gave {nodes}, batch host {batch}"
    sandbox.box.kill_node(batch)
    return batch, nodes


def forget_the_dead_sidecar(job: Job) -> None:
    """The killed host's sidecar left its data folder in /tmp, which all the sandbox's
    nodes share; a real node's went with its crash or reboot. Every other sidecar of the
    job removed its own."""
    for left in Path("/tmp").glob(f"hpclaunch-{job.id}-0-*"):
        shutil.rmtree(left)
    assert not list(Path("/tmp").glob(f"hpclaunch-{job.id}-*"))


def rank0_lines(job: Job, attempt: int, kind: str) -> list[dict[str, object]]:
    """Global rank 0's ``KIND {...}`` lines in its own log of run 0, ``attempt``: what
    no srun carries to the batch log once the batch host is gone."""
    path = JobFolder(job.job_dir).attempt(0, "0", attempt).rank_file(0, RankFile.OUT)
    return [
        json.loads(line.split(" ", 1)[1])
        for line in path.read_text().splitlines()
        if line.startswith(f"{kind} ")
    ]


def test_with_your_own_etcd_the_survivors_finish_and_the_job_ends_completed(
    sandbox: Running,
    etcd_on_host: EtcdServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    options = (*ELASTIC, "--etcd-endpoint", etcd_on_host.endpoint)
    job = submit_training(sandbox, tmp_path, *ARGS, options=options)
    batch, nodes = "", []
    try:
        batch, nodes = lose_the_batch_host(sandbox, job)
        saved = job.committed()  # none can commit without the lost host's ranks
        assert job.wait_end() == "COMPLETED", job.log
    finally:
        if batch:
            sandbox.box.start_node(batch)
    fields = job.fields()
    assert fields["Restarts"] == "0" and fields["ExitCode"] == "0:0", fields
    [restart] = rank0_lines(job, 1, "START")
    assert restart["world_size"] == 4 and restart["step"] == saved[-1] + 1, restart
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["steps"] == 40 and result["world_size"] == 4, result
    assert job.history() == [(0, "completed", "none")]
    deputy = json.loads(JobFolder(job.job_dir).deputy(0).read_text())
    assert deputy["node"] in nodes[1:] and deputy["lost"] == batch, deputy
    log = job.log
    assert log.count("takes their role") == 1, log  # exactly one agent took it
    assert f"the batch host {batch} is lost" in log, log
    assert "the training finished: the job ends COMPLETED" in log, log


def test_with_the_sidecar_on_the_lost_host_the_job_is_requeued_without_it(
    sandbox: Running, tmp_path: Path, uninterrupted_on_three: str
) -> None:
    options = (*ELASTIC, "--etcd-sidecar", "--etcd-outage-timeout", "15")
    job = submit_training(sandbox, tmp_path, *ARGS, options=options)
    batch = ""
    try:
        batch, _ = lose_the_batch_host(sandbox, job)
        wait_for(
            lambda: job.fields()["Restarts"] == "1",
            timeout_s=180,
            what=f"job {job.id} to be requeued without {batch}",
        )
        assert job.wait_end() == "COMPLETED", job.log
    finally:
        if batch:
            sandbox.box.start_node(batch)
            forget_the_dead_sidecar(job)
    assert not etcd_servers_of(job.id)
    assert batch not in expand(job.fields()["NodeList"])
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["started_at"] > 0 and result["world_size"] == 6, result
    assert result["digest"] == uninterrupted_on_three, result
    runs = json.loads(JobFolder(job.job_dir).history.read_text())["runs"]
    assert [(r["reason"], r["action"], r["excluded"]) for r in runs] == [
        ("batch host lost", "requeue", [batch]),
        ("completed", "none", []),
    ], runs
    log = job.log
    assert log.count("takes their role") == 1, log
    assert f"requeueing the job without {batch}" in log, log
