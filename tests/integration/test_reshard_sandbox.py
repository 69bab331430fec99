"""A sharded checkpoint saved by 4 ranks resumed by jobs of 3 and 2 ranks on the sandbox:
examples/train_fsdp.py (FSDP2, gloo; its hidden size, 30, does not divide by 4, 3 or 2,
so the shards are uneven in every world) saves on 2 nodes x 2 workers, and jobs submitted
with a node range (``--nodes MIN:MAX``, one worker per node) adopt that checkpoint folder
and load it through torch's resharding. Every tensor of the model and the optimizer they
load equals the saved one: the digest of the whole state (``--state-digest``, gathered
with ``full_tensor()``) after the load is the one the 4-rank job had after its last save.
The local proof of the same, under torchrun, is test_checkpoint_sharded.py's
``test_saved_on_four_loads_on_any_number_of_ranks_exactly``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hpclaunch.slurm.hostlist import expand
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import EXAMPLES, Job, submit

pytestmark = pytest.mark.integration

TRAIN = EXAMPLES / "train_fsdp.py"
# Saves after steps 4 and 9; the last step is 9, so the state a job ends with is the one
# it saved last. A job that loads step 9 starts at 10 and trains no step: what it reports
# is what it loaded.
STEPS = ("--steps", "10", "--checkpoint-every", "5", "--step-time", "0", "--state-digest")


def result_of(job: Job) -> dict[str, object]:
    assert job.wait_end() == "COMPLETED", job.log
    [result] = job.lines("RESULT")
    return result


@pytest.fixture(scope="module")
def saved_on_four(sandbox: Running, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The checkpoints of a 4-rank run (2 nodes x 2) and the digest of its whole state
    after its last save (step 9)."""
    root = tmp_path_factory.mktemp("saved-on-four")
    job = submit(sandbox, root / "first", TRAIN, *STEPS, checkpoint_dir=root / "checkpoints")
    result = result_of(job)
    assert (result["world_size"], result["started_at"]) == (4, 0), job.log
    assert job.committed() == [4, 9]
    return root / "checkpoints", str(result["state"])


@pytest.mark.parametrize(("nodes", "ranks"), [("2:3", 3), ("1:2", 2)])
def test_saved_on_four_ranks_resumes_on_fewer_with_every_tensor_equal(
    sandbox: Running, tmp_path: Path, saved_on_four: tuple[Path, str], nodes: str, ranks: int
) -> None:
    saved, state = saved_on_four
    folder = tmp_path / "checkpoints"
    shutil.copytree(saved, folder)
    options = ("--nodes", nodes, "--nproc-per-node", "1", "--adopt-checkpoints")
    job = submit(sandbox, tmp_path, TRAIN, *STEPS, checkpoint_dir=folder, options=options)
    result = result_of(job)
    # SLURM gave the range's largest count (every node idle): one rank per node.
    assert len(expand(job.fields()["NodeList"])) == ranks, job.log
    assert [(s["step"], s["world_size"]) for s in job.lines("START")] == [(10, ranks)], job.log
    assert result["world_size"] == ranks
    assert result["state"] == state, job.log
    assert "cannot be loaded" not in job.log and "failed to load" not in job.log
    assert job.committed() == [4, 9]  # loaded, nothing set aside, nothing new saved
    assert job.history() == [(0, "completed", "none")]
