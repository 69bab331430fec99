"""Checkpoints a job writes its own way, found by glob for ``hpclaunch status``.

hpclaunch's own checkpoints are ``step-N`` entries of the checkpoint folder
(``hpclaunch.checkpoint.complete``). A job that saves its own way (``torch.save`` to
``snapshot.pt`` as PyTorch's DDP example does, Lightning's ``last.ckpt``) declares
globs with ``hpclaunch sbatch --checkpoint-pattern``; the supervisor records them in
history.json, made absolute against the submit folder. Besides those, the Lightning
callback's folder ``CHECKPOINT_DIR/lightning/step-*.ckpt`` is always looked at. The
newest match by modification time is the job's latest checkpoint of its own; names
of saves in progress (``*.tmp``, ``.name``) never count. Plain paths, no torch.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.checkpoint import store
from hpclaunch.job.values import has_wildcard

# Where the Lightning callback commits its checkpoints (by rename), under the job's
# checkpoint folder.
LIGHTNING = os.path.join(store.LIGHTNING_FOLDER, "step-*.ckpt")
IN_PROGRESS_SUFFIX = ".tmp"
# How a folder is listed: os.scandir; tests give one that refuses (root reads anything).
Scandir = Callable[[str], AbstractContextManager[Iterator[os.DirEntry[str]]]]


@dataclass(frozen=True)
class Found:
    """One checkpoint found by glob, and when it was last written (its mtime)."""

    path: Path
    written: float


@dataclass(frozen=True)
class Search:
    """The newest match of every pattern (None: no match), and what could not be read."""

    newest: Found | None
    notes: tuple[str, ...] = ()


def absolute(patterns: Iterable[str], base: str | os.PathLike[str]) -> list[str]:
    """``patterns`` with each relative one taken from ``base`` (the submit folder), whose
    own glob characters are escaped so that they match only themselves."""
    prefix = glob.escape(os.fspath(base))
    return [p if os.path.isabs(p) else os.path.join(prefix, p) for p in patterns]


def defaults(checkpoint_dir: str | os.PathLike[str]) -> list[str]:
    """The patterns looked at for every job: the Lightning callback's checkpoints."""
    return [os.path.join(glob.escape(os.fspath(checkpoint_dir)), LIGHTNING)]


def counts(path: str) -> bool:
    """Whether a match is a checkpoint: not a save in progress (``*.tmp``) nor a
    hidden name (``.name``: how savers write before they rename)."""
    name = os.path.basename(path.rstrip(os.sep))
    return not name.startswith(".") and not name.endswith(IN_PROGRESS_SUFFIX)


def newest(patterns: Sequence[str], scandir: Scandir = os.scandir) -> Search:
    """The newest file or folder (by mtime; the greater path on a tie) that matches any
    of ``patterns`` (absolute globs, ``**`` for any folders). A folder that a pattern
    starts from but cannot be read (``scandir`` lists it) gives a note; the folders
    below it that cannot be read are passed over, as glob does. Never raises OSError."""
    best: Found | None = None
    notes: list[str] = []
    for pattern in patterns:
        blocked = unreadable_base(pattern, scandir)
        if blocked is not None:
            notes.append(
                f"checkpoint folder {blocked} (of {pattern}) cannot be read: Permission denied"
            )
            continue
        for match in glob.iglob(pattern, recursive=True):
            if not counts(match):
                continue
            try:
                written = os.stat(match).st_mtime
            except OSError:  # removed since (a saver keeping the last few), or a broken link
                continue
            if best is None or (written, match) > (best.written, str(best.path)):
                best = Found(Path(match), written)
    return Search(best, tuple(notes))


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


def unreadable_base(pattern: str, scandir: Scandir = os.scandir) -> str | None:
    """The folder ``pattern`` starts from when it exists but cannot be listed; else None
    (a folder not made yet is no problem: the job has not saved yet)."""
    folder = base_folder(pattern)
    try:
        with scandir(folder):
            return None
    except PermissionError:
        return folder
    except OSError:
        return None


def submit_dir(env: Mapping[str, str]) -> str:
    """The folder the job was submitted from, which relative patterns start from (as
    the rendered script takes --checkpoint-dir); this process's folder outside SLURM."""
    return env.get("SLURM_SUBMIT_DIR") or os.getcwd()
