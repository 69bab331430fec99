"""Ending a job with the state its training reached, where SLURM's commands cannot.

When a ``--no-kill`` job loses its batch host, SLURM takes the host out of the job and
keeps it RUNNING on the others, but the batch script is gone with the host, so no
script's exit can end the job; ``scancel`` would end it CANCELLED, and ``scontrol`` has
no way to say COMPLETED or FAILED. libslurm's ``slurm_complete_job(job_id, status)`` has
(the job's owner may call it; ``salloc`` ends its allocations with it): status 0 ends the
job COMPLETED, any other FAILED with that exit code.

It is called in a child process, ``python -m hpclaunch.slurm.libslurm JOBID STATUS``, so
that neither loading SLURM's library nor SLURM stopping the job's processes once it ends
can touch the caller. The library is the one next to ``scontrol`` (``PREFIX/lib``,
``lib64``, the multiarch folders; Debian's ``slurm-wlm`` keeps it as
``slurm-wlm/libslurmfull.so``), else the linker's ``libslurm``. No torch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from hpclaunch.errors import SlurmError

_NAMES = ("libslurm.so", "slurm-wlm/libslurmfull.so", "slurm/libslurmfull.so")
COMPLETE_TIMEOUT_S = 60.0


def candidates(scontrol: str | None, found: str | None) -> list[Path]:
    """Where SLURM's client library may be, best first: beside ``scontrol`` (its
    prefix's lib folders), then what the linker ``found``. Pure."""
    out: list[Path] = []
    if scontrol:
        prefix = Path(scontrol).resolve().parent.parent
        libs = [prefix / "lib", prefix / "lib64", *sorted(prefix.glob("lib/*-linux-gnu"))]
        out += [lib / name for lib in libs for name in _NAMES]
    if found:
        out.append(Path(found))
    return out


def complete_job(job_id: int, status: int, timeout_s: float = COMPLETE_TIMEOUT_S) -> None:
    """End ``job_id`` with exit ``status`` (0: COMPLETED, else FAILED), through
    libslurm in a child process. Raises SlurmError naming why it could not."""
    argv = [sys.executable, "-m", __name__, str(job_id), str(status)]
    what = f"slurm_complete_job({job_id}, {status})"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SlurmError(argv, None, "", f"{what}: no answer in {timeout_s:g} s") from None
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise SlurmError(argv, done.returncode, done.stderr, f"{what}: {why[0]}")


def wait_status(exit_status: int) -> int:
    """The wait status of a process that exited with ``exit_status`` (0..255). Pure."""
    if not 0 <= exit_status <= 255:
        raise ValueError(f"an exit status is 0..255, not {exit_status}")
    return exit_status << 8


def _load() -> ctypes.CDLL:
    """SLURM's client library, loaded with its symbols global (its plugins need them).
    Raises OSError."""
    tried = candidates(shutil.which("scontrol"), ctypes.util.find_library("slurm"))
    for path in tried:
        if path.exists() or not path.is_absolute():
            return ctypes.CDLL(str(path), mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    raise OSError(
        "no SLURM client library (libslurm.so or libslurmfull.so) found; looked at "
        + ", ".join(str(p) for p in tried)
    )


def _main(argv: Sequence[str]) -> int:
    # SLURM stops the job's processes, this one included, once the job ends.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    job_id, status = int(argv[0]), int(argv[1])
    try:
        lib = _load()
    except OSError as exc:
        print(exc, file=sys.stderr)
        return 1
    if hasattr(lib, "slurm_init"):  # SLURM 20.11 on: read slurm.conf first
        lib.slurm_init(None)
    # SLURM reads the code as a wait status (WIFEXITED, WEXITSTATUS), as slurmd reports a
    # batch script's end: exit N is N << 8, which a raw N would read as a signal.
    if lib.slurm_complete_job(ctypes.c_uint32(job_id), ctypes.c_uint32(wait_status(status))) != 0:
        lib.slurm_strerror.restype = ctypes.c_char_p
        text = lib.slurm_strerror(lib.slurm_get_errno()) or b"unknown error"
        print(f"SLURM refused: {text.decode(errors='replace')}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
