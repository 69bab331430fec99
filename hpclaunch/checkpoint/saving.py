"""``save``: one checkpoint per step, in one of two forms, committed atomically,
blocking or in the background.

- **Sharded** (any DTensor or ``Stateful`` object in the state, or ``sharded=True``):
  every rank writes its own shards through torch's distributed checkpoint (DCP) into
  a temporary folder; once every rank's file and DCP's metadata are fsynced, global
  rank 0 renames the folder to ``step-N`` and fsyncs the parent. A checkpoint is
  visible whole or not at all.
- **One file** (replicated state, as DDP trains): global rank 0 writes
  ``step-N.pt`` (temporary file, fsync, rename, fsync of the folder).

``asynchronous=True`` returns once the state is copied into host memory; writing
and committing go on in a background thread, over a gloo process group of the
checkpoint's own (so they never interleave with the training's collectives). At
most one save is in flight: the next ``save``, ``load_latest``, ``wait`` and the
process's exit wait for it. A save that fails raises on all ranks, at the call
that waits for it, naming the first rank it failed on.
"""

from __future__ import annotations

import atexit
import logging
import operator
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from hpclaunch import progress
from hpclaunch.checkpoint import local, manifest, store
from hpclaunch.checkpoint.group import Ranks, attempt_tag
from hpclaunch.checkpoint.state import find_numbered_optimizer, find_sharded
from hpclaunch.checkpoint.store import Checkpoint, CheckpointError
from hpclaunch.jobdir import modes, saves
from hpclaunch.jobdir.atomic import fsync_folder, write_atomic
from hpclaunch.jobdir.checkpoint_folder import METADATA
from hpclaunch.jobdir.layout import JOB_DIR_VAR, JobFolder

if TYPE_CHECKING:  # the login node's `hpclaunch status` imports this package
    from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger(__name__)


@dataclass
class _Save:
    """One save, as the training's thread set it up; ``run`` writes and commits."""

    step: int
    final: Path
    keep_last: int
    ranks: Ranks
    data: dict[str, Any]  # what this rank writes (staged, when asynchronous)
    write: Callable[[], bool]  # this rank's part; True: rank 0 committed it now
    local_copy: Path | None
    asynchronous: bool
    started: float
    blocked: float = 0.0
    # The steps done that it holds, in the job's count, as rank 0's progress says when
    # ``save`` was called (the state is of that moment, also when the save goes on in the
    # background); None where that count is not the job's. ``step`` is the script's label.
    steps_done: int | None = None

    def run(self) -> Checkpoint:
        """Write and commit, then agree with every rank that it worked (a failure on
        any rank raises on all); what follows the commit cannot fail the save."""
        error: BaseException | None = None
        fresh = False
        try:
            fresh = self.write()
        except BaseException as exc:  # shared below, then raised
            error = exc
        # Agreeing needs the group: when the script destroyed it, say that, not
        # torch's "invalid process group".
        self.ranks.check_alive(f"the save of {self.final.name}")
        failed_on = self.ranks.first_true(error is not None)
        # The failed rank's errno goes to every rank, so that each one's error says
        # what the filesystem said (a full or read-only folder is no rank's fault).
        code = self.ranks.from_rank(failed_on, _errno_of(error)) if failed_on is not None else 0
        if error is not None:
            raise error
        if failed_on is not None:
            why = f": [Errno {code}] {os.strerror(code)}" if code else ""
            raise CheckpointError(
                f"the save of step {self.step} ({self.final}) failed on rank {failed_on}{why} "
                "(its log says more); it was not committed, the previous checkpoints stay"
            )
        if self.local_copy is not None and self.ranks.from_rank0(int(fresh)):
            local.keep(self.data, self.local_copy, self.step, self.keep_last)
        if self.ranks.rank == 0:
            self._after_commit(fresh)
        return Checkpoint(self.step, self.final)

    def _after_commit(self, fresh: bool) -> None:
        try:
            store.prune(self.final.parent, self.keep_last)
        except OSError as exc:
            log.warning("step %d is committed, but pruning older ones failed: %s", self.step, exc)
        if not fresh:
            return
        total = time.monotonic() - self.started
        _note(
            saves.SaveRecord(
                step=self.step,
                sharded=Checkpoint(self.step, self.final).sharded,
                asynchronous=self.asynchronous,
                ranks=self.ranks.world,
                ended=time.time(),
                blocked_s=round(self.blocked if self.asynchronous else total, 4),
                total_s=round(total, 4),
                bytes=store.size_of(self.final),
                steps_done=self.steps_done,
            )
        )


