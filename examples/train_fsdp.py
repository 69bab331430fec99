"""A tiny deterministic FSDP2 training run with sharded, asynchronous checkpoints;
it resumes and reports a digest, as examples/train.py does for replicated state.

The model is sharded with ``fully_shard`` over a device mesh of every rank (CPU and
gloo here; on GPUs the same code runs with a "cuda" mesh and nccl). Its hidden
size, 30, does not divide by 4, so the shards are uneven and the last layer's
single row lives on rank 0 alone: loading such a checkpoint on a different number
of ranks goes through torch's resharding. Every ``--checkpoint-every`` steps the
state is saved asynchronously (training goes on once it is copied to host memory;
every rank writes its own shards); on a stop signal (SIGTERM, SIGUSR1 or SIGUSR2)
it is saved blocking, so that it is committed before the process exits. At the
end global rank 0 prints ``RESULT {...}``, whose digest (SHA-256 over the full
parameters, gathered, in name order, as float64) is the same for a run that was
interrupted and resumed as for one that was not, on the same number of ranks.

Faults to try the machinery with:
  --crash-rank R --crash-at S   rank R exits 3 at step S, on the job's first attempt only
  --fail-at S                   every rank raises at step S (a bug in the script)
  --bad-node NAME               workers on node NAME exit 4 at their first step (a bad GPU)
  --kill-in-save S              rank 1 SIGKILLs itself as soon as its asynchronous save of
                                step S has started, on the job's first attempt only: that
                                checkpoint can never be committed
  --hang-in-save S              rank 1 hangs inside checkpoint.save of step S (saved blocking
                                on every rank), on the job's first attempt only
  --hang-in-load                rank 1 hangs inside checkpoint.load_latest on the first
                                attempt of the first requeued run
  --hang-before-init A          rank 1 hangs before init_process_group in attempt A of the
                                job's first run (a rendezvous that never completes)
  --hang-in-pause S             after step S every rank evaluates in hpclaunch.progress.paused(),
                                where rank 1 hangs, on the job's first attempt only
  --plain-state-dict            save model.state_dict() and optimizer.state_dict(), as a first
                                script does: every rank refuses it at the first save, naming
                                the fix (get_state_dict)
  --state-digest                RESULT also holds "state": a digest of every tensor of the
                                model and the optimizer, gathered whole (to compare what a
                                run saved with what a run on other ranks loaded)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from hpclaunch import checkpoint, progress

FEATURES, HIDDEN, BATCH_PER_RANK = 16, 30, 8


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same global batch for a step on every run; each rank takes its slice."""
    gen = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(world * BATCH_PER_RANK, FEATURES, generator=gen)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    part = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
    return x[part], y[part]


