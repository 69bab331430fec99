"""``hpclaunch cancel``: end a job for good. The cancel note goes into the job folder
first, so that the supervisor, woken by the signal scancel sends, does not requeue the
job whatever signal it got first; then scancel. No click, no torch."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.errors import HpclaunchError, SlurmError
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.ops.status import JobStatus, find
from hpclaunch.slurm.commands import Slurm


@dataclass(frozen=True)
class Cancelled:
    """A job cancelled: its status before, and whether its supervisor got the note."""

    was: JobStatus
    noted: bool  # False: the folder is unknown, a requeue under way may still happen


def cancel(
    job_id: int,
    slurm: Slurm,
    env: Mapping[str, str],
    job_dir: Path | None = None,
    now: Callable[[], float] = time.time,
) -> Cancelled:
    """Leave the cancel note, then ``scancel``. Raises JobNotFound; HpclaunchError when
    the job already ended or the note cannot be written (nothing is cancelled then);
    SlurmError when scancel refuses (the note is taken back)."""
    found = find(job_id, slurm, env, job_dir)
    if found.ended:
        raise HpclaunchError(f"job {job_id} already ended ({found.state}); nothing to cancel")
    marker = JobFolder(Path(found.job_dir)).cancelled if found.job_dir else None
    if marker is not None:
        try:
            marker.write_text(f"{now()}\n")
        except OSError as exc:
            raise HpclaunchError(
                f"cannot leave the cancel note {marker} for job {job_id}'s supervisor: "
                f"{exc.strerror or exc}; nothing was cancelled (is it your job? "
                "`scancel` cancels without the note, but a time-limit warning that came "
                "first may then still requeue it)"
            ) from None
    try:
        slurm.cancel(job_id)
    except SlurmError:
        if marker is not None:
            marker.unlink(missing_ok=True)  # nothing half-done
        raise
    return Cancelled(found, marker is not None)
