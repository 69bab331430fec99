"""The checkpoint folder for the workers: the folder itself, the names a save goes by
(hpclaunch.jobdir.checkpoint_folder has the layout), pruning and setting aside. No
torch: ``hpclaunch status`` reads the names on the login node."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.checkpoint.manifest import SIDECAR_SUFFIX, sidecar
from hpclaunch.contract import worker_env
from hpclaunch.errors import HpclaunchError
from hpclaunch.jobdir import modes
from hpclaunch.jobdir.checkpoint_folder import DAMAGED_SUFFIX, NAME, TEMP, scan

ENV_VAR = worker_env.CHECKPOINT_DIR
DEFAULT_KEEP_LAST = 2
MAX_STEP = 10**12 - 1  # names hold 12 digits
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception)\b.*")


class CheckpointError(HpclaunchError):
    """A checkpoint cannot be saved or loaded as asked; the message names what and
    how to fix it."""


@dataclass(frozen=True, order=True)
class Checkpoint:
    """A committed checkpoint: ``path`` is a file (one writer) or a folder (sharded)."""

    step: int
    path: Path

    @property
    def sharded(self) -> bool:
        return not self.path.name.endswith(".pt")


def reason_of(error: BaseException) -> str:
    """The line that says what went wrong: the last ``SomethingError: ...`` line of the
    error's text (DCP's holds every rank's traceback), else its first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if _ERROR_LINE.match(line)]
    text = named[-1] if named else (lines[0] if lines else "")
    if not text.startswith(type(error).__name__) and not named:
        text = f"{type(error).__name__}: {text}"
    return text[:300]


def directory(folder: str | os.PathLike[str] | None = None) -> Path:
    """``folder``, else ``$HPCLAUNCH_CHECKPOINT_DIR``; created if missing (what is
    created is the owner's only, or the group's too: hpclaunch.jobdir.modes)."""
    if folder is None:
        given = os.environ.get(ENV_VAR, "").strip()
        if not given:
            raise CheckpointError(
                f"{ENV_VAR} is not set; run the script through hpclaunch sbatch (which sets it) "
                "or pass folder=..."
            )
        folder = given
    path = Path(folder)
    try:
        modes.make_dirs(path, modes.folder_mode(os.environ))
    except OSError as exc:
        raise CheckpointError(f"cannot create the checkpoint folder {str(path)!r}: {exc}") from None
    return path


def check_step(step: int) -> int:
    if not 0 <= step <= MAX_STEP:
        raise ValueError(f"a checkpoint's step must be from 0 to {MAX_STEP}, not {step}")
    return step


def path_for(folder: Path, step: int, *, sharded: bool = False) -> Path:
    """Where the checkpoint of ``step`` goes. Raises ValueError outside 0..MAX_STEP."""
    name = f"step-{check_step(step):012d}"
    return folder / (name if sharded else f"{name}.pt")


def temp_for(final: Path, tag: str) -> Path:
    """The name ``final`` is written under until it is committed; ``tag`` tells the
    writers of one job's attempts apart."""
    return final.with_name(f".{final.name}.tmp-{tag}")


def complete(folder: str | os.PathLike[str]) -> list[Checkpoint]:
    """The committed checkpoints in ``folder``, oldest first. A step saved in both
    forms counts once, as its sharded form. Raises OSError (a folder that exists but
    cannot be listed)."""
    return [Checkpoint(c.step, c.path) for c in scan(folder, times=False).committed]


def lightning_steps(folder: str | os.PathLike[str]) -> list[int]:
    """The global steps of the Lightning checkpoints committed under ``folder``."""
    return [c.step for c in scan(folder, times=False).lightning]


def latest(folder: str | os.PathLike[str] | None = None) -> Checkpoint | None:
    """The newest committed checkpoint, or None."""
    found = complete(directory(folder))
    return found[-1] if found else None


def remove(path: Path) -> None:
    """Delete a checkpoint or a temporary one, file or folder, or nothing. What a
    folder's removal leaves (a file that cannot be deleted) stays; a file that cannot
    be deleted raises OSError."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except (IsADirectoryError, PermissionError):  # a folder: EISDIR on Linux, EPERM elsewhere
        if not path.is_dir():
            raise
        shutil.rmtree(path, ignore_errors=True)


def prune(folder: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` committed checkpoints, and what writers
    killed mid-write left; return what was deleted. Call it only from the job's one
    committing process (global rank 0) with no save of its own in flight."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, not {keep_last}")
    old = [item.path for item in complete(folder)[:-keep_last]]
    for path in old:
        # Out of the committed set in one rename first: a folder half deleted (a
        # filesystem that fails midway) must not still look committed.
        going = path.with_name(f".{path.name}.deleting-{os.getpid()}")
        os.replace(path, going)
        remove(going)
    # A one-file checkpoint's manifest goes with it; one without its file is what a
    # save killed between the two renames left.
    manifests = [
        Path(e.path)
        for e in os.scandir(folder)
        if e.name.endswith(SIDECAR_SUFFIX)
        and NAME.match(e.name.removesuffix(SIDECAR_SUFFIX))
        and not os.path.exists(e.path.removesuffix(SIDECAR_SUFFIX))
    ]
    leftovers = manifests + [Path(e.path) for e in os.scandir(folder) if TEMP.match(e.name)]
    for path in leftovers:
        remove(path)
    return old + leftovers


def set_aside(checkpoint: Checkpoint) -> Path:
    """Rename a committed checkpoint that failed to load out of the committed set, so
    that no later run picks it again; it stays for inspection. Returns its new path:
    ``step-N.damaged``, or ``step-N.damaged.2``, ``.3``... when one of that step was set
    aside before (which is kept: nothing set aside is deleted). Only global rank 0 sets
    aside, so no other process takes the name between the look and the rename."""
    base = checkpoint.path.name + DAMAGED_SUFFIX
    target, number = checkpoint.path.with_name(base), 1
    while os.path.lexists(target) or os.path.lexists(sidecar(target)):
        number += 1
        target = checkpoint.path.with_name(f"{base}.{number}")
    os.rename(checkpoint.path, target)
    if not checkpoint.sharded and sidecar(checkpoint.path).exists():
        os.replace(sidecar(checkpoint.path), sidecar(target))
    return target


def size_of(path: Path) -> int:
    """Bytes under ``path`` (a file or a folder)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
