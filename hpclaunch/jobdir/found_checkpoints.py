"""Checkpoints a job writes its own way, found by glob for ``hpclaunch status``.

hpclaunch's own checkpoints are ``step-N`` entries of the checkpoint folder
(hpclaunch.jobdir.checkpoint_folder). A job that saves its own way (``torch.save`` to
``snapshot.pt`` as PyTorch's DDP example does, Lightning's ``last.ckpt``) declares
globs with ``hpclaunch sbatch --checkpoint-pattern``; the supervisor records them in
history.json, made absolute against the submit folder. The newest match by
modification time is the job's latest checkpoint of its own; names of saves in progress
(``*.tmp``, ``.name``) never count. Plain paths, no torch.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_WILDCARD = re.compile(r"[*?[]")
IN_PROGRESS_SUFFIX = ".tmp"
# Whether a folder can be listed, asked without listing it (the search lists each folder
# once); tests give one that refuses, since root may list anything.
Listable = Callable[[str], bool]


def listable(folder: str) -> bool:
    return os.access(folder, os.R_OK | os.X_OK)


@dataclass(frozen=True)
class Found:
    """One checkpoint found by glob, and when it was last written (its mtime)."""

    path: Path
    written: float


@dataclass(frozen=True)
class Search:
    """Every match of the patterns, oldest first, and what could not be read."""

    found: tuple[Found, ...] = ()
    notes: tuple[str, ...] = ()

    def newest(self, since: float | None = None) -> Found | None:
        """The newest match (the greater path on a tie); with ``since``, of those written
        at or after it (older files are not the job's)."""
        kept = [f for f in self.found if since is None or f.written >= since]
        return kept[-1] if kept else None


def absolute(patterns: Iterable[str], base: str | os.PathLike[str]) -> list[str]:
    """``patterns`` with each relative one taken from ``base`` (the submit folder), whose
    own glob characters are escaped so that they match only themselves."""
    prefix = glob.escape(os.fspath(base))
    return [p if os.path.isabs(p) else os.path.join(prefix, p) for p in patterns]


def counts(path: str) -> bool:
    """Whether a match is a checkpoint: not a save in progress (``*.tmp``) nor a
    hidden name (``.name``: how savers write before they rename)."""
    name = os.path.basename(path.rstrip(os.sep))
    return not name.startswith(".") and not name.endswith(IN_PROGRESS_SUFFIX)


def search(patterns: Sequence[str], can_list: Listable = listable) -> Search:
    """Every file or folder that matches any of ``patterns`` (absolute globs, ``**`` for
    any folders), by modification time. A folder that a pattern starts from but cannot be
    read gives a note; the folders below it that cannot be read are passed over, as glob
    does. Never raises OSError."""
    found: dict[str, Found] = {}
    notes: list[str] = []
    for pattern in patterns:
        blocked = unreadable_base(pattern, can_list)
        if blocked is not None:
            notes.append(
                f"checkpoint folder {blocked} (of {pattern}) cannot be read: Permission denied"
            )
            continue
        for match in glob.iglob(pattern, recursive=True):
            if not counts(match) or match in found:
                continue
            try:
                written = os.stat(match).st_mtime
            except OSError:  # removed since (a saver keeping the last few), or a broken link
                continue
            found[match] = Found(Path(match), written)
    ordered = sorted(found.values(), key=lambda f: (f.written, str(f.path)))
    return Search(tuple(ordered), tuple(notes))


def has_wildcard(pattern: str) -> bool:
    """Whether ``pattern`` is a glob (``*``, ``?`` or ``[``) rather than one path."""
    return _WILDCARD.search(pattern) is not None


def base_folder(pattern: str) -> str:
    """The folder ``pattern`` starts from: its leading parts without a wildcard (for a
    pattern without one, the folder it names a file in)."""
    parts = pattern.split(os.sep)
    fixed: list[str] = []
    for part in parts[:-1]:
        if has_wildcard(part):
            break
        fixed.append(part)
    return os.sep.join(fixed) or (os.sep if pattern.startswith(os.sep) else os.curdir)


def unreadable_base(pattern: str, can_list: Listable = listable) -> str | None:
    """The folder ``pattern`` starts from when it exists but cannot be listed; else None
    (a folder not made yet is no problem: the job has not saved yet)."""
    folder = base_folder(pattern)
    return folder if os.path.isdir(folder) and not can_list(folder) else None


def submit_dir(env: Mapping[str, str]) -> str:
    """The folder the job was submitted from, which relative patterns start from (as
    the rendered script takes --checkpoint-dir); this process's folder outside SLURM."""
    return env.get("SLURM_SUBMIT_DIR") or os.getcwd()
