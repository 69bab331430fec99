"""Writing a file so that it appears complete or not at all: what checkpoints, the
job history and failure records need on a shared filesystem. No torch."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO


def write_atomic(
    path: Path,
    write: Callable[[IO[bytes]], object],
    *,
    replace: bool = False,
    mode: int | None = None,
) -> bool:
    """Write ``path`` through ``write(file)`` so that it appears complete or not at all:
    a temporary file in the same folder, fsync, rename, fsync of the folder. Unless
    ``replace``, returns False (and writes nothing) when ``path`` already exists.
    ``mode``: the file's mode, set before anything is written (else the umask's).
    Raises OSError, and whatever ``write`` raises (the temporary file is removed)."""
    if not replace and path.exists():
        return False
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(temp, "wb") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)
    return True


def write_bytes_atomic(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` by ``data`` atomically (see write_atomic; ``mode`` as there).
    Raises OSError."""
    write_atomic(path, lambda handle: handle.write(data), replace=True, mode=mode)


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable. Raises OSError."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_line(path: Path, line: str, mode: int = 0o644) -> None:
    """Append ``line`` (ending in a newline) in one write with O_APPEND, so that
    readers see whole lines and concurrent writers do not interleave. Raises OSError."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
