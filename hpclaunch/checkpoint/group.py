"""The ranks' agreement on checkpoints: a gloo process group of the checkpoint's
own, made on first use by every rank in the training's thread (process groups must
be made in the same order on every rank; ``save`` and ``load_latest`` are
collectives), so that a background save's collectives never interleave with the
training's, and so that agreeing costs no device memory under NCCL. Without an
initialised process group a process is alone: rank 0 of 1.

``Ranks.now()`` is taken in the training's thread; a background save uses that
snapshot, and refuses to go on when the process group was destroyed meanwhile.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpclaunch.checkpoint.store import CheckpointError
from hpclaunch.contract import worker_env

_made: dict[int, Any] = {}  # id of the default group -> the checkpoint's group for it


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job, and the checkpoint's group (None: alone)."""

    rank: int
    world: int
    pg: Any
    default: int = 0  # id of the default group the snapshot was taken in

    @classmethod
    def now(cls) -> Ranks:
        """Call in the training's thread: may make the group (a collective)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return cls(0, 1, None)
        from torch.distributed.distributed_c10d import _get_default_group

        key = id(_get_default_group())
        if key not in _made:  # a new default group (the script made one again)
            _made.clear()
            _made[key] = dist.new_group(backend="gloo")
        return cls(dist.get_rank(), dist.get_world_size(), _made[key], key)

    @property
    def alone(self) -> bool:
        return self.pg is None

    def check_alive(self, what: str) -> None:
        """Raise when the process group this snapshot was taken in is gone (torch's
        distributed checkpoint would then quietly write as a single process)."""
        import torch.distributed as dist

        if self.alone:
            return
        from torch.distributed.distributed_c10d import _get_default_group

        if not dist.is_initialized() or id(_get_default_group()) != self.default:
            raise CheckpointError(
                f"the process group was destroyed while {what} was in flight; call "
                "checkpoint.wait() before dist.destroy_process_group()"
            )

    def first_true(self, flag: bool) -> int | None:
        """The lowest rank whose ``flag`` is true, or None (every rank calls it)."""
        if self.alone:
            return 0 if flag else None
        import torch
        import torch.distributed as dist

        value = torch.tensor([self.rank if flag else self.world], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self.pg)
        found = int(value.item())
        return None if found >= self.world else found

    def minimum(self, *values: int) -> tuple[int, ...]:
        """Each value's minimum over the ranks: one collective (every rank calls it
        with as many values)."""
        if self.alone:
            return values
        import torch
        import torch.distributed as dist

        box = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(box, op=dist.ReduceOp.MIN, group=self.pg)
        return tuple(int(v) for v in box.tolist())

    def from_rank0(self, value: int) -> int:
        """Rank 0's ``value``, on every rank."""
        return self.from_rank(0, value)

    def from_rank(self, src: int, value: int) -> int:
        """Rank ``src``'s ``value``, on every rank (every rank calls it)."""
        if self.alone:
            return value
        import torch
        import torch.distributed as dist

        box = torch.tensor([value], dtype=torch.int64)
        dist.broadcast(box, src=src, group=self.pg)
        return int(box.item())


def attempt_tag(env: Mapping[str, str] = os.environ) -> str:
    """The same on every rank of one attempt, different for the next: names a save's
    temporary folder, so that a killed attempt's leftovers are never mistaken for
    this one's."""
    parts = (
        env.get(worker_env.JOB_ID) or env.get("TORCHELASTIC_RUN_ID") or "local",
        env.get(worker_env.REQUEUE_COUNT) or "0",
        env.get(worker_env.ATTEMPT) or env.get("TORCHELASTIC_RESTART_COUNT") or "0",
    )
    return "-".join("".join(c if c.isalnum() or c in "._" else "_" for c in p) for p in parts)