class _Saver:
    """This process's saves: the one in flight, the thread that runs it, the staging
    buffers it reuses."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: tuple[_Save, Future[Checkpoint]] | None = None
        self.executor: ThreadPoolExecutor | None = None
        self.stager: Any = None

    def submit(self, save: _Save) -> None:
        from concurrent.futures import ThreadPoolExecutor

        with self.lock:
            if self.executor is None:
                self.executor = ThreadPoolExecutor(1, thread_name_prefix="hpclaunch-checkpoint")
                atexit.register(_at_exit)
                # The interpreter joins the save's thread before ``atexit`` runs: its
                # hooks run last registered first, so this one runs before that join.
                hook = getattr(threading, "_register_atexit", None)
                if hook is not None:
                    hook(_exiting)
            self.pending = (save, self.executor.submit(save.run))

    def wait(self) -> Checkpoint | None:
        with self.lock:
            pending, self.pending = self.pending, None
        if pending is None:
            return None
        save, future = pending
        return _checked(save, future.result)

    def stage(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``state`` in host memory that training can no longer change. The
        buffers are reused by the next save, which starts only after this one ended."""
        from torch.distributed.checkpoint._state_dict_stager import StateDictStager

        if self.stager is None:
            import torch

            self.stager = StateDictStager(pin_memory=torch.cuda.is_available())
        staged: dict[str, Any] = self.stager.stage(dict(state), non_blocking=False)
        return staged


_saver = _Saver()


@progress.pausing(progress.SAVE)  # bounded by --checkpoint-timeout, not the step time
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

    ``sharded``: None picks the form from the state (sharded when it holds a DTensor
    or a ``Stateful`` object); False refuses those, naming them. ``asynchronous``:
    return once the state is staged in host memory (see the module's text). Keeps
    the newest ``keep_last`` committed checkpoints. ``local_copy``: every rank also
    keeps its shards in node memory for a fast in-place restart
    (``hpclaunch.checkpoint.local``).

    Raises on every rank, before anything is written, when any rank cannot save: the
    rank that cannot raises its own error (CheckpointError for a state, step, folder or
    ``local_copy`` it cannot save or a state it cannot copy into host memory, ValueError
    for a step out of range or ``keep_last`` below 1, HpclaunchError for an unreadable
    HPCLAUNCH_SHARE_WITH_GROUP), the others CheckpointError naming it; so do ranks that
    pass different steps, forms or ``local_copy``. Raises CheckpointError on every rank
    for a failed write, and for a failed earlier asynchronous save."""
    started = time.monotonic()  # training waits from here, for the save in flight too
    _saver.wait()
    ranks = Ranks.now()
    # What this rank would refuse, and the form it would write, are agreed by every rank
    # before anything is written: a rank that refused alone, or wrote the other form,
    # would leave the others waiting in the save's collectives for good. So whatever
    # can fail on one rank alone (checks, modes, the copy into host memory) happens
    # here, and any Exception is a refusal every rank learns of.
    refusal: Exception | None = None
    as_shards, keep_local, final, staged, file_mode, folder_mode = False, None, Path(), None, 0, 0
    try:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, not {keep_last}")
        root = store.directory(folder)
        step = store.check_step(_step_of(step))
        as_shards = _form(state, sharded)
        if local_copy and not as_shards:
            raise CheckpointError(
                "save(local_copy=True) keeps each rank's shards of a sharded checkpoint; this "
                "state holds no DTensor, so one writer saves it: drop local_copy, or pass "
                "sharded=True to have every rank write"
            )
        keep_local = local.root(ranks) if local_copy else None
        final = store.path_for(root, step, sharded=as_shards)
        # Its folder may be the user's own, readable by others: what it writes is not.
        file_mode, folder_mode = modes.file_mode(os.environ), modes.folder_mode(os.environ)
        if asynchronous and (as_shards or ranks.rank == 0):  # the ranks that write
            staged = _stage(state, step)
    except Exception as exc:  # any of them is this rank's refusal, shared
        refusal = exc
    _agree(ranks, step, refusal, as_shards, local_copy)
    writer = _sharded_writer if as_shards else _single_writer
    data, write = writer(
        state if staged is None else staged, step, final, ranks, file_mode, folder_mode
    )
    job = _Save(step, final, keep_last, ranks, data, write, keep_local, asynchronous, started)
    if ranks.rank == 0:  # the one that writes the save's record
        job.steps_done = progress.steps_done()
    if not asynchronous:
        _checked(job, job.run)
        return final
    job.blocked = time.monotonic() - started
    _saver.submit(job)
    return final


def _checked(save: _Save, run: Callable[[], Checkpoint]) -> Checkpoint:
    """``run()``'s checkpoint; whatever it raises comes out as CheckpointError (DCP's
    CheckpointException is a BaseException, which ``except Exception`` would miss)."""
    try:
        return run()
    except (CheckpointError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        how = "asynchronous save" if save.asynchronous else "save"
        raise CheckpointError(  # one line: a failure record keeps an error's last line
            f"the {how} of step {save.step} ({save.final}) failed: {store.reason_of(exc)}; "
            "it was not committed, the previous checkpoints stay"
        ) from exc


def _step_of(step: Any) -> int:
    """``step`` as an int (any integer type: a numpy or 0-d torch integer too)."""
    try:
        return operator.index(step)
    except TypeError:
        raise CheckpointError(
            f"checkpoint.save takes the step as an integer, not {step!r} (a "
            f"{type(step).__name__}); pass the training's step count"
        ) from None


def _stage(state: Mapping[str, Any], step: int) -> dict[str, Any]:
    """``state`` copied into host memory; CheckpointError naming what could not be."""
    try:
        return _saver.stage(state)
    except Exception as exc:  # torch's copy raises what the object does
        raise CheckpointError(  # one line: a failure record keeps an error's last line
            f"the asynchronous save of step {step} cannot copy the state into host memory: "
            f"{type(exc).__name__}: {exc}; save only tensors and plain values (or save "
            "without asynchronous=True); nothing was written"
        ) from exc


def _errno_of(error: BaseException | None) -> int:
    """The errno of the first OSError in ``error``, its causes and, for DCP's
    CheckpointException, its ranks' errors; 0 when there is none."""
    todo, seen = [error], set()
    while todo:
        exc = todo.pop(0)
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno:
            return exc.errno
        by_rank = getattr(exc, "failures", None)  # DCP: rank -> (exception, traceback)
        if isinstance(by_rank, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in by_rank.values()]
        todo += [exc.__cause__, exc.__context__]
    return 0


