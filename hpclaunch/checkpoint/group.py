"""The ranks' agreement on checkpoints: a gloo process group of the checkpoint's
own, made on first use by every rank (it is a collective, as ``save`` and
``load_latest`` are), so that a background save's collectives never interleave
with the training's, and so that agreeing costs no device memory under NCCL.
Without an initialised process group a process is alone: rank 0 of 1.
"""

from __future__ import annotations

import os
from typing import Any

from hpclaunch.node import worker_env

_group: Any = None
_default: Any = None  # the default group _group was made for


def on() -> bool:
    """Whether this process is one rank of an initialised process group."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if on() else 0


def world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if on() else 1


def get() -> Any:
    """The checkpoint's gloo group (None when alone). Made again when the script made
    a new default group (after destroying the old one)."""
    global _group, _default
    if not on():
        return None
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_group

    default = _get_default_group()
    if _group is None or _default is not default:
        _group, _default = dist.new_group(backend="gloo"), default
    return _group


def any_true(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (every rank calls it)."""
    if not on():
        return flag
    import torch
    import torch.distributed as dist

    value = torch.tensor([1 if flag else 0], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=get())
    return bool(value.item())


def from_rank0(value: int) -> int:
    """Rank 0's ``value``, on every rank."""
    if not on():
        return value
    import torch
    import torch.distributed as dist

    box = torch.tensor([value], dtype=torch.int64)
    dist.broadcast(box, src=0, group=get())
    return int(box.item())


def attempt_tag() -> str:
    """The same on every rank of one attempt, different for the next: names a save's
    temporary folder, so that a killed attempt's leftovers are never mistaken for
    this one's."""
    env = os.environ
    parts = (
        env.get(worker_env.JOB_ID) or env.get("TORCHELASTIC_RUN_ID") or "local",
        env.get(worker_env.REQUEUE_COUNT) or "0",
        env.get(worker_env.ATTEMPT) or env.get("TORCHELASTIC_RESTART_COUNT") or "0",
    )
    return "-".join("".join(c if c.isalnum() or c in "._" else "_" for c in p) for p in parts)
