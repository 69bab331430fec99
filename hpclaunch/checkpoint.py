"""Checkpoints that survive being killed, and the preemption flag a training loop polls.

A training script needs four calls::

    from hpclaunch import checkpoint

    stop = checkpoint.Preemption.install()        # SIGTERM/SIGUSR1/SIGUSR2 set a flag
    dist.init_process_group("gloo")
    resumed = checkpoint.load_latest()             # None on a fresh start
    start = 0
    if resumed is not None:
        model.load_state_dict(resumed.state["model"])
        optimizer.load_state_dict(resumed.state["optimizer"])
        start = resumed.step + 1
    for step in range(start, steps):
        train_one_step(step)
        stopping = stop.should_stop()              # every rank gets the same answer
        if stopping or (step + 1) % every == 0:
            checkpoint.save({"model": model.state_dict(),
                             "optimizer": optimizer.state_dict()}, step)
        if stopping:
            break

Every rank calls ``load_latest``, ``should_stop`` and ``save`` at the same steps (they
are collectives in a distributed job; ``if rank == 0: save(...)`` deadlocks). Only
global rank 0's ``state`` is written, which suits replicated (DDP-style) state, not
sharded state (FSDP, ZeRO).

``save`` writes into ``HPCLAUNCH_CHECKPOINT_DIR`` (the rendered job script sets
it) as ``step-000000000042.pt``: global rank 0 writes a temporary file in the
same folder, fsyncs it, renames it into place and fsyncs the folder, while the
other ranks wait in a barrier. A checkpoint either exists complete under its
final name or not at all, so ``latest`` never returns a half-written file, and a
complete checkpoint is never overwritten. torch is imported only by the
functions that need it.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from hpclaunch.errors import HpclaunchError
from hpclaunch.jobdir.atomic import write_atomic
from hpclaunch.node import worker_env

__all__ = [
    "ENV_VAR",
    "STOP_SIGNALS",
    "Checkpoint",
    "CheckpointError",
    "Loaded",
    "Preemption",
    "complete",
    "directory",
    "latest",
    "load_latest",
    "path_for",
    "prune",
    "save",
    "stop_received",
    "write_atomic",
]

ENV_VAR = worker_env.CHECKPOINT_DIR
DEFAULT_KEEP_LAST = 2
MAX_STEP = 10**12 - 1  # file names hold 12 digits
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
_NAME = re.compile(r"^step-(\d{12})\.pt$")
_TEMP = re.compile(r"^\.step-\d{12}\.pt\.tmp-\d+$")


class CheckpointError(HpclaunchError):
    """The checkpoint folder is not set or not usable; the message says how to fix it."""


@dataclass(frozen=True, order=True)
class Checkpoint:
    """A complete checkpoint on disk."""

    step: int
    path: Path


@dataclass(frozen=True)
class Loaded:
    """What ``load_latest`` returns: the step it was saved at and the saved state."""

    step: int
    state: Any
    path: Path


def directory(folder: str | os.PathLike[str] | None = None) -> Path:
    """``folder``, else ``$HPCLAUNCH_CHECKPOINT_DIR``; created if missing."""
    if folder is None:
        given = os.environ.get(ENV_VAR, "").strip()
        if not given:
            raise CheckpointError(
                f"{ENV_VAR} is not set; run the script through hpclaunch sbatch (which sets it) "
                "or pass folder=..."
            )
        folder = given
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create the checkpoint folder {str(path)!r}: {exc}") from None
    return path


def path_for(folder: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` goes. Raises ValueError outside 0..MAX_STEP."""
    if not 0 <= step <= MAX_STEP:
        raise ValueError(f"a checkpoint's step must be from 0 to {MAX_STEP}, not {step}")
    return folder / f"step-{step:012d}.pt"


def complete(folder: str | os.PathLike[str]) -> list[Checkpoint]:
    """The complete checkpoints in ``folder``, oldest first (temporary files ignored)."""
    found = []
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    for entry in entries:
        match = _NAME.match(entry.name)
        if match and entry.is_file():
            found.append(Checkpoint(int(match.group(1)), Path(entry.path)))
    return sorted(found)


