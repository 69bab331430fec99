"""Runs the history leaves open (no ``reason``) although they have ended: their
supervisor could not write the history (a full or read-only job folder), or died before
it recorded the end (SIGKILL, its batch host lost). ``hpclaunch status`` must not show
such a run as running: it says what is known, from SLURM's state and the supervisor's
own line in the batch log. Pure, but for ``said_unwritten``, which reads that log.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hpclaunch.slurm.states import JobState

# The supervisor's line when it could not write the history (hpclaunch.jobdir.unwritten).
UNWRITTEN_MARK = "supervisor: could not write the job's history "
# The end of the batch log is read for it: the line comes with the run's end.
_TAIL_BYTES = 1 << 20
_REQUEUED = {JobState.PENDING, JobState.REQUEUED, JobState.REQUEUE_HOLD, JobState.REQUEUE_FED}


def texts(
    runs: Sequence[tuple[int, str | None]], state: JobState | None, unwritten: str | None
) -> dict[int, str]:
    """What is known of each run (requeue count, reason) that has no end in the history
    but has ended: a later run started, or SLURM's ``state`` (None: not known) says the
    job ended or was requeued. ``unwritten``: the error the supervisor logged when it
    could not write the history, if it did. Runs still running get no text."""
    found: dict[int, str] = {}
    for index, (requeue, reason) in enumerate(runs):
        if reason is not None:
            continue
        if index + 1 < len(runs):
            found[requeue] = f"no end recorded (run {runs[index + 1][0]} followed)"
        elif state is not None and (state.final or state in _REQUEUED):
            slurm = "requeued" if state in _REQUEUED else state.value
            why = "history not writable" if unwritten is not None else "no end recorded"
            found[requeue] = f"{why} (SLURM: {slurm})"
    return found


def note(requeue: int, state: JobState, unwritten: str | None, history: Path | str) -> str:
    """The note for the last run left open although SLURM says the job ``state``."""
    if unwritten is not None:
        return (
            f"run {requeue}'s end is not in {history}: its supervisor could not write it "
            f"({unwritten}); SLURM says {state.value}, and the batch log says the rest"
        )
    return (
        f"run {requeue} ended without its supervisor recording the end in {history} (the "
        f"supervisor died first: killed, or its batch host lost); SLURM says {state.value}"
    )


def said_unwritten(batch_log: Path | str | None) -> str | None:
    """The error of the supervisor's last "could not write the job's history" line in
    ``batch_log`` (its last megabyte), if there is one."""
    if batch_log is None:
        return None
    try:
        with open(batch_log, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - _TAIL_BYTES))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return None
    return error_of(tail)


def error_of(log: str) -> str | None:
    """The error named by the last history line of the supervisor in ``log``. Pure."""
    lines = [line for line in log.splitlines() if UNWRITTEN_MARK in line]
    if not lines:
        return None
    rest = lines[-1].split(UNWRITTEN_MARK, 1)[1]
    # "PATH: ERROR (ERRNO); consequence. Fix: ..."
    return rest.split(": ", 1)[1].split(";", 1)[0] if ": " in rest else None
