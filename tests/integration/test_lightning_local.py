"""hpclaunch's StopCheckpoint in a real one-process Lightning run (no SLURM): a stop
within gradient accumulation waits for the optimizer step, a stopped run resumes to
exactly the weights of an uninterrupted one, training's end leaves a checkpoint, and a
callback order that would make a checkpoint miss a batch is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpclaunch import progress

pytestmark = pytest.mark.integration
lightning = pytest.importorskip("lightning")  # the test tier installs it (.[frameworks])

SCRIPT = Path(__file__).with_name("lightning_local.py")


def run(folder: Path, accumulate: int, stop_at: int) -> tuple[int, dict[str, Any] | None]:
    """The script's exit status and its RESULT, if it printed one."""
    env = {
        **os.environ,
        "HPCLAUNCH_CHECKPOINT_DIR": str(folder / "checkpoints"),
        "HPCLAUNCH_PROGRESS_FILE": str(folder / "rank.progress"),  # as the agent sets it
    }
    env.pop("WORLD_SIZE", None)
    argv = [sys.executable, str(SCRIPT), str(folder), str(accumulate), str(stop_at)]
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) <= 1, done.stdout
    return done.returncode, json.loads(results[0][7:]) if results else None


def saved(folder: Path) -> list[str]:
    return sorted(os.listdir(folder / "checkpoints" / "lightning"))


# 10 batches an epoch, 2 epochs; with accumulation 4 the optimizer steps after batches
# 4, 8 and 10 of each epoch (3 steps an epoch), else after every batch. SIGUSR1 comes
# during batch 6: the run stops at the first optimizer step from there on.
@pytest.mark.parametrize(("accumulate", "steps", "stopped_at"), [(1, 20, 6), (4, 6, 2)])
def test_a_stopped_run_saves_at_an_optimizer_step_and_resumes_exactly(
    tmp_path: Path, accumulate: int, steps: int, stopped_at: int
) -> None:
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    whole.mkdir()
    stopped.mkdir()
    status, uninterrupted = run(whole, accumulate, -1)
    assert status == 0 and uninterrupted is not None and uninterrupted["steps"] == steps
    assert saved(whole) == [f"step-{steps:012d}.ckpt"]  # training's end saves too
    status, result = run(stopped, accumulate, 6)
    assert (status, result) == (0, None)  # stopped (the agent makes it 128 + SIGUSR1)
    assert saved(stopped) == [f"step-{stopped_at:012d}.ckpt"]
    board = progress.read(str(stopped / "rank.progress"))
    assert board is not None and board.resumed_by is None  # Lightning's step 0: not said
    status, result = run(stopped, accumulate, 6)
    assert status == 0 and result is not None
    assert result["resumed"] == str(stopped / "checkpoints" / "lightning" / saved(stopped)[0])
    assert (result["digest"], result["steps"]) == (uninterrupted["digest"], steps)
    board = progress.read(str(stopped / "rank.progress"))
    assert board is not None and (board.resumed, board.resumed_by) == (stopped_at, "lightning")


@pytest.mark.filterwarnings("ignore:The `srun` command is available")  # Lightning, on this host
def test_a_callback_after_stop_checkpoint_that_ends_batches_is_refused(tmp_path: Path) -> None:
    import torch

    from hpclaunch.frameworks import lightning as hl

    class Averaging(lightning.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            pass

    class Model(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch: Any, _index: int) -> Any:
            return self.layer(batch.float()).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(torch.ones(4, 1))

    trainer = lightning.Trainer(
        callbacks=[hl.StopCheckpoint(dirpath=tmp_path), Averaging()],
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    with pytest.raises(RuntimeError, match="StopCheckpoint comes before Averaging in Trainer"):
        trainer.fit(Model())
