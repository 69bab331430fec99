"""A bookkeeping write into the job folder that failed (the history, a note, a record):
one line naming the file, the error and the fix, said once. Such a write is not meant
to decide how the job ends: training that finished is finished whether or not its
history could say so. One exception: when the agents' end notes could not be written
and a stop signal came, the supervisor cannot tell a finished training from a stopped
one and takes it as stopped (hpclaunch.recovery.stops: after the time-limit warning,
a requeue, which resumes from the latest checkpoint). Pure, but for ``Unwritten``,
which remembers what was said. No torch.
"""

from __future__ import annotations

import errno as errnos
import logging
from pathlib import Path

from hpclaunch.jobdir.errortext import StorageErrno

# Not a StorageErrno (that list classifies failure messages, where these words mean
# other things too): an immutable folder (`chattr +i`) refuses new files with EPERM.
_EPERM_FIX = (
    "the folder refuses changes, an immutable attribute most likely: `lsattr -d FOLDER` "
    "shows an `i`, and `chattr -i FOLDER` (as root) clears it"
)
_OTHER_FIX = "check the job folder's filesystem (`df -h FOLDER`, `mount`)"


def how(exc: OSError) -> str:
    """The error as the line says it: its text and its name (``No space left on device
    (ENOSPC)``). Pure."""
    name = errnos.errorcode.get(exc.errno or 0)
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{text} ({name})" if name else text


def fix(exc: OSError, folder: Path | str) -> str:
    """What a user does about ``exc`` in ``folder``. Pure."""
    name = errnos.errorcode.get(exc.errno or 0, "")
    if name in StorageErrno.__members__:
        return StorageErrno[name].fix
    return (_EPERM_FIX if name == "EPERM" else _OTHER_FIX).replace("FOLDER", str(folder))


def line(what: str, path: Path | str, exc: OSError, consequence: str) -> str:
    """The one line for ``what`` (at ``path``) that could not be written: the error,
    what it means for the job (``consequence``), and the fix, for the folder of the
    path the error names (a temporary file's, a folder not made) or else of ``path``.
    Pure."""
    folder = Path(exc.filename if isinstance(exc.filename, str) else path).parent
    return f"could not write {what} {path}: {how(exc)}; {consequence}. Fix: {fix(exc, folder)}"


class Unwritten:
    """Says each failed write once (by what and error), through ``log``."""

    def __init__(self, log: logging.Logger, prefix: str) -> None:
        self._log = log
        self._prefix = prefix
        self._said: set[tuple[str, int | None]] = set()

    def say(self, what: str, path: Path | str, exc: OSError, consequence: str) -> None:
        key = (what, exc.errno)
        if key in self._said:
            return
        self._said.add(key)
        self._log.error("%s%s", self._prefix, line(what, path, exc, consequence))