def wait() -> Checkpoint | None:
    """Wait for the save in flight, if any; returns what it committed. Raises
    CheckpointError when it failed (on every rank: the failure is shared). The wait is
    part of the save (bounded by --checkpoint-timeout, not by the time since the last
    step: a long final save after the last step is no hang); with none in flight, no
    stretch (it would count as activity)."""
    if _saver.pending is None:
        return None
    with progress.paused(progress.SAVE):
        return _saver.wait()


def in_flight() -> int | None:
    """The step of the save in flight, if any."""
    pending = _saver.pending
    return None if pending is None or pending[1].done() else pending[0].step


def _agree(
    ranks: Ranks, step: int, refusal: Exception | None, as_shards: bool, local_copy: bool
) -> None:
    """Raise on every rank when any rank refused the save, when the ranks would write
    different forms, save different steps, or some keep a local copy and others not
    (one collective)."""

    def lowest(flag: bool) -> int:
        return ranks.rank if flag else ranks.world

    ok = refusal is None
    refused, shards, one_file, with_copy, without_copy, low, minus_high = ranks.minimum(
        lowest(not ok),
        lowest(as_shards and ok),
        lowest(not as_shards and ok),
        lowest(bool(local_copy) and ok),
        lowest(not local_copy and ok),
        # A rank that refused may hold no number for a step: its refusal is said first.
        int(step) if ok else 0,
        -int(step) if ok else 0,
    )
    if refusal is not None:
        raise refusal
    if refused < ranks.world:
        raise CheckpointError(
            f"checkpoint.save of step {step} was refused on rank {refused} (its error says "
            "why); nothing was written"
        )
    if low != -minus_high:
        raise CheckpointError(
            f"checkpoint.save was called with different steps on different ranks (from {low} "
            f"to {-minus_high}; this rank: {step}): every rank saves the same step (it is a "
            "collective); nothing was written"
        )
    if shards < ranks.world and one_file < ranks.world:
        raise CheckpointError(
            f"checkpoint.save of step {step}: rank {shards}'s state holds sharded entries (a "
            f"DTensor, or an object with state_dict()), rank {one_file}'s holds none, so they "
            "would write different forms; give every rank the same kind of state, or pass "
            "sharded=True so that every rank writes its part; nothing was written"
        )
    if with_copy < ranks.world and without_copy < ranks.world:
        # Only the ranks with a copy would wait for rank 0's word that it committed.
        raise CheckpointError(
            f"checkpoint.save of step {step} was called with local_copy=True on rank "
            f"{with_copy} and local_copy=False on rank {without_copy}: every rank passes the "
            "same local_copy (it is a collective); nothing was written"
        )


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
            f"{found[1]}, {found[2]}; leave sharded unset (or True) so that every rank "
            "writes its part"
        )
    as_shards = bool(found) if sharded is None else sharded
    numbered = find_numbered_optimizer(state) if as_shards else None
    if numbered is not None:
        raise CheckpointError(
            f"checkpoint.save cannot save {numbered!r} as a sharded checkpoint: it is "
            "optimizer.state_dict() (or the optimizer), whose entries are numbered, and no "
            "optimizer can load it back as a sharded checkpoint loads; save the optimizer "
            "as torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer) "
            "gives it (model_state, optim_state), and load it the same way"
        )
    return as_shards


