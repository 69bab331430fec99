"""This user's hpclaunch jobs: one JSON line per submission in
``$XDG_STATE_HOME/hpclaunch/jobs.jsonl`` (``~/.local/state/hpclaunch/jobs.jsonl``
by default), written by ``hpclaunch sbatch`` and read by ``hpclaunch list``,
``status``, ``logs`` and ``cancel`` to find a job's folder.

Each line is appended with one ``write`` on a file opened for appending, so
concurrent submissions on one machine do not interleave (NFS gives no such promise;
a damaged line is skipped when read). Lines with keys a later version added are
read all the same. Pure file handling: no SLURM, no torch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from hpclaunch.jobdir.atomic import append_line

REGISTRY_NAME = "jobs.jsonl"


@dataclass(frozen=True)
class Entry:
    """One submission."""

    job_id: int
    job_dir: str  # absolute
    name: str
    submitted: float  # seconds since the epoch
    cluster: str | None = None
    workdir: str = ""  # the folder it was submitted from

    @classmethod
    def from_json(cls, data: object) -> Entry:
        """An entry from one line's object; keys a later version added are ignored.
        Raises ValueError when a known key is missing or of the wrong type."""
        if not isinstance(data, dict):
            raise ValueError("not an object")
        known = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        entry = cls(**known)
        checks = (
            (entry.job_id, int),
            (entry.job_dir, str),
            (entry.name, str),
            (entry.submitted, (int, float)),
        )
        if any(isinstance(v, bool) or not isinstance(v, t) for v, t in checks):
            raise ValueError("a value of the wrong type")
        return entry


def path(env: Mapping[str, str]) -> Path:
    """Where the registry is for the environment ``env``."""
    state = env.get("XDG_STATE_HOME", "").strip()
    base = Path(state) if state else Path(env.get("HOME", "~"), ".local", "state").expanduser()
    return base / "hpclaunch" / REGISTRY_NAME


def add(env: Mapping[str, str], entry: Entry) -> Path:
    """Append ``entry``; returns the registry's path. Raises OSError."""
    target = path(env)
    target.parent.mkdir(parents=True, exist_ok=True)
    append_line(target, json.dumps(asdict(entry), sort_keys=True) + "\n", mode=0o600)
    return target


def entries(env: Mapping[str, str]) -> list[Entry]:
    """Every readable entry, oldest first; a damaged line is skipped, a missing file is
    an empty registry."""
    try:
        lines = path(env).read_text(errors="replace").splitlines()
    except OSError:  # none yet, or unreadable: no jobs to show from it
        return []
    found = []
    for line in lines:
        try:
            found.append(Entry.from_json(json.loads(line)))
        except (ValueError, TypeError):
            continue
    return found


def find(env: Mapping[str, str], job_id: int) -> Entry | None:
    """The latest entry of ``job_id`` (ids come round again on a long-lived cluster)."""
    matches = [entry for entry in entries(env) if entry.job_id == job_id]
    return matches[-1] if matches else None


def note(
    env: Mapping[str, str],
    job_id: int,
    job_dir: Path,
    name: str,
    workdir: Path,
    cluster: str | None = None,
) -> str | None:
    """Add a submitted job to the list, now; None when it was added, else what went
    wrong as a sentence for the caller's warning (the job is submitted either way)."""
    entry = Entry(job_id, str(job_dir.absolute()), name, time.time(), cluster, str(workdir))
    try:
        add(env, entry)
    except OSError as exc:
        return (
            f"job {job_id} was submitted, but could not be added to "
            f"{path(env)} ({exc.strerror or exc})"
        )
    return None
