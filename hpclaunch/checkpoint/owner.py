"""The checkpoint folder's marker: which job uses the folder (``.hpclaunch-owner.json``).

A job writes it when it starts using the folder, before its first step; a requeue
of the same job finds its own marker. The marker is created so that two jobs
starting at the same moment cannot both believe they made it (a link, which fails
when the name exists), and replaced, when the job it names has ended, by a rename
that only one taker wins. No torch, no SLURM: ``hpclaunch.checkpoint.claim`` asks
SLURM whether the named job still runs.

The file is a format other versions read: its keys are only ever added to.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hpclaunch.errors import HpclaunchError
from hpclaunch.jobdir.atomic import fsync_folder, write_bytes_atomic

MARKER = ".hpclaunch-owner.json"


class Kind(enum.Enum):
    SLURM = "slurm"  # a SLURM job: SLURM says whether it is active
    LOCAL = "local"  # hpclaunch.Executor(cluster="local"): its controller's process


class MarkerError(HpclaunchError):
    """The marker cannot be read or written; the message names it and the fix."""


@dataclass(frozen=True)
class Owner:
    """The job a marker names. For a local job ``job_id`` is the pid of submitit's
    controller on ``host``, and ``pid_start`` its start time (against pid reuse)."""

    kind: Kind
    job_id: str
    job_name: str | None = None
    user: str | None = None
    host: str | None = None  # the submit host (SLURM), the machine (local)
    since: float | None = None  # when it took the folder
    pid_start: str | None = None

    def same_job(self, other: Owner) -> bool:
        """Whether both name one job (a requeue of it, a restart)."""
        same = self.kind is other.kind and self.job_id == other.job_id
        return same and (self.kind is Kind.SLURM or self.host == other.host)

    def describe(self) -> str:
        """``job 42 (train, user ana, submitted from login1)``, for messages."""
        parts = [p for p in (self.job_name, self.user and f"user {self.user}") if p]
        where = "submitted from" if self.kind is Kind.SLURM else "on"
        if self.host:
            parts.append(f"{where} {self.host}")
        label = "job" if self.kind is Kind.SLURM else "local job"
        return f"{label} {self.job_id}" + (f" ({', '.join(parts)})" if parts else "")

    def to_json(self) -> str:
        data = {**asdict(self), "kind": self.kind.value}
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Owner:
        """Raises ValueError, KeyError or TypeError for a file of another shape."""
        data = json.loads(text)
        known = {k: data.get(k) for k in ("job_name", "user", "host", "since", "pid_start")}
        return cls(Kind(data["kind"]), str(data["job_id"]), **known)


def marker_path(folder: Path) -> Path:
    return folder / MARKER


def read(folder: Path) -> tuple[Owner | None, str | None]:
    """The marker in ``folder`` and its text; (None, None) when there is none.
    Raises MarkerError for a file hpclaunch did not write."""
    path = marker_path(folder)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        raise MarkerError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return Owner.from_json(text), text
    except (ValueError, KeyError, TypeError) as exc:
        raise MarkerError(
            f"{path} is not a marker hpclaunch wrote ({type(exc).__name__}: {exc}); it says "
            "which job uses the folder. Remove it once you know no job uses the folder"
        ) from None


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in /proc (clock ticks since boot), or None
    where there is no /proc or no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def process_alive(pid: int, start: str | None) -> bool:
    """Whether process ``pid`` runs on this machine and is the one that started at
    ``start`` (when known: a pid can be reused). Zombies count as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's: it exists
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: kill(0) is all there is
    return state != "Z" and (start is None or process_start(pid) == start)


def create(folder: Path, owner: Owner) -> bool:
    """Write the marker naming ``owner`` if there is none; False when another was
    there first. Raises OSError."""
    path = marker_path(folder)
    temp = path.with_name(f".{MARKER}.new-{os.getpid()}-{time.monotonic_ns()}")
    try:
        write_bytes_atomic(temp, owner.to_json().encode())
        os.link(temp, path)  # fails when the name exists: one creator wins
    except FileExistsError:
        return False
    finally:
        temp.unlink(missing_ok=True)
    fsync_folder(folder)
    return True


def replace(folder: Path, seen: str, owner: Owner) -> bool:
    """Replace the marker whose text was ``seen`` by one naming ``owner``; False when
    it changed meanwhile (another job took the folder first). Raises OSError."""
    path = marker_path(folder)
    aside = path.with_name(f".{MARKER}.old-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(path, aside)  # one of several takers gets it
    except FileNotFoundError:
        return create(folder, owner)
    try:
        if aside.read_text() != seen:  # another job's, written since it was read: give it back
            with contextlib.suppress(FileExistsError):
                os.link(aside, path)
            return False
    finally:
        aside.unlink(missing_ok=True)
    return create(folder, owner)