def _single_writer(
    state: Mapping[str, Any], step: int, final: Path, ranks: Ranks, file_mode: int, _: int
) -> tuple[dict[str, Any], Callable[[], bool]]:
    """Rank 0 writes ``state`` (staged already, when asynchronous)."""
    import torch

    if ranks.rank != 0:
        return {}, lambda: False
    data = dict(state)

    def save_summed(handle: IO[bytes]) -> None:
        torch.save(data, handle)
        handle.flush()
        # The manifest goes beside the file before the rename that commits the file:
        # a committed one-file checkpoint always has its manifest.
        files = {final.name: manifest.checksum(Path(handle.name))}
        written = manifest.Manifest(step, ranks.world, manifest.LAYOUT, files)
        manifest.write(manifest.sidecar(final), written, mode=file_mode)

    def write() -> bool:
        if write_atomic(final, save_summed, mode=file_mode):
            return True
        log.warning("%s exists already and was kept; save each step once", final)
        return False

    return data, write


def _sharded_writer(
    state: Mapping[str, Any], step: int, final: Path, ranks: Ranks, _: int, folder_mode: int
) -> tuple[dict[str, Any], Callable[[], bool]]:
    """Every rank writes its part of ``state`` (staged already, when asynchronous)."""
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    temp = store.temp_for(final, attempt_tag())
    if ranks.rank == 0:
        try:
            store.remove(temp)  # a failed save's of this step in this attempt, if any
            # Made here, owner-only (or the group's), before any rank writes into it:
            # DCP would make it with the umask's mode, and it becomes the checkpoint.
            modes.make_dirs(temp, folder_mode)
        except OSError as exc:  # not before the collective below: DCP will say it
            log.warning("cannot prepare %s: %s", temp, exc)
    # Every rank waits for that removal: DCP makes the folder as it plans, and another
    # rank's fresh folder must not be removed (or be half seen) by rank 0.
    ranks.first_true(False)
    data = dict(state)
    writer = _summing_writer(temp, ranks.rank)

    def write() -> bool:
        what = f"the save of {final.name}"
        ranks.check_alive(what)
        dcp_save(data, storage_writer=writer, process_group=ranks.pg, no_dist=ranks.alone)
        # DCP takes a destroyed default group for "one process": its files would hold
        # each rank's own part only. Nothing is committed then.
        ranks.check_alive(what)
        if ranks.rank != 0:
            return False
        if final.exists():
            log.warning("%s exists already and was kept; save each step once", final)
            store.remove(temp)
            return False
        # Every rank's part is in: DCP gathered their write results (after each wrote
        # its part) before rank 0 wrote the metadata. The manifest is in before the
        # rename that commits.
        files = manifest.merge_parts(temp, ranks.world)
        files.update(manifest.sums(temp, [METADATA]))
        written = manifest.Manifest(step, ranks.world, manifest.LAYOUT, files)
        manifest.write(temp / manifest.NAME, written)
        fsync_folder(temp)
        os.replace(temp, final)
        fsync_folder(final.parent)
        return True

    return data, write


def _summing_writer(temp: Path, rank: int) -> Any:
    """torch's FileSystemWriter that, once this rank's files are written and fsynced,
    sums them into this rank's part of the manifest (before DCP gathers the ranks'
    write results, so that rank 0 finds every part after that gather)."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    class SummingWriter(FileSystemWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            future = super().write_data(plan, planner)
            names = {result.storage_data.relative_path for result in future.wait()}
            manifest.write_part(temp, rank, manifest.sums(temp, names))
            return future

    return SummingWriter(temp, sync_files=True)


def _note(record: saves.SaveRecord) -> None:
    """Into the job folder, when the job has one (hpclaunch's agent says where)."""
    job_dir = os.environ.get(JOB_DIR_VAR, "").strip()
    if not job_dir:
        return
    try:
        saves.append(JobFolder(Path(job_dir)).saves, record)
    except OSError as exc:
        log.warning("cannot note the save's times in %s: %s", job_dir, exc)


def _exiting() -> None:
    """At the interpreter's exit, before it joins a save in flight: the join is part of
    the save (its stretch, bounded by --checkpoint-timeout, not by the time since the
    last step); the process ends after it, the stretch with it."""
    if in_flight() is not None:
        progress.set_paused(True, progress.SAVE)


def _at_exit() -> None:
    """A process that ends with a save in flight finishes it first (concurrent.futures
    joins its threads before ``atexit`` runs this), or says that it is lost."""
    try:
        done = wait()  # in the save's stretch, as any wait
    except CheckpointError as exc:
        log.error("%s", exc)
    else:
        if done is not None:
            log.info("the asynchronous save of step %d was committed at exit", done.step)
