"""A Lightning DDP script that checkpoints its own way: Lightning's ``ModelCheckpoint``
every SAVE_EVERY steps into OUT/checkpoints, and ``fit(ckpt_path=...)`` from the newest
of them; Adam. It knows nothing of the launcher but torchrun's variables: under a
torchrun-style launch Lightning takes its devices and nodes from LOCAL_WORLD_SIZE and
GROUP_WORLD_SIZE (its "auto" counts one device on one node), on CPU over gloo.

Each step trains a batch made from its global step and the rank (not from the
dataloader's position), so a run resumed mid-epoch trains the same batches as one that
nothing stopped. A callback on global rank 0 notes in OUT/steps.jsonl, one JSON line
each, flushed as it goes: where each run began (``resumed``: the global step of the
checkpoint it resumed from, 0 for a fresh start, and the parameters it starts from),
every optimizer step it completed with its time, loss and the parameters after it, and
the parameters at the end. The run is ``SLURM_RESTART_COUNT`` (absent, so 0, on the
first).

Usage: own_lightning.py OUT [--steps 30] [--save-every 10] [--step-time 0.25]
"""

import argparse
import json
import os
import re
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint


class Regression(L.LightningModule):
    def __init__(self, step_time):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(8, 1)
        self.step_time = step_time

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_time)  # stands for the real work of a step
        data = torch.Generator().manual_seed(1000 * self.global_step + self.global_rank)
        x = torch.randn(16, 8, generator=data)
        return torch.nn.functional.mse_loss(self.layer(x), torch.sin(x.sum(1, keepdim=True)))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(list(range(8 * self.trainer.world_size)))


class Steps(L.Callback):
    """Rank 0's note of each run's start, of every optimizer step and of the end."""

    def __init__(self, path, resumed):
        self.path = path
        self.resumed = resumed
        self.run = int(os.environ.get("SLURM_RESTART_COUNT", "0"))

    def note(self, trainer, **fields):
        if trainer.is_global_zero:
            with open(self.path, "a") as notes:
                notes.write(json.dumps({"run": self.run, **fields, "t": time.time()}) + "\n")

    def params(self, module):
        return [x for p in module.parameters() for x in p.detach().flatten().tolist()]

    def on_train_start(self, trainer, module):
        size = trainer.world_size
        self.note(trainer, resumed=self.resumed, world_size=size, params=self.params(module))

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        loss = outputs["loss"].item()
        self.note(trainer, step=trainer.global_step, loss=loss, params=self.params(module))

    def on_train_end(self, trainer, module):
        self.note(trainer, done=trainer.global_step, params=self.params(module))


def newest(folder):
    """The checkpoint of the highest step in ``folder`` and its step; (None, 0): none."""
    steps = {}
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        found = re.fullmatch(r"step=(\d+)\.ckpt", name)
        if found:
            steps[int(found.group(1))] = os.path.join(folder, name)
    return (steps[max(steps)], max(steps)) if steps else (None, 0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.25)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    folder = os.path.join(args.out, "checkpoints")
    last, resumed = newest(folder)
    saving = ModelCheckpoint(
        dirpath=folder, filename="{step}", every_n_train_steps=args.save_every, save_top_k=-1
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=int(os.environ["GROUP_WORLD_SIZE"]),
        strategy="ddp",
        max_steps=args.steps,
        callbacks=[saving, Steps(os.path.join(args.out, "steps.jsonl"), resumed)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regression(args.step_time), ckpt_path=last)


if __name__ == "__main__":
    main()