def digest(model: torch.nn.Module) -> str:
    """Every rank calls it (gathering a sharded parameter is a collective)."""
    sha = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        full = value.full_tensor() if isinstance(value, DTensor) else value
        sha.update(name.encode())
        flat = full.detach().cpu().to(torch.float64).flatten().tolist()
        sha.update(struct.pack(f"<{len(flat)}d", *flat))
    return sha.hexdigest()


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Every rank calls it: the model's and the optimizer's state as a checkpoint holds
    them (get_state_dict), every sharded tensor gathered whole, so that it is the same
    on any number of ranks for the same state; settings (lr, step counts) included."""
    sha = hashlib.sha256()

    def walk(path: str, value: object) -> None:
        if isinstance(value, dict):
            for key in sorted(value, key=str):
                walk(f"{path}/{key}", value[key])
        elif isinstance(value, list | tuple):
            for index, item in enumerate(value):
                walk(f"{path}/{index}", item)
        elif isinstance(value, torch.Tensor):
            full = value.full_tensor() if isinstance(value, DTensor) else value
            flat = full.detach().cpu().to(torch.float64).flatten().tolist()
            sha.update(f"{path}:{tuple(full.shape)}".encode())
            sha.update(struct.pack(f"<{len(flat)}d", *flat))
        else:
            sha.update(f"{path}={value!r}".encode())

    model_state, optim_state = get_state_dict(model, optimizer)
    walk("", {"model": model_state, "optimizer": optim_state})
    return sha.hexdigest()


def say(kind: str, **fields: object) -> None:
    sys.stdout.write(f"{kind} {json.dumps(fields, sort_keys=True)}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--result", default=None, help="file for rank 0's RESULT line")
    parser.add_argument("--crash-rank", type=int, default=None)
    parser.add_argument("--crash-at", type=int, default=None)
    parser.add_argument("--fail-at", type=int, default=None)
    parser.add_argument("--bad-node", default=None)
    parser.add_argument("--kill-in-save", type=int, default=None)
    parser.add_argument("--hang-in-save", type=int, default=None)
    parser.add_argument("--hang-in-load", action="store_true")
    parser.add_argument("--hang-before-init", type=int, default=None)
    parser.add_argument("--hang-in-pause", type=int, default=None)
    parser.add_argument("--plain-state-dict", action="store_true")
    parser.add_argument("--state-digest", action="store_true")
    args = parser.parse_args()

    stop = checkpoint.Preemption.install()
    env = os.environ
    requeue, attempt = env.get("HPCLAUNCH_REQUEUE_COUNT", "0"), env.get("HPCLAUNCH_ATTEMPT", "0")
    if (
        args.hang_before_init is not None
        and (requeue, attempt) == ("0", str(args.hang_before_init))
        and env.get("RANK") == "1"
    ):
        hang(1, "before init_process_group")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    first_attempt = (
        os.environ.get("HPCLAUNCH_ATTEMPT", "0") == "0"
        and os.environ.get("HPCLAUNCH_REQUEUE_COUNT", "0") == "0"
    )
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())

    torch.manual_seed(0)  # the same full parameters on every rank, before sharding
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, 1),
    )
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def sharded_state() -> dict[str, Any]:
        """This rank's shards, as torch's helpers give them (to save, and to load into)."""
        if args.plain_state_dict:  # what a first script writes: refused at the first save
            return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        model_state, optim_state = get_state_dict(model, optimizer)
        return {"model": model_state, "optimizer": optim_state}

    def state_to_load() -> dict[str, Any]:
        # Built only when there is a checkpoint to load: get_state_dict gives a fresh
        # optimizer its state by stepping it, which a fresh start must not do.
        state = sharded_state()
        if args.hang_in_load and (requeue, attempt) == ("1", "0") and rank == 1:
            state["stall"] = Stall(rank, "in load_latest")  # DCP asks it for its state
        return state

    resumed = checkpoint.load_latest(into=state_to_load)
    start = 0
    if resumed is not None:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=resumed.state["model"],
            optim_state_dict=resumed.state["optimizer"],
        )
        start = resumed.step + 1
    if rank == 0:
        say("START", step=start, world_size=world, requeue=requeue, attempt=attempt)

    step = start
    for step in range(start, args.steps):
        if args.bad_node is not None and node == args.bad_node:
            sys.stderr.write(f"rank {rank}: node {node} is bad\n")
            sys.exit(4)
        if rank == args.crash_rank and step == args.crash_at and first_attempt:
            sys.stderr.write(f"rank {rank}: crashing at step {step}\n")
            sys.exit(3)
        if step == args.fail_at:
            raise ValueError(f"bad value at step {step}")
        x, y = batch(step, rank, world)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # FSDP2 reduce-scatters the gradients, averaged over the ranks
        optimizer.step()
        if args.step_time:
            time.sleep(args.step_time)
        if rank == 0 and step == start:
            say("FIRST_STEP", step=step, time=time.time())
        stopping = stop.should_stop()
        if stopping or (step + 1) % args.checkpoint_every == 0:
            saved = sharded_state()
            stall = step == args.hang_in_save
            if stall and rank == 1 and first_attempt:
                saved["stall"] = Stall(rank, "in checkpoint.save", step)
            checkpoint.save(saved, step, asynchronous=not (stopping or stall))
            if step == args.kill_in_save and rank == 1 and first_attempt:
                sys.stderr.write(f"rank {rank}: SIGKILL in the asynchronous save of step {step}\n")
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        if step == args.hang_in_pause:
            with progress.paused():  # an evaluation: no optimizer step for a while
                if rank == 1 and first_attempt:
                    hang(rank, "in a pause", step)
                dist.barrier()
        if stopping:
            if rank == 0:
                say(
                    "STOPPED", step=step, signal=stop.signal.name if stop.signal else "another rank"
                )
            dist.destroy_process_group()
            return
    checkpoint.wait()  # the last asynchronous save is committed (or raises) before the end
    summary = digest(model)
    state = state_digest(model, optimizer) if args.state_digest else None
    if rank == 0:
        result = {"steps": args.steps, "digest": summary, "started_at": start, "world_size": world}
        if state is not None:
            result["state"] = state
        say("RESULT", **result)
        if args.result:
            with open(args.result, "w") as handle:
                json.dump(result, handle)
    end()


def hang(rank: int, where: str, step: int | None = None) -> None:
    """Hang for good, asleep (hpclaunch's hang watch ends it; without one the others wait
    for this rank in their collectives), saying so on stderr first."""
    fields = {"rank": rank, "where": where, "step": step, "time": time.time()}
    sys.stderr.write(f"HANG {json.dumps(fields)}\n")
    sys.stderr.flush()
    while True:
        time.sleep(3600)


class Stall:
    """A ``Stateful`` entry of the state whose ``state_dict()`` never returns: DCP calls it
    inside checkpoint.save and load_latest, so the rank that holds one hangs in there, as
    a rank does whose storage stops answering."""

    def __init__(self, rank: int, where: str, step: int | None = None) -> None:
        self.rank, self.where, self.step = rank, where, step

    def state_dict(self) -> dict[str, object]:
        hang(self.rank, self.where, self.step)
        return {}

    def load_state_dict(self, state: dict[str, object]) -> None:
        hang(self.rank, self.where, self.step)


def end() -> None:
    """Leave the process group together and exit 0.

    torch 2.13's gloo sometimes aborts a process in its C++ teardown at exit
    ("terminate called without an active exception") after the work is done; the
    agent would take that for a failure and restart the group. So the process exits
    without that teardown, once its output is flushed."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
