"""The rendezvous port already taken on the first node: said as such, with who holds
it and the fix, rather than torch's "The connection to the C10d store has failed"
or a traceback. No torch: reads the exception's text and /proc.
"""

from __future__ import annotations

import os
from pathlib import Path

# What torch's TCPStore server says when bind() fails (the text of its errno).
_IN_USE = ("EADDRINUSE", "address already in use")
# /proc/net/tcp's state column: 0A is LISTEN.
_LISTEN = "0A"


def in_use(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, says the port is taken."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = f"{type(current).__name__}: {current}".lower()
        if any(needle.lower() in text for needle in _IN_USE):
            return True
        current = current.__cause__ or current.__context__
    return False


def listeners(port: int, proc: Path = Path("/proc")) -> list[str]:
    """``pid N (command)`` of each process on this machine (in this network namespace)
    that listens on TCP ``port``; empty when none can be seen (another user's process
    without the right to read its file descriptors)."""
    inodes = {
        fields[9]
        for table in ("tcp", "tcp6")
        for fields in _rows(proc / "net" / table)
        if fields[3] == _LISTEN and int(fields[1].rpartition(":")[2], 16) == port
    }
    if not inodes:
        return []
    found = []
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            links = {_link(fd) for fd in (pid_dir / "fd").iterdir()}
            raw = (pid_dir / "cmdline").read_bytes()
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            command = " ".join(raw.replace(b"\0", b" ").decode(errors="replace").split())
            found.append(f"pid {pid_dir.name} ({command[:80]})")
    return found


def _link(fd: Path) -> str:
    """Where one file descriptor points; "" for one closed since it was listed."""
    try:
        return os.readlink(fd)
    except OSError:
        return ""


def _rows(table: Path) -> list[list[str]]:
    try:
        lines = table.read_text().splitlines()[1:]
    except OSError:
        return []
    return [fields for line in lines if len(fields := line.split()) > 9]


def taken(port: int, host: str, holders: list[str]) -> str:
    """The agent's one line for a rendezvous port that is already in use."""
    who = f" by {', '.join(holders)}" if holders else " by another process"
    return (
        f"the rendezvous port {port} on {host} (the first node) is already in use{who}; "
        "give the job another port: hpclaunch sbatch --master-port PORT (or master_port "
        "in a profile or as an Executor parameter), one below 32768 that nothing else "
        "on the node uses"
    )
