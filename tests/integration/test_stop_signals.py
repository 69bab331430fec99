"""One stop signal per worker: SLURM delivers its signals to every process of a job
step, so the agent does not deliver them again (a framework's handler, Lightning's,
runs once per delivery and blocks in a collective when ranks count differently). A
worker that ends with status 0 after a stop signal is a stopped run, requeued as the
signal says, never a completed job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpclaunch.slurm.hostlist import expand
from tests.integration.helpers import wait_for
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import submit

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).with_name("signal_count.py")
RANKS = 4  # 2 nodes x 2 workers
# How the job is stopped, the signal every worker must see once, and the history.
STOPS = {
    "scontrol requeue": ("SIGTERM", ("requeued by SLURM", "SLURM requeues")),
    "time-limit warning": ("SIGUSR1", ("time limit", "requeue")),
    "a warning to the steps": ("SIGUSR2", ("time limit", "requeue")),
}


@pytest.mark.parametrize("how", list(STOPS))
def test_each_worker_gets_a_stop_signal_once(sandbox: Running, tmp_path: Path, how: str) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    job = submit(sandbox, tmp_path, SCRIPT, str(notes))
    wait_for(
        lambda: len(list(notes.glob("requeue-0-rank-*.txt"))) == RANKS,
        timeout_s=120,
        what="every worker to start",
    )
    command = {
        "scontrol requeue": ("scontrol", "requeue", str(job.id)),
        "time-limit warning": ("scancel", "--signal=USR1", "--batch", str(job.id)),
        "a warning to the steps": ("scancel", "--signal=USR2", str(job.id)),
    }[how]
    job.run(*command)
    assert job.wait_end() == "COMPLETED", job.log
    signal_name, first_run = STOPS[how]
    got = {path.name: path.read_text().split() for path in notes.glob("requeue-0-*.txt")}
    assert got == {f"requeue-0-rank-{r}.txt": [signal_name] for r in range(RANKS)}, job.log
    assert len(list(notes.glob("requeue-1-rank-*.txt"))) == RANKS
    assert job.history() == [(0, *first_run), (1, "completed", "none")]


def test_workers_killed_by_an_uncaught_warning_are_named_in_the_log(
    sandbox: Running, tmp_path: Path
) -> None:
    """A worker that does not catch SIGUSR1 dies of the time-limit warning with nothing
    saved: each node's agent says so in the batch log, naming what to install."""
    notes = tmp_path / "notes"
    notes.mkdir()
    job = submit(sandbox, tmp_path, SCRIPT, str(notes), "uncaught")
    wait_for(
        lambda: len(list(notes.glob("requeue-0-rank-*.txt"))) == RANKS,
        timeout_s=120,
        what="every worker to start",
    )
    job.run("scancel", "--signal=USR1", "--batch", str(job.id))
    assert job.wait_end() == "COMPLETED", job.log
    said = "local ranks 0,1 were killed by SIGUSR1: they do not catch it, so they saved nothing"
    assert job.log.count(said) == 2, job.log  # one line from each node's agent
    first = json.loads((job.job_dir / "history.json").read_text())["runs"][0]
    nodes = ",".join(sorted(expand(first["nodes"])))
    assert (
        f"run 0: the workers on {nodes} were killed by SIGUSR1, which they do not catch"
        in job.status()
    )
    assert job.history() == [(0, "time limit", "requeue"), (1, "completed", "none")]
