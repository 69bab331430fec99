"""A DDP training loop that checkpoints its own way: every SAVE_EVERY steps global rank
0 ``torch.save``s the model, the AdamW optimizer's state and the step count to
OUT/checkpoint.pt (written beside it, then renamed over it), and every rank resumes
from it at start. It knows nothing of the launcher but torchrun's RANK / WORLD_SIZE,
on CPU over gloo.

Each step trains a batch made from the step's number and the rank, so a resumed run
trains the same batches as one that nothing stopped. Rank 0 notes in OUT/steps.jsonl,
one JSON line each, flushed as it goes: where each run began (``resumed``: the steps its
checkpoint held, 0 for a fresh start, and the parameters it starts from), every
optimizer step it completed with its time, loss and the parameters after it, and the
parameters at the end. The run is ``SLURM_RESTART_COUNT`` (absent, so 0, on the first).

Usage: own_ddp_adamw.py OUT [--steps 30] [--save-every 10] [--step-time 0.25]
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def note(path, **fields):
    with open(path, "a") as notes:
        notes.write(json.dumps({**fields, "t": time.time()}) + "\n")


def batch(step, rank):
    data = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=data)
    return x, torch.sin(x.sum(1, keepdim=True))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.25)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    checkpoint = os.path.join(args.out, "checkpoint.pt")
    steps = os.path.join(args.out, "steps.jsonl")
    rank = int(os.environ["RANK"])
    run = int(os.environ.get("SLURM_RESTART_COUNT", "0"))

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    start = 0
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"resumed from {checkpoint} at step {start}", flush=True)
    ddp = DDP(model)

    def params():
        return [x for p in model.parameters() for x in p.detach().flatten().tolist()]

    if rank == 0:
        note(steps, run=run, resumed=start, world_size=dist.get_world_size(), params=params())
    for step in range(start, args.steps):
        time.sleep(args.step_time)  # stands for the real work of a step
        x, y = batch(step, rank)
        optimizer.zero_grad()
        loss = F.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        if rank == 0:
            note(steps, run=run, step=step + 1, loss=loss.item(), params=params())
        if rank == 0 and (step + 1) % args.save_every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save({**state, "step": step + 1}, checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)
    if rank == 0:
        note(steps, run=run, done=args.steps, params=params())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
