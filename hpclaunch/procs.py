"""Processes by PID: identity, trees and namespaces, read from /proc.

A PID alone can be reused, so a tracked process is a (pid, start time) pair.
Zombies count as dead: this sandbox's parent may reap them late.

On the ground floor with ``hpclaunch.errors``: it imports nothing of hpclaunch, and
the agent (its workers' trees), the sandbox (its daemons) and the checkpoint folder's
owner check (is a local job's process still the one that took the folder) all use it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name sits in parentheses and may contain spaces.
    return text[text.rindex(")") + 2 :].split()


@dataclass(frozen=True)
class Tracked:
    """A process this sandbox started."""

    pid: int
    start_time: int  # clock ticks after boot, from /proc/PID/stat

    @classmethod
    def of(cls, pid: int) -> Tracked:
        fields = _stat_fields(pid)
        if fields is None:
            raise ProcessLookupError(pid)
        return cls(pid, int(fields[19]))

    def alive(self) -> bool:
        """Running (not a zombie) and still the process that was started."""
        fields = _stat_fields(self.pid)
        return fields is not None and fields[0] != "Z" and int(fields[19]) == self.start_time


@dataclass(frozen=True)
class Proc:
    """One process as /proc/PID/stat gives it: its place in the tree and its session."""

    pid: int
    ppid: int
    session: int
    state: str  # one letter: R, S, D, Z (zombie), T (stopped), ...
    start_time: int  # clock ticks after boot

    @property
    def zombie(self) -> bool:
        return self.state == "Z"


def proc(pid: int) -> Proc | None:
    """The process ``pid`` (a zombie too), or None once it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return Proc(pid, int(fields[1]), int(fields[3]), fields[0], int(fields[19]))


def snapshot() -> list[Proc]:
    """Every process this one can see, zombies included."""
    found = (proc(int(entry.name)) for entry in PROC.iterdir() if entry.name.isdigit())
    return [p for p in found if p is not None]


def children(pid: int) -> list[Proc]:
    """The children of ``pid`` (zombies too): from the kernel's list of each of its
    threads where it keeps one (CONFIG_PROC_CHILDREN), else from every process."""
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
        listed = [(task / "children").read_text().split() for task in tasks]
    except FileNotFoundError:
        return [p for p in snapshot() if p.ppid == pid]
    except ProcessLookupError:
        return []
    found = (proc(int(child)) for pids in listed for child in pids)
    return [p for p in found if p is not None and p.ppid == pid]


def command_line(pid: int) -> str:
    """What the process runs, as ps shows it ("" once it is gone); its name in brackets
    where it has no command line (a kernel thread, a zombie)."""
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        name = (PROC / str(pid) / "comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""
    text = " ".join(a.decode(errors="replace") for a in argv if a)
    return text or f"[{name}]"


def parents() -> dict[int, int]:
    """pid → parent pid of every live process."""
    out = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[0] != "Z":
                out[int(entry.name)] = int(fields[1])
    return out


def group_alive(pgid: int) -> bool:
    """Whether a live process (zombies count as dead) is in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[0] != "Z" and fields[2] == str(pgid):
                return True
    return False


def descendants(pid: int, table: dict[int, int] | None = None) -> list[int]:
    """Every live descendant of ``pid``, children before grandchildren."""
    table = parents() if table is None else table
    children: dict[int, list[int]] = {}
    for child, parent in table.items():
        children.setdefault(parent, []).append(child)
    out, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            out.append(child)
            queue.append(child)
    return out


def with_environ(entry: bytes, table: dict[int, int] | None = None) -> list[int]:
    """Live processes whose environment holds ``entry`` (``KEY=VALUE``) exactly."""
    out = []
    for pid in parents() if table is None else table:
        try:
            if entry in (PROC / str(pid) / "environ").read_bytes().split(b"\0"):
                out.append(pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return out


def in_netns(netns_path: Path) -> list[int]:
    """Live processes whose network namespace is the one at ``netns_path``."""
    try:
        inode = netns_path.stat().st_ino
    except FileNotFoundError:
        return []
    out = []
    for pid in parents():
        try:
            if os.stat(PROC / str(pid) / "ns" / "net").st_ino == inode:
                out.append(pid)
        except (FileNotFoundError, PermissionError):
            continue
    return out


def kill(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """``sig`` to the process group ``pid`` leads (a worker: torch starts each in a
    session of its own), else to ``pid`` alone; nothing when it is gone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def state(pid: int) -> str:
    """The state letter /proc gives ``pid`` (R, S, D, T: stopped, t, Z); "" when gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else ""


def wait_gone(pids: Iterable[int], timeout_s: float) -> list[int]:
    """Wait until none of ``pids`` is alive (zombies count as gone); return the survivors."""
    tracked = [t for t in (_tracked_or_none(p) for p in pids) if t is not None]
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [t.pid for t in tracked if t.alive()]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


def _tracked_or_none(pid: int) -> Tracked | None:
    try:
        return Tracked.of(pid)
    except ProcessLookupError:
        return None