def latest(folder: str | os.PathLike[str] | None = None) -> Checkpoint | None:
    """The newest complete checkpoint, or None."""
    found = complete(directory(folder))
    return found[-1] if found else None


def prune(folder: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints, and the temporary
    files of writers that were killed mid-write; return what was deleted. Call it only
    from the job's one writer (``save`` does, on global rank 0)."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, not {keep_last}")
    old = [item.path for item in complete(folder)[:-keep_last]]
    old += [Path(e.path) for e in os.scandir(folder) if _TEMP.match(e.name)]
    for path in old:
        path.unlink(missing_ok=True)
    return old


def save(
    state: Mapping[str, Any],
    step: int,
    *,
    folder: str | os.PathLike[str] | None = None,
    keep_last: int = DEFAULT_KEEP_LAST,
) -> Path:
    """Save ``state`` (anything ``torch.save`` takes) as the checkpoint of ``step``.

    In a distributed job, global rank 0 writes and every rank waits for it in a
    barrier, so all ranks return once the checkpoint is complete. Keeps the newest
    ``keep_last`` checkpoints. Returns the checkpoint's path. Raises CheckpointError
    when the folder is unusable, OSError when the write fails (the previous
    checkpoints stay)."""
    import torch
    import torch.distributed as dist

    target = path_for(directory(folder), step)
    distributed = dist.is_available() and dist.is_initialized()
    if not distributed or dist.get_rank() == 0:
        if not write_atomic(target, lambda handle: torch.save(dict(state), handle)):
            warnings.warn(
                f"{target} exists already and was kept (a complete checkpoint is never "
                "overwritten); save each step once",
                stacklevel=2,
            )
        prune(target.parent, keep_last)
    if distributed:
        dist.barrier()
    return target


def load_latest(
    folder: str | os.PathLike[str] | None = None,
    *,
    map_location: Any = "cpu",
    weights_only: bool = True,
) -> Loaded | None:
    """Load the newest complete checkpoint, or return None when there is none. In a
    distributed job every rank loads the step global rank 0 finds (a collective).
    Raises CheckpointError when the folder is unusable."""
    import torch
    import torch.distributed as dist

    found = latest(folder)
    if dist.is_available() and dist.is_initialized():
        # Every rank loads the step rank 0 found: directory listings on a shared
        # filesystem can lag, and ranks resuming from different steps diverge.
        chosen = torch.tensor([found.step if found is not None else -1], device=_device())
        dist.broadcast(chosen, src=0)
        step = int(chosen.item())
        found = None if step < 0 else Checkpoint(step, path_for(directory(folder), step))
    if found is None:
        return None
    state = torch.load(found.path, map_location=map_location, weights_only=weights_only)
    return Loaded(found.step, state, found.path)


_received: signal.Signals | None = None  # the last stop signal any Preemption flag got


def stop_received() -> signal.Signals | None:
    """The stop signal this process got through a ``Preemption`` flag, if any: the
    Python API's workers then leave no result, since the job is being requeued."""
    return _received


class Preemption:
    """A flag set by the stop signals; the training loop polls it at step boundaries.

    The handler only records the signal (no I/O, no collective, nothing that could
    deadlock mid-step). ``should_stop`` is the step-boundary check: in a distributed
    job it is a collective (an all_reduce of one number), so every rank must call it
    at the same step and all ranks get the same answer, even when the signal reached
    them at different steps."""

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None

    @classmethod
    def install(cls, signals: Iterable[signal.Signals] = STOP_SIGNALS) -> Preemption:
        flag = cls()
        for sig in signals:
            signal.signal(sig, flag._handle)
        return flag

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        global _received
        self.signal = _received = signal.Signals(signum)

    @property
    def requested(self) -> bool:
        """Whether this process got a stop signal (no communication)."""
        return self.signal is not None

    def should_stop(self) -> bool:
        """Whether any rank got a stop signal (a collective in a distributed job)."""
        if "torch.distributed" not in sys.modules:  # then no process group exists
            return self.requested
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self.requested
        flag = torch.tensor([1.0 if self.requested else 0.0], device=_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)


def _device() -> Any:
    """Where this worker's collectives run: its GPU (LOCAL_RANK) with NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
