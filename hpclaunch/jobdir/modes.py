"""Who may read what hpclaunch writes: the job folder and the checkpoints are the
owner's (and the group's, when the job asks), never everyone's, whatever the umask.

The folders are the barrier: every folder hpclaunch creates for a job (the job
folder ``LOG_DIR/JOBID``, a checkpoint folder and the folders above it that did not
exist, each checkpoint's temporary and committed folder) gets mode 0700 (0750 with
group sharing), set explicitly since the umask can only take bits away. What the
workers and torch write inside (log files, DCP's files) keeps the umask's mode but
cannot be reached by others through a 0700 folder. A checkpoint saved as one file, and
the batch log (SLURM makes it beside the job folder), are set 0600 (0640) as well, since
their folder may be the user's own. Folders the user made are never changed.

Group sharing: ``HPCLAUNCH_SHARE_WITH_GROUP=1`` in the job's environment (set it
before ``hpclaunch sbatch``, whose environment SLURM passes on to the job; ``--env``
takes no HPCLAUNCH_ variable).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hpclaunch.errors import HpclaunchError

SHARE_VAR = "HPCLAUNCH_SHARE_WITH_GROUP"
_YES, _NO = ("1", "yes", "true"), ("", "0", "no", "false")


def shared_with_group(env: Mapping[str, str]) -> bool:
    """Whether the job asks for group-readable folders. Raises HpclaunchError on a
    value that is neither yes nor no."""
    value = env.get(SHARE_VAR, "").strip().lower()
    if value in _YES:
        return True
    if value in _NO:
        return False
    raise HpclaunchError(
        f"{SHARE_VAR}={env[SHARE_VAR]!r} (from the environment) is neither yes nor no; "
        f"set {SHARE_VAR}=1 to let the job's group read its folders, or unset it"
    )


def folder_mode(env: Mapping[str, str]) -> int:
    return 0o750 if shared_with_group(env) else 0o700


def file_mode(env: Mapping[str, str]) -> int:
    return 0o640 if shared_with_group(env) else 0o600


def make_dirs(path: Path, mode: int) -> list[Path]:
    """mkdir -p ``path``, each folder it creates set to ``mode`` (outermost first, so
    nothing appears reachable, not even for a moment); return those folders. Folders
    that existed are left as they are. Raises OSError."""
    missing = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = probe.parent
    made = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode & 0o700)  # the group's bits once the mode is set
        except FileExistsError:  # made by another process (another rank) meanwhile
            continue
        os.chmod(folder, mode)
        made.append(folder)
    return made


def restrict(path: Path, mode: int) -> None:
    """Set ``path`` (made for the job: its job folder, its batch log) to ``mode``, if
    it is this user's. Raises OSError."""
    if path.stat().st_uid == os.getuid():
        os.chmod(path, mode)
