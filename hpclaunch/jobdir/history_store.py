"""Writing ``history.json`` when more than one supervisor may hold the job: each run
writes only its own entry, and never after a newer run has started.

A batch host cut off from the network keeps running its old supervisor while SLURM
requeues the job elsewhere; when the host comes back, that stale supervisor ends too
and would write its (old) history over the newer run's. So every write is a
compare-and-write under an exclusive lock on ``JOB_DIR/.history.lock``: re-read the
file, merge this run's entry into it (``merge``, a pure function of the two
histories), write the result. A run that started after ours wins: our entry goes in
only while it is still open there, else our write is dropped, with one line saying
why. The newest run also closes the older runs that never recorded an end (their batch
host was lost) as ``lost``. No torch, no SLURM.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpclaunch.jobdir.atomic import write_bytes_atomic
from hpclaunch.jobdir.history import (
    TORN_RETRY_S,
    Action,
    History,
    HistoryError,
    Reason,
    Run,
    unreadable,
)
from hpclaunch.jobdir.layout import JobFolder

log = logging.getLogger(__name__)

LOCK_NAME = ".history.lock"
LOCK_WAIT_S = 30.0  # a holder is a supervisor between a read and a rename: milliseconds
LOST_NOTE = (
    "no end recorded: its supervisor could not write the history, or died first (its "
    "batch host lost, or the supervisor killed)"
)
# Trailing blanks kept at the end of history.json (JSON allows them): room for closing
# the run in place where the folder takes no new file (full, over quota, immutable).
SLACK_BYTES = 4096
# The errors of a folder that refuses a new file but may let an existing one be rewritten.
_IN_PLACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EPERM, errno.EACCES})

Json = dict[str, Any]


def _key(run: Mapping[str, Any]) -> tuple[int, float]:
    return int(run.get("requeue_count") or 0), float(run.get("started") or 0.0)


def newest_other(
    runs: Sequence[Mapping[str, Any]], mine: Mapping[str, Any]
) -> Mapping[str, Any] | None:
    """The newest of ``runs`` that started after ``mine`` (a higher requeue count, or
    the same one started later), not ``mine`` itself; None when ``mine`` is the newest."""
    newer = [r for r in runs if r.get("token") != mine.get("token") and _key(r) > _key(mine)]
    return max(newer, key=_key) if newer else None


def merge(
    disk: Mapping[str, Any] | None, ours: Mapping[str, Any], token: str
) -> tuple[Json | None, str | None]:
    """What to write, given the history on ``disk`` (None: no file yet) and ``ours`` (the
    writing supervisor's, whose run is the one with ``token``): the history to write, or
    None to write nothing; and a line saying why, when the rule changed what ours says.
    Both are what ``History.to_json`` writes. Raises ValueError (no run with ``token``)."""
    mine = next((dict(r) for r in ours["runs"] if r.get("token") == token), None)
    if mine is None:
        raise ValueError(f"no run with token {token!r} in the history to write")
    if disk is None:
        return _close_lost(dict(ours), mine), None
    runs = [dict(r) for r in disk.get("runs", [])]
    at = next((i for i, r in enumerate(runs) if r.get("token") == token), None)
    newer = newest_other(runs, mine)
    if newer is None:
        runs = _put(runs, at, mine)
        return _close_lost({**ours, "runs": runs}, mine), None
    after = f"run {newer.get('requeue_count')} (started {_when(newer)}) started after this one"
    if at is not None and runs[at].get("reason") is not None:
        return None, (
            f"{after} and recorded this run as {runs[at]['reason']!r}; not overwriting the "
            "history (this run's supervisor outlived its job: a lost or partitioned host)"
        )
    return {**disk, "runs": _put(runs, at, mine)}, f"{after}; recording only this run's entry"


def _put(runs: list[Json], at: int | None, mine: Json) -> list[Json]:
    if at is not None:
        return [*runs[:at], mine, *runs[at + 1 :]]
    return sorted([*runs, mine], key=_key)


def _close_lost(history: Json, mine: Mapping[str, Any]) -> Json:
    """``history`` with every other run older than ``mine`` that recorded no end
    closed as lost: its supervisor never finished, and SLURM requeued the job."""
    runs = []
    for run in history["runs"]:
        if (
            run.get("token") != mine.get("token")
            and run.get("reason") is None
            and _key(run) < _key(mine)
        ):
            run = {
                **run,
                "reason": Reason.LOST.value,
                "action": Action.SLURM_REQUEUES.value,
                "error": LOST_NOTE,
            }
        runs.append(run)
    return {**history, "runs": runs}


def _when(run: Mapping[str, Any]) -> str:
    started = run.get("started")
    return time.strftime("%H:%M:%S", time.localtime(started)) if started else "?"


def save_run(job_dir: Path, history: History, run: Run) -> bool:
    """Write ``run``'s entry of ``history`` into ``JOB_DIR/history.json`` by ``merge``,
    under the lock. Returns False (and logs why) when a newer run's history was kept
    instead. Raises OSError, HistoryError (the file on disk is not a history)."""
    if run.token is None:
        raise ValueError("a run without a token cannot be saved by save_run")
    job_dir.mkdir(parents=True, exist_ok=True)
    path = JobFolder(job_dir).history
    with locked(job_dir / LOCK_NAME):
        disk = read(path)
        merged, why = merge(disk, history.to_json(), run.token)
        if why is not None:
            log.warning("supervisor: history: %s", why)
        if merged is None:
            return False
        try:
            clean = History.from_json(merged, history.job_id).to_json()  # derived fields
        except ValueError as exc:
            raise unreadable(path, str(exc)) from None
        write(path, (json.dumps(clean, indent=2) + "\n").encode())
        return True


def padded(text: bytes, size: int) -> bytes | None:
    """``text`` followed by blanks up to ``size`` bytes; None when it is longer. Pure."""
    return None if len(text) > size else text + b" " * (size - len(text))


def write(path: Path, text: bytes) -> None:
    """Replace ``path`` by ``text`` (JSON) atomically, SLACK_BYTES of blanks after it. Where
    the folder refuses the new file (full, over quota, immutable: a file can still be
    rewritten where it is), ``text`` overwrites the old file in place instead, when it
    fits into it: not atomic (a crash in that write can leave it torn), but the run's
    end is recorded. Raises OSError (the atomic write's) when neither worked."""
    try:
        write_bytes_atomic(path, text + b" " * SLACK_BYTES)
    except OSError as exc:
        if exc.errno not in _IN_PLACE_ERRNOS or not _overwrite(path, text):
            raise
        log.warning(
            "supervisor: history: %s could not be replaced (%s); rewritten in place",
            path,
            exc.strerror or exc,
        )


def _overwrite(path: Path, text: bytes) -> bool:
    """``text`` written over ``path`` in place, padded to its size; False when it does
    not fit, or the file cannot be written either."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        data = padded(text, os.fstat(fd).st_size)
        if data is None:
            return False
        done = 0
        while done < len(data):  # a short write (a full filesystem) is written on
            written = os.pwrite(fd, data[done:], done)
            if written <= 0:
                return False
            done += written
        os.fsync(fd)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def read(path: Path) -> Json | None:
    """The JSON in ``path``, or None when there is none; a file that does not parse is
    read once more after TORN_RETRY_S (an in-place rewrite in flight). Raises
    HistoryError."""
    for attempt in range(2):
        if attempt:
            time.sleep(TORN_RETRY_S)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            why = f"{type(exc).__name__}: {exc}"
            continue
        if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
            raise unreadable(path, "no list of runs")
        return data
    raise unreadable(path, why)


def load_or_set_aside(job_dir: Path, job_id: int, max_requeues: int) -> History:
    """The job's history; when the file on disk cannot be read (torn by a crash in an
    in-place rewrite, or not ours), a new one, with the old file moved aside and a line
    saying so: a history is bookkeeping, and never stops a run from stepping."""
    try:
        return History.load(job_dir, job_id, max_requeues)
    except HistoryError as exc:
        path = JobFolder(job_dir).history
        aside = path.with_name(f"{path.name}.unreadable-{int(time.time())}")
        try:
            os.rename(path, aside)
            kept = f"the old file is kept as {aside}"
        except OSError as err:
            kept = f"the old file could not be moved aside ({err.strerror or err})"
        log.error(
            "supervisor: history: %s could not be read (%s); this run starts a new "
            "history (%s): the earlier runs are not in it, nor the nodes and failure "
            "requeues they counted",
            path,
            exc.why or exc,
            kept,
        )
        return History(job_id, max_requeues)


def moved_on(job_dir: Path, run: Run) -> Mapping[str, Any] | None:
    """The run in ``JOB_DIR/history.json`` that started after ``run``, if any (the job
    has moved on without this run's supervisor). Raises HistoryError."""
    disk = read(JobFolder(job_dir).history)
    if disk is None:
        return None
    return newest_other(disk["runs"], asdict(run))


@contextmanager
def locked(path: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if missing). flock is exclusive
    across hosts on local filesystems and on NFSv4 (Linux maps it to an NFS lock); on a
    filesystem without locks the write goes ahead unlocked, with a warning, as it does
    after ``wait_s`` seconds without the lock. Raises OSError (opening ``path``)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    held = False
    try:
        deadline = time.monotonic() + wait_s
        while not held:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    log.warning(
                        "supervisor: history: could not lock %s (%s); writing unlocked", path, exc
                    )
                    break
                time.sleep(0.05)
        yield
    finally:
        if held:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
