"""A tiny deterministic data-parallel training run that checkpoints, resumes, and
reports a digest.

Fixed seeds, fixed data per step, gloo on the CPU: an interrupted run that resumes
from its checkpoints ends with exactly the parameters of an uninterrupted one, so
the SHA-256 digest it prints at the end is the same. Gradients are averaged with
one all_reduce per parameter, in a fixed order, rather than by
DistributedDataParallel: DDP lays its gradient buckets out anew after its first
iteration, and with more than two ranks the float sums of gloo's ring all_reduce
depend on that layout, so a resumed run (whose first iteration is not the job's)
would differ from an uninterrupted one in the last bits. It checkpoints every
``--checkpoint-every`` steps and when hpclaunch's preemption flag is set (SIGTERM,
SIGUSR1 or SIGUSR2), resumes from the latest complete checkpoint, and at the end
global rank 0 prints ``RESULT {...}`` and writes it to ``--result``.

Faults to try the machinery with:
  --crash-rank R --crash-at S   rank R exits 3 at step S, on the job's first attempt only
      --crash-code C            with exit status C instead (0: a clean early exit)
  --fail-at S                   every rank raises at step S (a bug in the script)
  --bad-node NAME               workers on node NAME exit 4 at their first step (a bad GPU)
  --hang-rank R --hang-at S     rank R hangs at step S, on the job's first attempt only:
      --hang-how stop           it stops itself (SIGSTOP), as a wedged process
      --hang-how sleep          it sleeps forever inside the loop; the others wait for it
  --hang-node NAME --hang-at S  the first worker on node NAME sleeps at step S, every time
  --hang-when-stopping R        rank R stops itself (SIGSTOP) instead of saving on a stop signal
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

import torch
import torch.distributed as dist

from hpclaunch import checkpoint, progress

FEATURES, HIDDEN, BATCH_PER_RANK = 16, 32, 8


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same global batch for a step on every run; each rank takes its slice."""
    gen = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(world * BATCH_PER_RANK, FEATURES, generator=gen)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    part = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
    return x[part], y[part]


def digest(model: torch.nn.Module) -> str:
    sha = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        sha.update(name.encode())
        flat = value.detach().cpu().to(torch.float64).flatten().tolist()
        sha.update(struct.pack(f"<{len(flat)}d", *flat))
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
    parser.add_argument("--crash-code", type=int, default=3)
    parser.add_argument("--fail-at", type=int, default=None)
    parser.add_argument("--bad-node", default=None)
    parser.add_argument("--hang-rank", type=int, default=None)
    parser.add_argument("--hang-at", type=int, default=None)
    parser.add_argument("--hang-how", choices=("stop", "sleep"), default="stop")
    parser.add_argument("--hang-node", default=None)
    parser.add_argument("--hang-when-stopping", type=int, default=None)
    parser.add_argument(
        "--linger", type=float, default=0.0, help="seconds to wait after the RESULT line"
    )
    args = parser.parse_args()

    stop = checkpoint.Preemption.install()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    first_attempt = (
        os.environ.get("HPCLAUNCH_ATTEMPT", "0") == "0"
        and os.environ.get("HPCLAUNCH_REQUEUE_COUNT", "0") == "0"
    )
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    resumed = checkpoint.load_latest()
    start = 0
    if resumed is not None:
        model.load_state_dict(resumed.state["model"])
        optimizer.load_state_dict(resumed.state["optimizer"])
        start = resumed.step + 1
    if rank == 0:
        env = os.environ
        requeue, attempt = env.get("HPCLAUNCH_REQUEUE_COUNT"), env.get("HPCLAUNCH_ATTEMPT")
        say("START", step=start, world_size=world, requeue=requeue, attempt=attempt)

    progress.report(total=args.steps)  # for `hpclaunch status`: step out of how many, ETA
    step = start
    for step in range(start, args.steps):
        if args.bad_node is not None and node == args.bad_node:
            sys.stderr.write(f"rank {rank}: node {node} is bad\n")
            sys.exit(4)
        if rank == args.crash_rank and step == args.crash_at and first_attempt:
            what = "crashing" if args.crash_code else "exiting 0"
            sys.stderr.write(f"rank {rank}: {what} at step {step}\n")
            sys.exit(args.crash_code)
        if step == args.fail_at:
            raise ValueError(f"bad value at step {step}")
        if step == args.hang_at and hangs_here(args, rank, node, first_attempt):
            hang(args.hang_how, rank, step)
        x, y = batch(step, rank, world)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        for param in model.parameters():  # average the gradients, in a fixed order
            assert param.grad is not None
            dist.all_reduce(param.grad)
            param.grad /= world
        optimizer.step()  # counts the step for `hpclaunch status` by itself
        progress.report(loss=loss.item())  # shown there too (this rank's, the lowest's)
        if args.step_time:
            time.sleep(args.step_time)
        if rank == 0 and step == start:
            say("FIRST_STEP", step=step, time=time.time())
        stopping = stop.should_stop()
        if stopping and rank == args.hang_when_stopping:
            hang("stop", rank, step)
        if stopping or (step + 1) % args.checkpoint_every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            checkpoint.save(state, step)
        if stopping:
            if rank == 0:
                say(
                    "STOPPED", step=step, signal=stop.signal.name if stop.signal else "another rank"
                )
            dist.destroy_process_group()
            return
    if rank == 0:
        result = {
            "steps": args.steps,
            "digest": digest(model),
            "started_at": start,
            "world_size": world,
        }
        say("RESULT", **result)
        if args.result:
            with open(args.result, "w") as handle:
                json.dump(result, handle)
    if args.linger:  # a test's window for a fault after the last step
        time.sleep(args.linger)
    end()


def hangs_here(args: argparse.Namespace, rank: int, node: str, first_attempt: bool) -> bool:
    """Whether this rank is the one to hang (see --hang-rank and --hang-node)."""
    if args.hang_node is not None:
        return node == args.hang_node and os.environ.get("LOCAL_RANK") == "0"
    return rank == args.hang_rank and first_attempt


def hang(how: str, rank: int, step: int) -> None:
    """Hang for good: stopped by SIGSTOP, or asleep in this loop (hpclaunch's hang
    detector ends it; without one the others wait in their all_reduce)."""
    sys.stderr.write(f"HANG {json.dumps({'rank': rank, 'step': step, 'time': time.time()})}\n")
    sys.stderr.flush()
    if how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    while True:
        time.sleep(3600)


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
