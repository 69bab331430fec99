"""The preemption flag a training loop polls: SIGTERM, SIGUSR1 and SIGUSR2 (what
SLURM and hpclaunch's agent send before a job is stopped) set it, and
``should_stop`` tells every rank the same answer at a step boundary."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)

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
        flag = torch.tensor([1.0 if self.requested else 0.0], device=device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)


def device() -> Any:
    """Where this worker's collectives run: its GPU (LOCAL_RANK) with NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
