"""Frameworks people already run, on the sandbox. accelerate's plain ``Accelerator()``
on CPU nodes is one world over gloo (the agent sets ACCELERATE_USE_CPU=1 where the job
has no GPU), not four trainings of their own; an accelerate loop with hpclaunch's
preemption flag and checkpoints resumes exactly after the time-limit warning. Lightning
DDP with hpclaunch's ``StopCheckpoint`` saves at a step boundary and resumes exactly
from each stop, and its default ``Trainer()`` is one world of every rank (the agent's
PL_TRAINER_*)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.integration.helpers import wait_for
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import EXAMPLES, Job, end_with_a_lost_node, submit

pytestmark = pytest.mark.integration

ACCELERATE = Path(__file__).with_name("accelerate_train.py")


def test_accelerate_on_cpu_nodes_trains_one_model_in_one_world(
    sandbox: Running, tmp_path: Path
) -> None:
    pytest.importorskip("accelerate")  # the test tier installs it (.[frameworks])
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    job = submit(sandbox, tmp_path, ACCELERATE, str(seen_dir))
    assert job.wait_end() == "COMPLETED", job.log
    seen = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in seen_dir.iterdir()}
    assert sorted(seen) == [0, 1, 2, 3], job.log
    for rank, worker in seen.items():
        assert worker["num_processes"] == 4 and worker["process_index"] == rank, worker
        assert worker["distributed_type"] == "DistributedType.MULTI_CPU", worker
    assert len({worker["digest"] for worker in seen.values()}) == 1, seen


ACCELERATE_LOOP = EXAMPLES / "train_accelerate.py"
# 20 steps of 0.4 s after step 9's checkpoint: the warning lands well before the run ends.
ACCELERATE_STEPS = ("--steps", "30", "--step-time", "0.4")


def test_an_accelerate_loop_stopped_by_the_warning_resumes_exactly(
    sandbox: Running, tmp_path: Path
) -> None:
    """examples/train_accelerate.py: the preemption flag and hpclaunch.checkpoint in an
    accelerate loop; the time-limit warning requeues it once and it ends with the weights
    of an uninterrupted run."""
    pytest.importorskip("accelerate")
    whole = submit(sandbox, tmp_path / "whole", ACCELERATE_LOOP, "--steps", "30")
    assert whole.wait_end() == "COMPLETED", whole.log
    [uninterrupted] = whole.lines("RESULT")
    assert uninterrupted["world_size"] == 4, whole.log
    job = submit(sandbox, tmp_path / "stopped", ACCELERATE_LOOP, *ACCELERATE_STEPS)
    job.wait_checkpoint(9)
    job.run("scancel", "--signal=USR1", "--batch", str(job.id))
    assert job.wait_end() == "COMPLETED", job.log
    assert job.lines("RESULT") == [uninterrupted], job.log
    starts = job.lines("START")
    assert [s["requeue"] for s in starts] == ["0", "1"] and int(str(starts[1]["step"])) >= 10
    assert job.history() == [(0, "time limit", "requeue"), (1, "completed", "none")]


LIGHTNING = Path(__file__).with_name("lightning_train.py")
# What each interruption leaves in the history of the run it stopped.
STOPPED = {
    "scontrol requeue": ("requeued by SLURM", "SLURM requeues"),
    "time-limit warning": ("time limit", "requeue"),
    "a lost node": ("requeued by SLURM", "SLURM requeues"),
}


@pytest.fixture(scope="module")
def lightning_uninterrupted(sandbox: Running, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The digest of the Lightning job that nothing interrupts: 4 epochs, 32 steps."""
    pytest.importorskip("lightning")  # the test tier installs it (.[frameworks])
    folder = tmp_path_factory.mktemp("lightning-uninterrupted")
    job = submit(sandbox, folder, LIGHTNING, str(folder))
    assert job.wait_end() == "COMPLETED", job.log
    [result] = job.lines("RESULT")
    assert (result["steps"], result["world_size"]) == (32, 4), job.log
    return str(result["digest"])


def lightning_saved(job: Job) -> list[int]:
    """The steps of the StopCheckpoint checkpoints committed so far."""
    try:
        names = os.listdir(job.checkpoints / "lightning")
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_SAVED.match, names) if m)


_SAVED = re.compile(r"^step-(\d{12})\.ckpt$")


@pytest.mark.parametrize("how", list(STOPPED))
def test_a_stopped_lightning_job_saves_requeues_once_and_resumes_exactly(
    sandbox: Running, tmp_path: Path, lightning_uninterrupted: str, how: str
) -> None:
    """Lightning DDP 2 x 2 with StopCheckpoint: each stop ends COMPLETED with every
    epoch done and the uninterrupted digest, resumed from Lightning's checkpoint, after
    one requeue; each worker got the stop signal once (its handler ran once)."""
    job = submit(sandbox, tmp_path, LIGHTNING, str(tmp_path), "0.3")
    wait_for(
        lambda: any(s >= 10 for s in lightning_saved(job)),
        timeout_s=120,
        what=f"job {job.id}'s Lightning checkpoint of step 10",
    )
    if how == "a lost node":
        assert end_with_a_lost_node(sandbox, job)[0] == "COMPLETED", job.log
    else:
        stop = {
            "scontrol requeue": ("scontrol", "requeue", str(job.id)),
            "time-limit warning": ("scancel", "--signal=USR1", "--batch", str(job.id)),
        }[how]
        job.run(*stop)
        assert job.wait_end() == "COMPLETED", job.log
        sig = "SIGTERM" if how == "scontrol requeue" else "SIGUSR1"
        for rank in range(4):
            notes = tmp_path / f"requeue-0-rank-{rank}.txt"
            assert notes.read_text().split() == [sig], (rank, job.log)
        assert "hpclaunch: stopping at step" in job.log, job.log
    [result] = job.lines("RESULT")
    assert (result["digest"], result["steps"]) == (lightning_uninterrupted, 32), job.log
    starts = job.lines("START")
    assert [s["requeue"] for s in starts] == ["0", "1"], job.log
    assert int(str(starts[1]["step"])) >= 10  # resumed from Lightning's checkpoint
    assert job.fields()["Restarts"] == "1"
    assert job.history() == [(0, *STOPPED[how]), (1, "completed", "none")]
    assert "sending SIGKILL" not in job.log  # no worker outlived the stop
    newest = f"{job.checkpoints}/lightning/step-{lightning_saved(job)[-1]:012d}.ckpt"
    assert re.search(rf"last checkpoint: +{re.escape(newest)} \(written ", job.status())


def test_lightnings_default_trainer_is_one_world_of_every_rank(
    sandbox: Running, tmp_path: Path, lightning_uninterrupted: str
) -> None:
    """A plain Trainer() (devices and num_nodes left to Lightning) would count one device
    on one node and train four models; the agent's PL_TRAINER_* make it one DDP world."""
    job = submit(sandbox, tmp_path, LIGHTNING, str(tmp_path), "default-trainer")
    assert job.wait_end() == "COMPLETED", job.log
    [result] = job.lines("RESULT")
    assert (result["world_size"], result["steps"]) == (4, 32), job.log
    assert result["digest"] == lightning_uninterrupted
