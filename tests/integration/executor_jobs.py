"""Functions the Executor tests submit. They are pickled by reference, so every
worker imports this module (the job runs in the repository's root, like a user's
package in their project folder)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from submitit.helpers import Checkpointable

from hpclaunch import checkpoint


def _rank() -> int:
    return int(os.environ["RANK"])


def all_reduce(offset: float) -> dict[str, Any]:
    """Each rank adds RANK + offset; every rank returns what it saw, rank 0's is the result."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([_rank() + offset])
    dist.all_reduce(total)
    # Which node each rank ran on (the sandbox's nodes are n1, n2, ...; this torch
    # has no numpy, which all_gather_object needs).
    node = int("".join(c for c in os.environ.get("SLURMD_NODENAME", "n0") if c.isdigit()))
    hosts = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(hosts, torch.tensor([float(node)]))
    dist.destroy_process_group()
    return {
        "rank": _rank(),
        "world_size": int(os.environ["WORLD_SIZE"]),
        "sum": total.item(),
        "hosts": [f"n{int(h.item())}" for h in hosts],
        "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]),
    }


def fail_on(rank: int) -> None:
    """Rank ``rank`` raises; the others wait to be stopped."""
    if _rank() == rank:
        raise ValueError(f"rank {rank} cannot go on")
    time.sleep(120)


def fail_once(marker: str) -> dict[str, Any]:
    """Rank 3 (on the second node) raises the first time; the worker group restarts in
    place and every rank returns the restart count torch gave it, which differs by
    node: the agent whose worker failed counts a restart, the other does not."""
    import torch
    import torch.distributed as dist

    if _rank() == 3 and not Path(marker).exists():
        Path(marker).touch()
        raise RuntimeError("rank 3 fails once")
    dist.init_process_group("gloo")
    counts = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, torch.tensor([float(os.environ["TORCHELASTIC_RESTART_COUNT"])]))
    dist.destroy_process_group()
    return {"restart_counts": [int(c.item()) for c in counts], "rank": _rank()}


def count_to(steps: int, step_time: float) -> dict[str, Any]:
    """Sum 0..steps-1, one step at a time, checkpointing every step (hpclaunch's
    protocol: the Preemption flag, checkpoint.save, resume from load_latest)."""
    import torch.distributed as dist

    stop = checkpoint.Preemption.install()
    dist.init_process_group("gloo")
    resumed = checkpoint.load_latest()
    start = resumed.step + 1 if resumed else 0
    total = int(resumed.state["total"]) if resumed else 0
    for step in range(start, steps):
        total += step
        time.sleep(step_time)
        checkpoint.save({"total": total}, step)
        if stop.should_stop():
            dist.destroy_process_group()
            return {"stopped_at": step}
    dist.destroy_process_group()
    return {
        "total": total,
        "started_at": start,
        "world_size": int(os.environ["WORLD_SIZE"]),
        "requeue": int(os.environ["HPCLAUNCH_REQUEUE_COUNT"]),
    }


def _note(path: Path, step: int) -> None:
    data = str(step).encode()
    checkpoint.write_atomic(path, lambda handle: handle.write(data), replace=True)


class Counter(Checkpointable):
    """submitit's checkpointing: the state lives in the callable, and checkpoint()
    (inherited) pickles it for the next run."""

    def __init__(self) -> None:
        self.done: list[int] = []

    def __call__(self, steps: int, step_time: float, progress: str) -> dict[str, Any]:
        first = len(self.done)
        for step in range(first, steps):
            time.sleep(step_time)
            self.done.append(step)
            if _rank() == 0:
                _note(Path(progress), step)
        return {
            "first": first,
            "done": list(self.done),
            "requeue": int(os.environ["HPCLAUNCH_REQUEUE_COUNT"]),
        }
