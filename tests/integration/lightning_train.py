"""A Lightning DDP job as its users write one, with hpclaunch's two additions
(``trainer_args()`` and the ``StopCheckpoint`` callback) and ``fit(ckpt_path=
resume_path())``: 4 epochs of 8 batches on each of the job's ranks.

Each batch is made from the optimizer step it trains (not from the dataloader's
position), so a run resumed mid-epoch from Lightning's checkpoint trains exactly the
batches an uninterrupted one does, and ends with its digest. The model has one weight
tensor: DDP's gradient buckets then have one layout on every run. Rank 0 prints
``START {...}`` when training starts and ``RESULT {...}`` at the end; every rank notes
each stop signal it gets in FOLDER/requeue-Q-rank-R.txt, one line per delivery.
Arguments: FOLDER [STEP_TIME | default-trainer], the last for a plain ``Trainer()``."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from hpclaunch.frameworks import lightning as hl

FOLDER = Path(sys.argv[1])
DEFAULT_TRAINER = sys.argv[2:] == ["default-trainer"]  # Trainer() as Lightning's docs write it
STEP_TIME = float(sys.argv[2]) if len(sys.argv) > 2 and not DEFAULT_TRAINER else 0.0
REQUEUE, RANK = os.environ.get("HPCLAUNCH_REQUEUE_COUNT", "0"), int(os.environ["RANK"])


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(8, 1, bias=False)

    def training_step(self, _batch: Any, _index: int) -> torch.Tensor:
        data = torch.Generator().manual_seed(1000 * self.global_step + self.global_rank)
        x = torch.randn(16, 8, generator=data)
        if STEP_TIME:
            time.sleep(STEP_TIME)
        return torch.nn.functional.mse_loss(self.layer(x), torch.sin(x.sum(1, keepdim=True)))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(list(range(8 * self.trainer.world_size)))


class Report(L.Callback):
    """START from rank 0, and a note of every stop signal (chained to the handler
    that StopCheckpoint installed just before)."""

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, _noting(signal.getsignal(sig)))
        if trainer.is_global_zero:
            print("START " + json.dumps({"step": trainer.global_step, "requeue": REQUEUE}))


def _noting(then: Any) -> Any:
    notes = FOLDER / f"requeue-{REQUEUE}-rank-{RANK}.txt"

    def note(signum: int, frame: Any) -> None:
        with notes.open("a") as out:
            out.write(f"{signal.Signals(signum).name}\n")
        then(signum, frame)

    return note


trainer = L.Trainer(
    **({} if DEFAULT_TRAINER else hl.trainer_args()),
    max_epochs=4,
    callbacks=[hl.StopCheckpoint(every_n_steps=5), Report()],
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
model = Regression()
trainer.fit(model, ckpt_path=hl.resume_path())
if trainer.is_global_zero:
    sha = hashlib.sha256(model.layer.weight.detach().double().numpy().tobytes()).hexdigest()
    print(
        "RESULT "
        + json.dumps(
            {"digest": sha, "steps": trainer.global_step, "world_size": trainer.world_size}
        )
    )
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # gloo's teardown at interpreter exit can abort; everything is written
