"""Where an ``hpclaunch.Executor`` job's own files are in its folder. Pure paths,
shared by the job handles (login node) and the worker ranks, so neither imports
the other."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

INFO_SUFFIX = "_hpclaunch.json"
# The parts of a run that are the same on every node: SLURM's requeue count, the
# job step, and the rendezvous round (HPCLAUNCH_ATTEMPT, job-wide, unlike torch's
# per-agent TORCHELASTIC_RESTART_COUNT).
_RUN_VARS = ("HPCLAUNCH_REQUEUE_COUNT", "SLURM_STEP_ID", "HPCLAUNCH_ATTEMPT")


def info_path(folder: Path, job_id: str) -> Path:
    """Where rank 0 notes which SLURM job (and job folder) ran submitit's ``job_id``:
    an array task's submitit id (``123_4``) is not its SLURM job id."""
    return folder / f"{job_id}{INFO_SUFFIX}"


def finished_root(folder: Path, job_id: str) -> Path:
    return folder / f".{job_id}_finished"


def finished_dir(folder: Path, job_id: str, environ: Mapping[str, str]) -> Path:
    """Where the ranks of one run of the worker group note that their call returned:
    the same folder on every node, a new one for every restart of the group."""
    run = "-".join(environ.get(name) or "0" for name in _RUN_VARS)
    return finished_root(folder, job_id) / run
