"""The checkpoint folder's names, and what a listing of it holds. No torch: the workers
save and load through ``hpclaunch.checkpoint``, and ``hpclaunch status`` (through
``hpclaunch.record``) lists the folder with ``scan``.

    step-000000000042.pt          one file: global rank 0's state (replicated, DDP)
    step-000000000042.pt.manifest.json   its manifest (hpclaunch.checkpoint.manifest)
    step-000000000042/            one folder: every rank's shards (torch's distributed
        .metadata                 checkpoint), committed as a whole
        hpclaunch-manifest.json   its manifest
    .step-000000000043.tmp-TAG[/] a save in progress, or one killed mid-write
    step-000000000041.damaged[/]  a committed checkpoint that failed to load
    step-000000000041.damaged.2[/]  another one of that step, set aside after the first
    lightning/step-000000000030.ckpt   hpclaunch.frameworks.lightning's, by global step

Only ``step-N.pt`` and ``step-N/`` with its ``.metadata`` are committed checkpoints: a
name without the leading dot appears in one rename, after everything under it is durable.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

METADATA = ".metadata"  # what torch's distributed checkpoint writes last
NAME = re.compile(r"^step-(\d{12})(\.pt)?$")
# A one-file checkpoint's manifest is written as .step-N.pt.manifest.json.tmp-PID.
TEMP = re.compile(r"^\.step-\d{12}(\.pt)?(\.manifest\.json)?\.(tmp|deleting)-[\w.-]+$")
DAMAGED_SUFFIX = ".damaged"
# A checkpoint set aside: step-N.damaged, or step-N.damaged.2, .3... when a checkpoint
# of that step was set aside before (the earlier one is kept, never overwritten).
DAMAGED = re.compile(r"^step-\d{12}(\.pt)?\.damaged(\.\d+)?$")
# Lightning's checkpoints, as hpclaunch.frameworks.lightning commits them (by rename)
# into this subfolder of the checkpoint folder: step-<global step, 12 digits>.ckpt.
LIGHTNING_FOLDER = "lightning"
LIGHTNING_NAME = re.compile(r"^step-(\d{12})\.ckpt$")


@dataclass(frozen=True, order=True)
class Committed:
    """A committed checkpoint: ``path`` is a file (one writer) or a folder (sharded);
    ``written`` its modification time (None when it went while the folder was listed)."""

    step: int  # the label the script saved it under (``save(state, step)``)
    path: Path
    written: float | None = None

    @property
    def sharded(self) -> bool:
        return not self.path.name.endswith(".pt")


@dataclass(frozen=True)
class Listing:
    """What one look at a checkpoint folder found."""

    committed: tuple[Committed, ...] = ()  # oldest first; a step in both forms once, sharded
    damaged: tuple[str, ...] = ()  # names set aside as damaged
    lightning: tuple[Committed, ...] = ()  # lightning/step-N.ckpt; ``step``: the global step


def scan(folder: str | os.PathLike[str], *, times: bool = True) -> Listing:
    """List ``folder`` once (and its ``lightning`` subfolder when there is one); with
    ``times``, each checkpoint's modification time too. A folder not made yet is empty.
    Raises OSError when it exists but cannot be listed."""
    found: dict[int, Committed] = {}
    damaged: list[str] = []
    lightning: tuple[Committed, ...] = ()
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return Listing()
    for entry in entries:
        if DAMAGED.match(entry.name):
            damaged.append(entry.name)
            continue
        if entry.name == LIGHTNING_FOLDER and entry.is_dir():
            lightning = _lightning(Path(entry.path), times)
            continue
        match = NAME.match(entry.name)
        if not match:
            continue
        step, single = int(match.group(1)), match.group(2) is not None
        if single and entry.is_file():
            if step not in found:
                found[step] = Committed(step, Path(entry.path), _written(entry, times))
        elif not single and entry.is_dir() and os.path.isfile(os.path.join(entry.path, METADATA)):
            found[step] = Committed(step, Path(entry.path), _written(entry, times))
    return Listing(tuple(sorted(found.values())), tuple(sorted(damaged)), lightning)


def _lightning(folder: Path, times: bool) -> tuple[Committed, ...]:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return ()
    out = []
    for entry in entries:
        match = LIGHTNING_NAME.match(entry.name)
        if match:
            out.append(Committed(int(match.group(1)), Path(entry.path), _written(entry, times)))
    return tuple(sorted(out))


def _written(entry: os.DirEntry[str], times: bool) -> float | None:
    if not times:
        return None
    try:
        return entry.stat().st_mtime
    except OSError:  # pruned since it was listed
        return None
