"""The supervisor's heartbeat: a small file in the job folder that the supervisor
rewrites from its main wait loop while the step runs, so that the agents can tell a
supervisor that stopped answering (hpclaunch.recovery.watch). No torch.

    agents/requeue-Q/supervisor.beat    "PID SEQUENCE BOUND\\n", fixed width, rewritten in place

BOUND is the seconds after which the agents may take the beat for stopped (the job's
``--watch-timeout``): the supervisor says it, so the agents need no setting of their own.

It is rewritten in place (one pwrite at offset 0, never renamed): on NFS, close-to-open
consistency makes every open() see the latest content, while a file's mtime or a
renamed file's name can be cached for a minute on the other nodes; and a file that
keeps its size needs no new blocks, so a full job folder does not stop the beat.
Readers compare the content they see over time, on their own clock: the nodes' clocks
need not agree.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpclaunch.jobdir.layout import JobFolder

NAME = "supervisor.beat"
_WIDTH = 48  # "PID SEQUENCE BOUND", padded: every write covers the whole of the last one


def path(folder: JobFolder, requeue: int) -> Path:
    return folder.agents(requeue) / NAME


def encode(pid: int, sequence: int, bound_s: float) -> bytes:
    """One beat's content, always ``_WIDTH`` bytes. Pure."""
    return f"{pid} {sequence} {bound_s:g}".ljust(_WIDTH - 1).encode() + b"\n"


def bound_s(content: bytes) -> float | None:
    """The bound a beat's content names; None when it names none. Pure."""
    words = content.split()
    try:
        return float(words[2]) if len(words) == 3 else None
    except ValueError:
        return None


class Beat:
    """The supervisor's side: ``beat()`` rewrites the file with the next sequence
    number. Raises OSError (the caller decides what a missed beat is worth)."""

    def __init__(self, folder: JobFolder, requeue: int, bound_s: float) -> None:
        self.path = path(folder, requeue)
        self.bound_s = bound_s
        self.sequence = 0
        self._fd: int | None = None

    def beat(self) -> None:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        self.sequence += 1
        os.pwrite(self._fd, encode(os.getpid(), self.sequence, self.bound_s), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read(folder: JobFolder, requeue: int) -> bytes | None:
    """The beat's content now; None when there is no beat file (a supervisor without
    a job folder, or one of a version that does not beat). Raises OSError."""
    try:
        with open(path(folder, requeue), "rb") as beat:
            return beat.read()
    except FileNotFoundError:
        return None
