"""A DDP script that checkpoints its own way, after PyTorch's multi-node example
(pytorch/examples distributed/ddp-tutorial-series/multinode.py): global rank 0
``torch.save``s a snapshot every SAVE_EVERY steps, and every rank loads it at start.
Plain SGD without momentum: the optimizer keeps no state, so the snapshot holds the
model and the step count only. It knows nothing of the launcher but torchrun's
RANK / WORLD_SIZE, on CPU over gloo.

Each step trains a batch made from the step's number and the rank, so a resumed run
trains the same batches as one that nothing stopped. Rank 0 notes in OUT/steps.jsonl,
one JSON line each, flushed as it goes: where each run began (``resumed``: the steps its
snapshot held, 0 for a fresh start, and the parameters it starts from), every optimizer
step it completed with its time, loss and the parameters after it, and the parameters at
the end. The run is ``SLURM_RESTART_COUNT`` (absent, so 0, on the first).

Usage: own_ddp_sgd.py OUT [--steps 30] [--save-every 10] [--step-time 0.25]
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, optimizer, args):
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.optimizer = optimizer
        self.save_every = args.save_every
        self.step_time = args.step_time
        self.steps_run = 0
        self.snapshot_path = os.path.join(args.out, "snapshot.pt")
        self.notes_path = os.path.join(args.out, "steps.jsonl")
        if os.path.exists(self.snapshot_path):
            self._load_snapshot()
        self.model = DDP(self.model)
        self.run = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        world_size = dist.get_world_size()
        self._note(
            run=self.run, resumed=self.steps_run, world_size=world_size, params=self._params()
        )

    def _note(self, **fields):
        if self.global_rank == 0:
            with open(self.notes_path, "a") as notes:
                notes.write(json.dumps({**fields, "t": time.time()}) + "\n")

    def _load_snapshot(self):
        snapshot = torch.load(self.snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.steps_run = snapshot["STEPS_RUN"]
        print(f"Resuming training from snapshot at step {self.steps_run}", flush=True)

    def _batch(self, step):
        data = torch.Generator().manual_seed(1000 * step + self.global_rank)
        source = torch.rand(8, 20, generator=data)
        return source, source.sum(1, keepdim=True).sin()

    def _run_batch(self, step):
        time.sleep(self.step_time)  # stands for the real work of a step
        source, targets = self._batch(step)
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        self._note(run=self.run, step=step + 1, loss=loss.item(), params=self._params())

    def _params(self):
        return [x for p in self.model.module.parameters() for x in p.detach().flatten().tolist()]

    def _save_snapshot(self, steps):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "STEPS_RUN": steps}
        torch.save(snapshot, self.snapshot_path)
        print(f"Step {steps} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_steps):
        for step in range(self.steps_run, max_steps):
            self._run_batch(step)
            if self.global_rank == 0 and (step + 1) % self.save_every == 0:
                self._save_snapshot(step + 1)
        self._note(run=self.run, done=max_steps, params=self._params())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.25)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    Trainer(model, optimizer, args).train(args.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
