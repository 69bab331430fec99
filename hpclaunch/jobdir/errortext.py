"""What a worker's one-line error message says, read the same way everywhere it is
read: ``normalise`` for comparing two messages (what differs from run to run is
masked), ``storage_fault`` for a filesystem that refused a shared folder,
``timed_out`` for a collective that waited in vain. Pure: strings in, strings out.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

# Masks for what varies from run to run, applied in this order (a later pattern must
# not see the digits an earlier one removed; no placeholder holds a digit).
_VARYING: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), placeholder)
    for pattern, placeholder in (
        # dates and times: 2026-11-24T17:25:49.5+01:00, 2026-11-24_17:25:49, 17:25:49.509
        (
            r"\d{4}-\d{2}-\d{2}(?:[T _]\d{1,2}:\d{2}(?::\d{2})?(?:[.,]\d+)?)?"
            r"(?:Z|[+-]\d{2}:?\d{2}\b)?",
            "<time>",
        ),
        (r"(?<![\w:.])\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?(?![\w:])", "<time>"),
        # UUIDs (torch's run ids, in temporary names), with - or _
        (
            r"(?i)\b[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}\b",
            "<id>",
        ),
        # IPv6, bracketed or bare (needs a '::' or all eight groups), maybe with a port
        (r"\[[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\](?::\d+)?", "<addr>"),
        (
            r"(?<![\w:.])(?=[0-9A-Fa-f:]*::|(?:[0-9A-Fa-f]{1,4}:){7})[0-9A-Fa-f:]{2,39}"
            r"(?:\.\d{1,3}){0,4}(?![\w:])",
            "<addr>",
        ),
        # IPv4, maybe with a port
        (r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?(?![\w.])", "<addr>"),
        # host:port (a name, a colon, a port number)
        (r"(?<![\w.-])[A-Za-z][\w.-]*:\d{2,5}\b", "<addr>"),
        # pointers and other hex: 0x7f3a..., digests and ids of 8 or more hex digits
        (r"(?i)\b0x[0-9a-f]+\b", "<hex>"),
        (r"(?i)\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b", "<hex>"),
        # pids and ports, by the word before them: (pid 3301), pid=3301, port 29500
        (r"(?i)\b(pid|port)([\s=:#]*)\d+\b", r"\1\2<n>"),
        # durations with their unit: 30000ms, 30 s, ran for 600005 milliseconds,
        # NCCL's Timeout(ms)=600000
        (r"(?<![\w.])\d+(?:\.\d+)? ?(?:[mun]?s|milliseconds?|seconds?)\b", "<n>"),
        (r"(?i)\bTimeout\(ms\)=\d+", "Timeout(ms)=<n>"),
        # Any other number is kept: GPU 3 and GPU 5, rank 2 and rank 3 are not the
        # same error (an error that follows its rank must look like one).
    )
)
_SPACE = re.compile(r"\s+")


def normalise(message: str) -> str:
    """``message`` with what differs between runs of the same error masked: pids,
    ports, addresses (IPv4, IPv6, host:port), pointers and other hex ids, UUIDs,
    dates and times, durations. Other numbers stay (a device's, a rank's, a step's
    number tells errors apart). Two messages are the same error when their normal
    forms are equal."""
    text = message
    for pattern, placeholder in _VARYING:
        text = pattern.sub(placeholder, text)
    return _SPACE.sub(" ", text).strip()


def same_error(message: str, others: Iterable[str]) -> bool:
    """Whether ``message`` is one of ``others``, compared as ``normalise`` says."""
    mine = normalise(message)
    return any(normalise(other) == mine for other in others)


class StorageErrno(enum.Enum):
    """The errors of a filesystem that refuses to take a job's files, by the words
    ``strerror`` gives them on Linux (what Python's OSError and the C libraries print)."""

    ENOSPC = "No space left on device"
    EDQUOT = "Disk quota exceeded"
    EROFS = "Read-only file system"
    EACCES = "Permission denied"
    # Not an errno: the supervisor's test write got no answer at all (a hung mount).
    HUNG = "did not answer a test write"

    @property
    def is_errno(self) -> bool:
        return self is not StorageErrno.HUNG

    @property
    def fix(self) -> str:
        """What a user does about it, for a folder named after this text."""
        return {
            StorageErrno.ENOSPC: "free space on its filesystem",
            StorageErrno.EDQUOT: "free space or ask for a larger quota on its filesystem "
            "(`quota`, or `lfs quota` on Lustre, says how much is used)",
            StorageErrno.EROFS: "its filesystem is mounted read-only: ask your cluster's "
            "administrators to make it writable",
            StorageErrno.EACCES: "make it writable for the job's user (`ls -ld` shows who owns it)",
            StorageErrno.HUNG: "its filesystem hangs (a lost mount or file server): ask your "
            "cluster's administrators",
        }[self]


_STORAGE = re.compile(
    "|".join(re.escape(e.value) for e in StorageErrno if e.is_errno), re.IGNORECASE
)
_BY_TEXT = {e.value.lower(): e for e in StorageErrno if e.is_errno}


def storage_errno(message: str) -> StorageErrno | None:
    """The first storage error ``message`` names, if any."""
    found = _STORAGE.search(message)
    return _BY_TEXT[found.group(0).lower()] if found else None


@dataclass(frozen=True)
class SharedFolder:
    """A folder every node of the job writes to, on a shared filesystem."""

    role: str  # "checkpoint folder", "job folder"
    path: str
    option: str  # the sbatch option that chooses it

    def named_in(self, message: str) -> bool:
        """Whether ``message`` names this folder or a path inside it (as given, or
        with symbolic links resolved); a path that merely ends like it
        (/home/u/scratch/ckpt for /scratch/ckpt) is another folder."""
        forms = {os.path.normpath(self.path), os.path.realpath(self.path)}
        return any(
            re.search(
                r"(?<![\w./-])" + re.escape(form.rstrip("/")) + r"(?![^/\s'\"),;:\]])", message
            )
            for form in forms
            if form.rstrip("/")
        )


@dataclass(frozen=True)
class StorageFault:
    folder: SharedFolder
    errno: StorageErrno


def storage_fault(message: str, folders: Iterable[SharedFolder]) -> StorageFault | None:
    """The shared folder ``message`` says a filesystem refused, and how; None when it
    names no storage error, or no path in these folders (a node's own disk, /tmp or
    /dev/shm full, is that node's problem)."""
    errno = storage_errno(message)
    if errno is None:
        return None
    named = next((folder for folder in folders if folder.named_in(message)), None)
    return StorageFault(named, errno) if named is not None else None


# A collective, or the store, that waited for a peer until its timeout: gloo, NCCL's
# watchdog, the c10d store, torch's monitored barrier.
_TIMED_OUT = re.compile(
    r"Timed out waiting \d+ ?ms for (?:send|recv)|Watchdog caught collective operation timeout"
    r"|wait timeout after \d+ ?ms|failed to pass monitoredBarrier|timed out after \d+ ?ms"
    r"|Timed out waiting \d+ ?ms",
    re.IGNORECASE,
)


def timed_out(message: str) -> bool:
    """Whether ``message`` is a collective's (or the store's) timeout: the rank waited
    for a peer that never answered, the mark of a hang elsewhere."""
    return bool(_TIMED_OUT.search(message))


# Errors of frameworks that a launch like hpclaunch's (or torchrun's) causes, with what
# the user sets to mend them: (what the traceback says, the fix).
_KNOWN_FIXES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        # Lightning's default Trainer() counts one device on one node.
        re.compile(r"You set `devices=\d+` and `num_nodes=\d+` in Lightning, but the product"),
        "Lightning's Trainer must be told the job's size: Trainer(**hpclaunch.frameworks."
        "lightning.trainer_args(), ...), or devices=<workers per node>, num_nodes=<nodes> "
        "(docs/bring-your-script.md, From Lightning)",
    ),
    (
        # submitit's TorchDistributedEnvironment().export() refuses what torch's launch set.
        re.compile(r"Cannot export environment variables as \w+ is already set"),
        "the agent sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK already: "
        "leave submitit's TorchDistributedEnvironment().export() out; "
        "init_process_group() works as is (docs/bring-your-script.md, From submitit)",
    ),
)


def known_fix(traceback: str) -> str | None:
    """What to change for a framework error that comes from how the job is launched."""
    for pattern, fix in _KNOWN_FIXES:
        if pattern.search(traceback):
            return fix
    return None
