"""Write a rendered script into the job's folder and submit it.

Nothing is left half-done: if sbatch refuses the script, the staged file and
any folder created for it are removed again.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from hpclaunch.contract.worker_env import SUBMITTED as SUBMITTED_VAR
from hpclaunch.errors import HpclaunchError
from hpclaunch.jobdir import modes
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.slurm.commands import Slurm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submission:
    """A submitted job and where its script was kept."""

    job_id: int
    cluster: str | None
    job_dir: Path
    script_path: Path


def stamped(slurm: Slurm, now_ns: int) -> Slurm:
    """``slurm`` whose commands carry the submission's stamp ``now_ns`` in their
    environment: SLURM gives the job the environment it was submitted from, and each
    node's agent keys its node-local folder with it (hpclaunch.node.local_folder)."""
    base = os.environ if slurm.env is None else slurm.env
    return replace(slurm, env={**base, SUBMITTED_VAR: str(now_ns)})


def submit(
    script: str, log_dir: Path, slurm: Slurm, *, cwd: Path, folder_mode: int = 0o700
) -> Submission:
    """Submit ``script`` from ``cwd`` (the job's working folder); keep it as
    ``LOG_DIR/JOBID/job.sbatch``.

    The log folder must exist before the job starts (SLURM does not create the
    folder of ``--output``), so it is created here; the folders created, and the job
    folder, get ``folder_mode`` (hpclaunch.jobdir.modes). Raises SlurmError or
    SlurmNotFound, after removing what it created.
    """
    try:
        created = modes.make_dirs(log_dir, folder_mode)
        fd, staged_name = tempfile.mkstemp(prefix=".submit-", suffix=".sbatch", dir=log_dir)
    except OSError as exc:
        raise HpclaunchError(
            f"cannot write into the log folder {str(log_dir)!r} (from --log-dir or a profile): "
            f"{exc.strerror}; choose a folder you can write to"
        ) from None
    staged = Path(staged_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(script)
        os.chmod(staged, 0o644)
        job = stamped(slurm, time.time_ns()).sbatch(staged, cwd=cwd)
    except BaseException:
        staged.unlink(missing_ok=True)
        for folder in reversed(created):
            try:
                folder.rmdir()
            except OSError:
                break  # something else was put there meanwhile: keep it
        raise
    kept = JobFolder.of(log_dir, job.job_id)
    modes.make_dirs(kept.root, folder_mode)
    modes.restrict(kept.root, folder_mode)  # the job itself may have created it already
    os.replace(staged, kept.script)
    log.info("job %s: submitted, script kept at %s", job.job_id, kept.script)
    return Submission(job.job_id, job.cluster, kept.root, kept.script)
