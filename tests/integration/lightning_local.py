"""A one-process Lightning run with hpclaunch's StopCheckpoint, for what the callback
itself decides: FOLDER ACCUMULATE STOP_AT. With STOP_AT >= 0 the first run sends itself
SIGUSR1 during training batch STOP_AT (counted from 1 over the whole run), as SLURM's
time-limit warning would. Each batch is made from its epoch and its place in the epoch,
so a resumed run trains exactly the batches an uninterrupted one does. At the end it
prints ``RESULT {...}``: a digest of the weights, the steps, and what it resumed from."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from typing import Any

import lightning as L
import torch

from hpclaunch.frameworks import lightning as hl

ACCUMULATE, STOP_AT = int(sys.argv[2]), int(sys.argv[3])
RESUMED = hl.resume_path()


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1, bias=False)

    def training_step(self, _batch: Any, _index: int) -> torch.Tensor:
        progress = self.trainer.fit_loop.epoch_loop.batch_progress
        if progress.total.ready == STOP_AT and RESUMED is None:
            os.kill(os.getpid(), signal.SIGUSR1)
        place = 1000 * self.current_epoch + progress.current.ready
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(place))
        return torch.nn.functional.mse_loss(self.layer(x), torch.sin(x.sum(1, keepdim=True)))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(list(range(10)))


trainer = L.Trainer(
    max_epochs=2,
    accumulate_grad_batches=ACCUMULATE,
    callbacks=[hl.StopCheckpoint()],
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
model = Regression()
trainer.fit(model, ckpt_path=RESUMED)
weights = model.layer.weight.detach().double().numpy().tobytes()
print(
    "RESULT "
    + json.dumps(
        {
            "digest": hashlib.sha256(weights).hexdigest(),
            "steps": trainer.global_step,
            "resumed": RESUMED,
        }
    )
)
