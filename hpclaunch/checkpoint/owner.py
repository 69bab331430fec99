"""The checkpoint folder's marker: which job uses the folder (``.hpclaunch-owner.N.json``).

A job writes it when it starts using the folder, before its first step; a requeue
of the same job finds its own marker. Markers are numbered: the highest number names
the job that holds the folder, and a job takes the folder by creating the next
number, a name that only one creator gets (a hard link, or ``O_CREAT|O_EXCL`` where
the filesystem has no hard links; both work on NFS). No marker is ever renamed or
removed while it is the highest, so a job starting at any moment reads the holder;
the holder removes the lower numbers. No torch, no SLURM:
``hpclaunch.checkpoint.claim`` asks SLURM whether the named job still runs.

The file is a format other versions read: its keys are only ever added to.
"""

from __future__ import annotations

import enum
import errno
import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hpclaunch.errors import HpclaunchError
from hpclaunch.jobdir import modes
from hpclaunch.jobdir.atomic import fsync_folder, write_bytes_atomic

MARKERS = ".hpclaunch-owner.N.json"  # for messages (the files are numbered)
_NAME = re.compile(r"\.hpclaunch-owner\.([0-9]+)\.json")
# Filesystems without hard links (some FUSE and SMB mounts) say so with one of these.
_NO_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS)
# How often a marker that vanished (pruned) or is half-written (O_EXCL) is read again.
_READS = 20


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
    cluster: str | None = None  # SLURM's cluster name: clusters reuse job ids

    def same_job(self, other: Owner) -> bool:
        """Whether both name one job (a requeue of it, a restart). A job whose cluster
        is not known (an older marker) matches by id."""
        same = self.kind is other.kind and self.job_id == other.job_id
        clusters = {self.cluster, other.cluster} - {None}
        return same and len(clusters) <= 1 and (self.kind is Kind.SLURM or self.host == other.host)

    def describe(self) -> str:
        """``job 42 (train, user ana, submitted from login1)``, for messages."""
        parts = [p for p in (self.job_name, self.user and f"user {self.user}") if p]
        where = "submitted from" if self.kind is Kind.SLURM else "on"
        if self.host:
            parts.append(f"{where} {self.host}")
        if self.cluster:
            parts.append(f"cluster {self.cluster}")
        label = "job" if self.kind is Kind.SLURM else "local job"
        return f"{label} {self.job_id}" + (f" ({', '.join(parts)})" if parts else "")

    def to_json(self) -> str:
        data = {**asdict(self), "kind": self.kind.value}
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Owner:
        """Raises ValueError, KeyError or TypeError for a file of another shape."""
        data = json.loads(text)
        keys = ("job_name", "user", "host", "since", "pid_start", "cluster")
        known = {k: data.get(k) for k in keys}
        return cls(Kind(data["kind"]), str(data["job_id"]), **known)


def marker_path(folder: Path, number: int) -> Path:
    return folder / f".hpclaunch-owner.{number}.json"


def _numbers(folder: Path) -> list[int]:
    """The markers' numbers in ``folder``, lowest first. Raises OSError."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_NAME.fullmatch, names) if m)


def read(folder: Path) -> tuple[Owner | None, int]:
    """The marker of the job holding ``folder`` and its number; (None, 0) when there
    is none. Raises MarkerError for a file hpclaunch did not write."""
    for attempt in range(_READS):
        try:
            numbers = _numbers(folder)
            if not numbers:
                return None, 0
            path = marker_path(folder, numbers[-1])
            text = path.read_text()
        except FileNotFoundError:
            continue  # pruned since it was listed: a higher one is there now
        except OSError as exc:
            raise MarkerError(f"cannot read a marker in {folder}: {exc.strerror or exc}") from None
        try:
            return Owner.from_json(text), numbers[-1]
        except (ValueError, KeyError, TypeError) as exc:
            if attempt + 1 < _READS and not text.endswith("\n"):
                time.sleep(0.05)  # being written (O_EXCL, no hard links): read it again
                continue
            raise MarkerError(
                f"{path} is not a marker hpclaunch wrote ({type(exc).__name__}: {exc}); it "
                "says which job uses the folder. Remove it once you know no job uses the folder"
            ) from None
    raise MarkerError(f"the markers in {folder} changed {_READS} times while being read")


def create(folder: Path, owner: Owner) -> bool:
    """Write the first marker, naming ``owner``; False when another was there first.
    Raises OSError."""
    return take(folder, 0, owner)


def take(folder: Path, seen: int, owner: Owner) -> bool:
    """Take ``folder`` for ``owner`` from the holder whose marker was number ``seen``
    (0: none): False when the folder changed hands meanwhile. Never touches the
    holder's marker; the numbers below the new one are removed. Raises OSError."""
    number = seen + 1
    if not _place(folder, marker_path(folder, number), owner.to_json().encode()):
        return False
    if _numbers(folder)[-1] != number:  # a stale view: a later taker's marker is there
        marker_path(folder, number).unlink(missing_ok=True)
        return False
    for old in _numbers(folder):
        if old < number:
            marker_path(folder, old).unlink(missing_ok=True)
    fsync_folder(folder)
    return True


def _place(folder: Path, path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` if it does not exist; False when it does."""
    temp = folder / f".hpclaunch-owner.new-{os.getpid()}-{time.monotonic_ns()}"
    # The folder may be the user's own, and the umask anything: others must not be
    # able to overwrite the marker (and take the folder, or stop the job taking it).
    mode = modes.file_mode(os.environ)
    try:
        write_bytes_atomic(temp, data, mode=mode)
        os.link(temp, path)  # fails when the name exists: one creator wins
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
    finally:
        temp.unlink(missing_ok=True)
    try:  # no hard links here: O_EXCL, which readers may find half-written
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as file:
        os.fchmod(fd, mode)  # the umask may have taken the group's bits: set it whole
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    return True
