"""The limits on the user's strings that become paths, checked at submit.

A job name becomes part of the batch log's file name (``LOG_DIR/NAME-JOBID.out``), the
log folder holds the job folder (``LOG_DIR/JOBID/...``), the checkpoint folder holds the
checkpoints. A value past the filesystem's limits is accepted by SLURM (22.05 takes a
300-character job name), and the job then fails at launch with no log at all
(``JobState=FAILED Reason=JobLaunchFailure``): so they are refused here, before
anything is submitted. Pure: the paths are measured as strings, nothing is asked of
the filesystem.
"""

from __future__ import annotations

import os
from pathlib import PurePath

from hpclaunch.errors import SpecError

# Linux's limits (limits.h), which ext4, xfs, NFS, Lustre and GPFS all keep: one path
# component at most NAME_MAX bytes, a whole path passed to a system call under PATH_MAX.
NAME_MAX = 255
PATH_MAX = 4096
# SLURM job ids are 32-bit: the longest is 4294967295, ten digits.
LONGEST_JOB_ID = "4294967295"
# The batch log's name beside the job name: ``NAME-JOBID.out``.
BATCH_LOG_ROOM = len(f"-{LONGEST_JOB_ID}.out")
JOB_NAME_MAX = NAME_MAX - BATCH_LOG_ROOM
# Room kept for the paths hpclaunch makes inside the job folder and the checkpoint
# folder (``JOBID/failures/requeue-Q/attempt-A/node-HOST.json``, a host name up to 64
# bytes; ``step-000000000012/__0_0.distcp``): what a folder's own path may not use.
INSIDE_ROOM = 256


def _size(value: str) -> int:
    return len(os.fsencode(value))


def _shown(value: str) -> str:
    """``value`` quoted, cut to its first 40 characters when longer."""
    return repr(value) if len(value) <= 40 else f"{value[:40]!r}... ({len(value)} characters)"


def check_job_name(name: str, *, given: bool) -> None:
    """Refuse a job name too long for the batch log's file name; ``given``: the user
    gave it (else it is the script's or module's name, and the error names the script).
    Raises SpecError."""
    size = _size(name)
    if size <= JOB_NAME_MAX:
        return
    fix = (
        "give a shorter --job-name"
        if given
        else "give a --job-name of that length (it is the script's name otherwise)"
    )
    raise SpecError(
        "job_name" if given else "script",
        f"job name {_shown(name)} is {size} bytes long; the batch log is named "
        f"NAME-JOBID.out, and a file name may be at most {NAME_MAX} bytes, so a job name "
        f"may be at most {JOB_NAME_MAX}: {fix}",
    )


def check_components(field: str, path: str) -> None:
    """Refuse a folder ``path`` with a component longer than a file name may be.
    Raises SpecError naming ``field`` (the caller says where the value came from)."""
    for part in PurePath(path).parts:
        size = _size(part)
        if size > NAME_MAX:
            raise SpecError(
                field,
                f"{_shown(path)}: its part {_shown(part)} is {size} bytes long, and "
                f"a file or folder name may be at most {NAME_MAX} bytes: give a shorter name",
            )


def check_lengths(log_dir: str, checkpoint_dir: str | None, cwd: PurePath) -> None:
    """Refuse folders whose whole paths (relative ones taken from ``cwd``, the submit
    folder) leave no room under PATH_MAX for what hpclaunch writes into them (the
    batch log's name, at most NAME_MAX bytes, fits in that room). Raises SpecError
    naming the folder's field (the caller says where the value came from)."""
    folders = [("log_dir", log_dir)]
    if checkpoint_dir is not None:
        folders.append(("checkpoint_dir", checkpoint_dir))
    for field, value in folders:
        path = str(cwd / value)
        size = _size(path)
        if size + INSIDE_ROOM < PATH_MAX:
            continue
        raise SpecError(
            field,
            f"{_shown(value)} is {size} bytes long as a whole path ({_shown(path)}); "
            f"a path may be at most {PATH_MAX - 1} bytes, and hpclaunch needs "
            f"{INSIDE_ROOM} of them for the files it writes inside: give a folder with a "
            "shorter path",
        )
