"""Sharded, asynchronous checkpoints end to end on the sandbox: examples/train_fsdp.py
(FSDP2 on 2 nodes x 2 workers, gloo) interrupted in each way resumes from its last
committed sharded checkpoint and ends with exactly the digest of an uninterrupted
run, and leaves no process of the job behind (``Job.wait_end``)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from hpclaunch.sandbox.cluster import NodeAction
from hpclaunch.slurm.hostlist import expand
from tests.integration.helpers import flip_a_tensor_byte
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import (
    CRASH,
    EXAMPLES,
    Job,
    check_restarted_in_place,
    digest_of,
)
from tests.integration.training_jobs import submit as submit_script

pytestmark = pytest.mark.integration

TRAIN = EXAMPLES / "train_fsdp.py"
# Periodic (asynchronous) saves after steps 4, 9, 14, 19, 24 and 29.
STEPS = ("--steps", "30", "--checkpoint-every", "5", "--step-time", "0.15")


def submit(
    sandbox: Running,
    folder: Path,
    *args: str,
    checkpoint_dir: Path | None = None,
    options: tuple[str, ...] = (),
) -> Job:
    return submit_script(
        sandbox, folder, TRAIN, *STEPS, *args, checkpoint_dir=checkpoint_dir, options=options
    )


@pytest.fixture(scope="module")
def uninterrupted(reference_digest: Callable[..., str]) -> str:
    """The digest of a run that nothing interrupts."""
    return reference_digest(TRAIN, *STEPS)


def saves(job: Job) -> list[dict[str, object]]:
    """The job's committed saves as global rank 0 noted them, in order."""
    lines = (job.job_dir / "checkpoint-saves.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("how", ["scontrol requeue", "time-limit warning"])
def test_an_interrupted_job_resumes_from_its_stop_checkpoint(
    sandbox: Running, tmp_path: Path, uninterrupted: str, how: str
) -> None:
    job = submit(sandbox, tmp_path)
    job.wait_checkpoint(9)
    interrupt = {
        "scontrol requeue": ("scontrol", "requeue", str(job.id)),
        "time-limit warning": ("scancel", "--signal=USR1", "--batch", str(job.id)),
    }
    job.run(*interrupt[how])
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    starts = job.lines("START")
    assert [s["requeue"] for s in starts] == ["0", "1"]
    # The save on the stop signal blocks until it is committed, so it is the last one
    # of the first run, and the next run starts right after it.
    [stopped] = job.lines("STOPPED")
    stop_step = int(str(stopped["step"]))
    assert stop_step >= 10 and starts[1]["step"] == stop_step + 1, job.log
    assert job.fields()["Restarts"] == "1"
    by_us = how == "time-limit warning"
    first = ("time limit", "requeue") if by_us else ("requeued by SLURM", "SLURM requeues")
    assert job.history() == [(0, *first), (1, "completed", "none")]
    # Periodic saves in the background, the stop's blocking; all of them by all 4 ranks.
    forms = {int(str(r["step"])): (r["sharded"], r["asynchronous"], r["ranks"]) for r in saves(job)}
    assert forms[4] == forms[9] == (True, True, 4)
    assert forms[stop_step] == (True, False, 4)


def test_a_lost_node_requeues_the_job_onto_a_spare(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit(sandbox, tmp_path)
    job.wait_checkpoint(9)
    lost = expand(job.fields()["NodeList"])[1]  # not the node of the batch step
    try:
        sandbox.box.kill_node(lost)
        # No later save can be written whole without the lost node's ranks; one that
        # was (every rank's part and the metadata) may still be renamed after this.
        before = job.committed()
        sandbox.box.set_node_state(lost, NodeAction.DOWN, "test: node lost")
        assert job.wait_end() == "COMPLETED", job.log
    finally:
        sandbox.box.start_node(lost)  # and back to service, for the next tests
    assert digest_of(job) == uninterrupted
    assert job.fields()["Restarts"] == "1"
    assert job.history() == [(0, "requeued by SLURM", "SLURM requeues"), (1, "completed", "none")]
    runs = json.loads((job.job_dir / "history.json").read_text())["runs"]
    assert lost in expand(runs[0]["nodes"]) and lost not in expand(runs[1]["nodes"])
    starts = job.lines("START")
    assert [s["requeue"] for s in starts] == ["0", "1"]
    resumed_from = int(str(starts[1]["step"])) - 1
    # A periodic checkpoint (no stop save can be written by 3 ranks of 4), the last one.
    assert resumed_from % 5 == 4 and resumed_from >= before[-1] >= 9, (before, job.log)


def test_a_worker_crash_is_restarted_in_place(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    check_restarted_in_place(submit(sandbox, tmp_path, *CRASH), uninterrupted)


def test_a_worker_killed_in_an_asynchronous_save_leaves_it_uncommitted(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit(sandbox, tmp_path, "--kill-in-save", "14")
    assert job.wait_end() == "COMPLETED", job.log
    assert "rank 1: SIGKILL in the asynchronous save of step 14" in job.log
    assert digest_of(job) == uninterrupted
    starts = job.lines("START")
    # The restarted group found no step-...14: load_latest takes the newest committed
    # checkpoint and would have started at 15, or reported it damaged and set it
    # aside. The save of 14 the other ranks had in flight never became visible.
    assert [(s["attempt"], s["requeue"], s["step"]) for s in starts] == [
        ("0", "0", 0),
        ("1", "0", 10),
    ]
    assert "cannot be loaded" not in job.log
    assert not list(job.checkpoints.glob("*.damaged"))
    assert [r["step"] for r in saves(job)] == [4, 9, 14, 19, 24, 29]  # 14 by attempt 1 only
    assert job.fields()["Restarts"] == "0"
    assert job.history() == [(0, "completed", "none")]


def test_a_truncated_latest_checkpoint_is_set_aside_and_the_previous_one_used(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    """The second job runs the same 30 steps as the first: it must load step 24 (so it
    starts at 25, neither at 30, from the damaged 29, nor at 0) and train 25..29 into
    exactly the parameters of the uninterrupted run, which the module has already."""
    folder = tmp_path / "checkpoints"
    first = submit(sandbox, tmp_path / "first", checkpoint_dir=folder)
    assert first.wait_end() == "COMPLETED", first.log
    assert first.committed() == [24, 29]
    latest = folder / f"step-{29:012d}"
    shard = sorted(latest.glob("__*_0.distcp"))[0]
    size = shard.stat().st_size
    os.truncate(shard, size // 2)

    # The first job's folder, on purpose.
    again = submit(
        sandbox, tmp_path / "again", checkpoint_dir=folder, options=("--adopt-checkpoints",)
    )
    assert again.wait_end() == "COMPLETED", again.log
    # Its manifest holds each file's size: caught before torch reads it.
    assert (
        f"hpclaunch checkpoint: {latest} failed to load (step 29: size mismatch in {shard.name}: "
        f"{shard} holds {size // 2} bytes, its manifest {size})"
    ) in again.log
    assert f"set aside as {latest.name}.damaged; resumed from step-{24:012d}" in again.log
    assert (folder / f"{latest.name}.damaged" / shard.name).stat().st_size == size // 2
    assert [(s["attempt"], s["requeue"], s["step"]) for s in again.lines("START")] == [
        ("0", "0", 25)
    ]
    assert digest_of(again) == uninterrupted
    assert again.history() == [(0, "completed", "none")]
    assert again.committed() == [24, 29]  # a new 29, beside the damaged one


@pytest.fixture(scope="module")
def saved_to_29(sandbox: Running, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoints of one uninterrupted run: steps 24 and 29 (keep_last=2)."""
    root = tmp_path_factory.mktemp("saved-to-29")
    first = submit(sandbox, root / "first", checkpoint_dir=root / "checkpoints")
    assert first.wait_end() == "COMPLETED", first.log
    assert first.committed() == [24, 29]
    return root / "checkpoints"


def _flip_a_byte(folder: Path) -> str:
    """A bit of rank 2's shard of step 29 flipped, inside a tensor's bytes (torch would
    load it without a word): its size stays. Loaded by 4 ranks, rank 3 sums it."""
    flip_a_tensor_byte(folder / f"step-{29:012d}" / "__2_0.distcp")
    return "checksum mismatch in __2_0.distcp"


def _older_under_newer_name(folder: Path) -> str:
    """Step 24's checkpoint under step 29's name: loaded on its name, the job would
    start at 30 with step 24's weights and end with another model."""
    newest = folder / f"step-{29:012d}"
    shutil.rmtree(newest)
    shutil.copytree(folder / f"step-{24:012d}", newest)
    return "step mismatch"


@pytest.mark.parametrize("damage", [_flip_a_byte, _older_under_newer_name], ids=["flip", "swap"])
def test_a_latest_checkpoint_that_fails_its_manifest_is_set_aside_and_the_previous_one_used(
    sandbox: Running,
    tmp_path: Path,
    uninterrupted: str,
    saved_to_29: Path,
    damage: Callable[[Path], str],
) -> None:
    """Damage torch would load without a word: the manifest catches it, every rank
    agrees, step 24 is loaded (the job starts at 25) and the job ends with exactly the
    uninterrupted run's parameters; the batch log and status name step 29 and why."""
    folder = tmp_path / "checkpoints"
    shutil.copytree(saved_to_29, folder)
    problem = damage(folder)
    latest = folder / f"step-{29:012d}"

    again = submit(
        sandbox, tmp_path / "again", checkpoint_dir=folder, options=("--adopt-checkpoints",)
    )
    assert again.wait_end() == "COMPLETED", again.log
    assert f"hpclaunch checkpoint: {latest} failed to load (step 29: {problem}" in again.log
    assert f"set aside as {latest.name}.damaged; resumed from step-{24:012d}" in again.log
    assert [(s["attempt"], s["requeue"], s["step"]) for s in again.lines("START")] == [
        ("0", "0", 25)
    ]
    assert digest_of(again) == uninterrupted
    assert again.history() == [(0, "completed", "none")]
    assert again.committed() == [24, 29]  # a new 29, beside the damaged one
    assert (folder / f"{latest.name}.damaged").is_dir()
    assert f"note: checkpoint step 29 set aside: {problem}" in again.status()
    assert f"(now {folder / latest.name}.damaged)" in again.status()


def test_plain_state_dicts_stop_the_job_at_its_first_save_naming_the_fix(
    sandbox: Running, tmp_path: Path
) -> None:
    """``model.state_dict()`` and ``optimizer.state_dict()`` of an FSDP2 model, as a first
    script saves them: the optimizer's numbered entries could never be loaded back, so
    every rank refuses them at the first save (step 4), before anything is written, and
    the job fails as a bug does: at once, without a requeue, no rank left waiting."""
    job = submit(sandbox, tmp_path, "--plain-state-dict")
    assert job.wait_end() == "FAILED", job.log
    fix = (
        "CheckpointError: checkpoint.save cannot save 'optimizer' as a sharded checkpoint: it is "
        "optimizer.state_dict() (or the optimizer), whose entries are numbered, and no "
        "optimizer can load it back as a sharded checkpoint loads; save the optimizer as "
        "torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer) gives it "
        "(model_state, optim_state), and load it the same way"
    )
    assert fix in job.log
    assert job.history() == [(0, "the same error on every node", "none")]
    assert job.fields()["Restarts"] == "0"
    assert [s["attempt"] for s in job.lines("START")] == ["0"], job.log
    assert not job.lines("STOPPED") and not job.lines("RESULT")
    # Nothing written: no committed checkpoint, no temporary folder of a save begun (the
    # folder's owner marker, written at start, is all there is).
    assert job.committed() == []
    assert not [p.name for p in job.checkpoints.iterdir() if p.name.startswith(".step-")]
