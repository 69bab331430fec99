"""The supervisor's heartbeat: a small file in the job folder that the supervisor
rewrites from its main wait loop while the step runs, so that the agents can tell a
supervisor that stopped answering (hpclaunch.recovery.watch). No torch.

    agents/requeue-Q/supervisor.beat    "PID SEQUENCE BOUND\\n", fixed width, rewritten in place

BOUND is the seconds after which the agents may take the beat for stopped (the job's
``--watch-timeout``): the supervisor says it, so the agents need no setting of their own.

It is rewritten in place (one pwrite at offset 0, never renamed), and each beat is
written through: opened, written, fsynced and closed. On NFS a write stays in the
writer's page cache until it is flushed (close and fsync flush it; writeback would
take up to half a minute), and close-to-open consistency makes every open() on
another node see the latest flushed content, while a file's mtime or a renamed file's
name can be cached for a minute there. So readers open the file afresh for each look
and compare its content (never its mtime) over time, on their own clock: the nodes'
clocks need not agree. A file that keeps its size needs no new blocks, so on most
filesystems a full job folder does not stop the beat (on a copy-on-write one, such as
ZFS or btrfs, it can: the agents then take the supervisor for silent).
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

    def beat(self) -> None:
        """One beat, flushed to the file's server before it returns: a kept-open,
        unflushed file would show the other nodes a still beat for as long as the page
        cache holds the write."""
        self.sequence += 1
        self.write(encode(os.getpid(), self.sequence, self.bound_s))

    def write(self, content: bytes) -> None:
        """Write ``content`` (one beat's, ``_WIDTH`` bytes) in place and flush it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            written = os.pwrite(fd, content, 0)
            if written != len(content):
                raise OSError(f"short write to {self.path}: {written} of {len(content)} bytes")
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Nothing is kept open between beats; kept for the callers' symmetry."""


def read(folder: JobFolder, requeue: int) -> bytes | None:
    """The beat's content now, from a fresh open (close-to-open: the latest flushed
    beat, not a cached one); None when there is no beat file (a supervisor without a
    job folder, or one of a version that does not beat). Raises OSError."""
    try:
        with open(path(folder, requeue), "rb") as beat:
            return beat.read()
    except FileNotFoundError:
        return None
