"""Whether SLURM's signals to this job step reach the workers too: then the agent does
not send the workers a stop signal they got already (hpclaunch.node.recording_agent)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def in_slurm_step() -> bool:
    """Whether this process is a task of a SLURM job step (its parent is slurmstepd, and
    the step is not the batch script's): SLURM's signals to the step then reach every
    process of it, this one's children included."""
    step = os.environ.get("SLURM_STEP_ID", "")
    if not step or step in ("batch", "extern", "4294967294", "4294967291"):
        return False
    try:
        return Path(f"/proc/{os.getppid()}/comm").read_text().strip() == "slurmstepd"
    except OSError:
        return False


# The proctrack plugins that signal every process of a step (cgroup: the step's cgroup;
# linuxproc: the task's whole process tree). proctrack/pgid signals the task's process
# group only, which workers in sessions of their own are not in.
WHOLE_STEP_PROCTRACK = ("proctrack/cgroup", "proctrack/linuxproc")
_proctrack: list[str] = []


def slurm_signals_step() -> bool:
    """Whether a signal SLURM sends this step reaches every process of it, this one's
    children included: a task of a step (in_slurm_step) under a proctrack plugin that
    signals the whole step. Asks ``scontrol show config`` once; False when it cannot."""
    if not in_slurm_step():
        return False
    if not _proctrack:
        try:
            out = subprocess.run(
                ["scontrol", "show", "config"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        found = [
            line.split("=", 1)[1].strip()
            for line in out.splitlines()
            if line.split("=", 1)[0].strip() == "ProctrackType"
        ]
        _proctrack.append(found[0] if found else "")
    return _proctrack[0] in WHOLE_STEP_PROCTRACK
