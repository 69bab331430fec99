"""``save``: one checkpoint per step, in one of two forms, committed atomically,
blocking or in the background.

- **Sharded** (any DTensor in the state, or ``sharded=True``): every rank writes its
  own shards through torch's distributed checkpoint (DCP) into a temporary folder;
  once every rank's file and DCP's metadata are fsynced, global rank 0 renames the
  folder to ``step-N`` and fsyncs the parent. A checkpoint is visible whole or not
  at all.
- **One file** (replicated state, as DDP trains): global rank 0 writes
  ``step-N.pt`` (temporary file, fsync, rename, fsync of the folder).

``asynchronous=True`` returns once the state is copied into host memory; writing
and committing go on in a background thread, over a gloo process group of the
checkpoint's own (so they never interleave with the training's collectives). At
most one save is in flight: the next ``save``, ``load_latest``, ``wait`` and the
process's exit wait for it. A save that fails raises in all ranks, at the call
that waits for it.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpclaunch.checkpoint import group, local, store
from hpclaunch.checkpoint.state import find_sharded
from hpclaunch.checkpoint.store import Checkpoint, CheckpointError
from hpclaunch.jobdir import saves
from hpclaunch.jobdir.atomic import fsync_folder, write_atomic
from hpclaunch.jobdir.layout import JOB_DIR_VAR, JobFolder

if TYPE_CHECKING:  # the login node's `hpclaunch status` imports this package
    from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger("hpclaunch.checkpoint")


@dataclass
class _Pending:
    step: int
    final: Path
    future: Future[Checkpoint | None]


_lock = threading.Lock()
_pending: _Pending | None = None
_executor: ThreadPoolExecutor | None = None
_stager: Any = None


def save(
    state: Mapping[str, Any],
    step: int,
    *,
    folder: str | os.PathLike[str] | None = None,
    keep_last: int = store.DEFAULT_KEEP_LAST,
    asynchronous: bool = False,
    sharded: bool | None = None,
    local_copy: bool = False,
) -> Path:
    """Save ``state`` as the checkpoint of ``step``; returns the path it has once
    committed. Every rank calls it at the same step (it is a collective).

    ``sharded``: None picks the form from the state (sharded when it holds a
    DTensor); False refuses a DTensor, naming it. ``asynchronous``: return once the
    state is staged in host memory (see the module's text). Keeps the newest
    ``keep_last`` committed checkpoints. ``local_copy``: every rank also keeps its
    shards in node memory for a fast in-place restart (``hpclaunch.checkpoint.local``).
    Raises CheckpointError for a state or folder it cannot save, and for a failed
    earlier asynchronous save."""
    global _pending
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, not {keep_last}")
    wait()
    # Made here, in the training's thread: process groups must be made in the same
    # order on every rank, which a background thread cannot promise.
    group.get()
    root = store.directory(folder)
    store.check_step(step)
    as_shards = _form(state, sharded)
    if local_copy and not as_shards:
        raise CheckpointError(
            "save(local_copy=True) keeps each rank's shards of a sharded checkpoint; this "
            "state holds no DTensor, so one writer saves it: drop local_copy, or pass "
            "sharded=True to have every rank write"
        )
    keep_local = local.root() if local_copy else None  # raises before anything is written
    final = store.path_for(root, step, sharded=as_shards)
    started = time.monotonic()
    writer = _sharded_writer if as_shards else _single_writer
    data, commit = writer(state, final, asynchronous)
    blocked = time.monotonic() - started

    def job() -> Checkpoint | None:
        done = _finish(commit, final, step, keep_last, started, blocked, asynchronous)
        if keep_local is not None:
            local.keep(data, step, keep_last)
        return done

    if not asynchronous:
        job()
        return final
    with _lock:
        _pending = _Pending(step, final, _background().submit(job))
    return final


def wait() -> Checkpoint | None:
    """Wait for the save in flight, if any; returns what it committed. Raises
    CheckpointError when it failed (on every rank: the failure is shared)."""
    global _pending
    with _lock:
        pending, _pending = _pending, None
    if pending is None:
        return None
    try:
        return pending.future.result()
    except (CheckpointError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        raise CheckpointError(
            f"the asynchronous save of step {pending.step} ({pending.final}) failed: "
            f"{type(exc).__name__}: {exc}; it was not committed, the previous checkpoints stay"
        ) from exc


def in_flight() -> int | None:
    """The step of the save in flight, if any."""
    pending = _pending
    return None if pending is None or pending.future.done() else pending.step


def _form(state: Mapping[str, Any], sharded: bool | None) -> bool:
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"checkpoint.save takes a dict of state (such as {{'model': model.state_dict()}}), "
            f"not a {type(state).__name__}"
        )
    found = find_sharded(state)
    if sharded is False and found:
        raise CheckpointError(
            f"checkpoint.save(sharded=False) cannot save {found[0]!r}: it is a "
            f"{found[1]}, of which each rank holds only its own shard, and one writer "
            "would save rank 0's part alone; leave sharded unset (or True) so that "
            "every rank writes its shards"
        )
    return bool(found) if sharded is None else sharded


# What a writer leaves for later: write this rank's part, and commit on rank 0.
Commit = Callable[[], None]


def _single_writer(
    state: Mapping[str, Any], final: Path, asynchronous: bool
) -> tuple[dict[str, Any], Commit]:
    import torch

    if group.rank() != 0:
        return {}, lambda: None
    data = _stage(state) if asynchronous else dict(state)

    def write() -> None:
        if not write_atomic(final, lambda handle: torch.save(data, handle)):
            log.warning(
                "%s exists already and was kept (a committed checkpoint is never "
                "overwritten); save each step once", final,
            )  # fmt: skip

    return data, write


def _sharded_writer(
    state: Mapping[str, Any], final: Path, asynchronous: bool
) -> tuple[dict[str, Any], Commit]:
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    temp = store.temp_for(final, group.attempt_tag())
    if group.rank() == 0:
        store.remove(temp)  # a killed attempt's, under the same tag
    data = _stage(state) if asynchronous else dict(state)
    writer = FileSystemWriter(temp, sync_files=True)

    def write() -> None:
        dcp_save(data, storage_writer=writer, process_group=group.get(), no_dist=not group.on())
        if group.rank() == 0:
            fsync_folder(temp)
            if final.exists():
                log.warning("%s exists already and was kept; save each step once", final)
                store.remove(temp)
                return
            os.replace(temp, final)
            fsync_folder(final.parent)

    return data, write


def _stage(state: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``state`` in host memory that training can no longer change."""
    global _stager
    from torch.distributed.checkpoint._state_dict_stager import StateDictStager

    if _stager is None:
        import torch

        _stager = StateDictStager(pin_memory=torch.cuda.is_available())
    staged: dict[str, Any] = _stager.stage(dict(state), non_blocking=False)
    return staged


def _finish(
    commit: Commit, final: Path, step: int, keep_last: int,
    started: float, blocked: float, asynchronous: bool,
) -> Checkpoint | None:  # fmt: skip
    """Write and commit, then agree with every rank that it worked (a failure on any
    rank raises on all), prune, and note the save's times."""
    error: BaseException | None = None
    try:
        commit()
    except BaseException as exc:  # shared below, then raised
        error = exc
    failed_somewhere = group.any_true(error is not None)
    if error is not None:
        raise error
    if failed_somewhere:
        raise CheckpointError(
            f"the save of step {step} failed on another rank (its log says why); "
            "it was not committed"
        )
    if group.rank() != 0:
        return Checkpoint(step, final)
    store.prune(final.parent, keep_last)
    total = time.monotonic() - started
    _note(saves.SaveRecord(
        step=step, sharded=Checkpoint(step, final).sharded, asynchronous=asynchronous,
        blocked_s=round(blocked, 4), total_s=round(total, 4), bytes=store.size_of(final),
        ranks=group.world(), ended=time.time(),
    ))  # fmt: skip
    return Checkpoint(step, final)


def _note(record: saves.SaveRecord) -> None:
    """Into the job folder, when the job has one (hpclaunch's agent says where)."""
    job_dir = os.environ.get(JOB_DIR_VAR, "").strip()
    if not job_dir:
        return
    try:
        saves.append(JobFolder(Path(job_dir)).saves, record)
    except OSError as exc:
        log.warning("cannot note the save's times in %s: %s", job_dir, exc)


def _background() -> ThreadPoolExecutor:
    global _executor
    from concurrent.futures import ThreadPoolExecutor

    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpclaunch-checkpoint")
        atexit.register(_at_exit)
    return _executor


def _at_exit() -> None:
    """A process that ends with a save in flight finishes it first (concurrent.futures
    joins its threads before ``atexit`` runs this), or says that it is lost."""
    if _pending is None:
        return
    try:
        done = wait()
    except CheckpointError as exc:
        log.error("%s", exc)
    else:
        if done is not None and group.rank() == 0:
            log.info("the asynchronous save of step %d was committed at exit", done.step)
