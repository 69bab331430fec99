"""``load_latest``: the newest committed checkpoint every rank can load, in either
form. A committed checkpoint that fails its manifest (bit rot, truncated, another
step's under its name, a newer layout) or fails to load (wrong shapes)
is named on stderr and the previous one is tried; once an older one loads, the ones
that failed are renamed ``step-N.damaged`` (``.damaged.2``... when that name is taken)
out of the committed set, so a job never loops on a bad checkpoint; one of a newer
layout is left in place (skipped, not damaged). When none loads, nothing is renamed
and the error names each failure: a job never quietly starts from step 0 while
checkpoints exist. A file that cannot be read while it is verified (EIO, EACCES) says
nothing of the checkpoint: every rank raises CheckpointUnreadable, nothing renamed.
"""

from __future__ import annotations

import errno
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from hpclaunch import progress
from hpclaunch.checkpoint import local, manifest, saving, store
from hpclaunch.checkpoint.group import Ranks
from hpclaunch.checkpoint.manifest import ManifestError, Problem
from hpclaunch.checkpoint.store import Checkpoint, CheckpointError
from hpclaunch.jobdir import saves, set_aside
from hpclaunch.jobdir.checkpoint_folder import DAMAGED, DAMAGED_SUFFIX, scan
from hpclaunch.jobdir.layout import JOB_DIR_VAR, JobFolder

T = TypeVar("T")

_SHARDED_HELP = (
    "build it as torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer) "
    "gives it (which also initialises the optimizer's state), the same way the saved one "
    "was built, in a function passed as into= (called only when there is a checkpoint to "
    "load, so that a fresh start never steps the optimizer)"
)
# What ``into`` may be: the state, or a function that builds it when a sharded checkpoint
# is to be loaded.
Into = Mapping[str, Any] | Callable[[], Mapping[str, Any]]


@dataclass(frozen=True)
class Loaded:
    """What ``load_latest`` returns: the step it was saved at, the state (``into``,
    filled in place, for a sharded checkpoint), and the committed checkpoint's path in
    the checkpoint folder (also when every rank read its node-local copy of it)."""

    step: int
    state: Any
    path: Path


@dataclass(frozen=True)
class _Failed:
    """A checkpoint that failed to verify or load, newer than the one tried next."""

    checkpoint: Checkpoint
    why: str  # what rank 0 knows of the failure, one line
    problem: Problem
    file: str | None = None


class CheckpointUnreadable(CheckpointError):
    """A file of the checkpoint could not be read while it was verified (EIO, ESTALE,
    EACCES, out of memory): that says nothing of its content, so nothing is set aside
    and the previous checkpoint is not tried; raised on every rank alike."""


class CheckpointMismatch(CheckpointError):
    """The state given to ``load_latest`` cannot take the checkpoint (no ``into`` for
    a sharded one, or saved entries it has no place for): the caller's to fix, the
    same on every rank, so the checkpoint is never set aside for it."""


@progress.pausing(progress.LOAD)  # the same (a step's rendezvous comes after it)
def load_latest(
    folder: str | os.PathLike[str] | None = None,
    *,
    into: Into | None = None,
    map_location: Any = "cpu",
    weights_only: bool = True,
) -> Loaded | None:
    """Load the newest committed checkpoint, or return None when there is none. Every
    rank loads the step global rank 0 chose (a collective).

    A sharded checkpoint loads into ``into``, in place, resharded to this job's ranks
    (so ``into`` is required for it: the state as the training built it, with the
    same keys as the saved one). ``into`` may be a function that returns that state:
    it is called (once, on every rank) only when a sharded checkpoint is to be loaded,
    so that a fresh start never builds it (torch's ``get_state_dict`` steps a fresh
    optimizer to give it state, which moves Adam's step count); ``Loaded.state`` is
    what it returned, filled in. A one-file checkpoint is returned as saved
    (``into`` is not needed; given as a dict, each saved tensor's shape is checked
    against the one at its key in ``into``). Each checkpoint is first checked against
    its manifest (hpclaunch.checkpoint.manifest). A checkpoint that fails to load is
    set aside once an older one has loaded (which shows that the loading itself works); when none
    loads, nothing is renamed and CheckpointError names each failure. Raises
    CheckpointError too when the folder is unusable or ``into`` does not fit.

    This worker's progress (hpclaunch.progress) then counts on from the steps the
    checkpoint holds (as its save recorded them), or from 0 when there was none."""
    saving.wait()
    ranks = Ranks.now()
    root = store.directory(folder)
    failed: list[_Failed] = []  # newer than the one being tried
    built: list[Mapping[str, Any]] = []  # what a function given as ``into`` returned
    while True:
        below = failed[-1].checkpoint.step if failed else None
        found = _committed(root, below) if ranks.rank == 0 else []
        step = ranks.from_rank0(found[-1].step if found else -1)
        if step < 0:
            _refuse_none_left(root, failed)
            # None is a fresh start, from step 0, which is what the run's count says then.
            progress.resumed_from(held=0, by=progress.BY_CHECKPOINT)
            return None
        sharded = bool(ranks.from_rank0(int(found[-1].sharded) if found else 0))
        chosen = Checkpoint(step, store.path_for(root, step, sharded=sharded))
        if sharded and callable(into) and not built:
            built.append(_build(into, ranks))
        error: BaseException | None = None
        try:
            # A function given as ``into`` is not needed by a one-file checkpoint.
            target = built[0] if built else None if callable(into) else into
            # Node-local copies, when every rank has one, are what is read: the shared
            # files are then not (their sums would cost the read the copies save).
            near = chosen.sharded and target is not None and local.available(step, ranks)
            checked = _verify(chosen, ranks, files=not near)  # raises on all ranks or none
            state = _load(chosen, target, map_location, weights_only, ranks, near)
        except (CheckpointMismatch, CheckpointUnreadable, KeyboardInterrupt, SystemExit):
            raise  # the same on every rank
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            error = exc
        failed_on = ranks.first_true(error is not None)
        if failed_on is None:
            if not checked and ranks.rank == 0:
                _say(
                    f"{chosen.path} has no manifest (saved before hpclaunch wrote them): "
                    "loaded unverified"
                )
            _set_aside(failed, chosen, ranks)
            _tell_progress(step, ranks)
            return Loaded(step, state, chosen.path)
        if isinstance(error, ManifestError):  # the same on every rank
            why = f"step {step}: {_problem(error)}: {error}"
            failed.append(_Failed(chosen, why, error.problem, error.file))
            continue
        if error is not None:
            _say(f"{chosen.path} cannot be loaded on rank {ranks.rank} ({store.reason_of(error)})")
        why = store.reason_of(error) if error is not None else f"see rank {failed_on}'s log"
        failed.append(_Failed(chosen, f"rank {failed_on}: {why}", Problem.LOAD))


def _verify(chosen: Checkpoint, ranks: Ranks, *, files: bool = True) -> bool:
    """Check ``chosen`` against its manifest: the step and the layout, then, with
    ``files``, each file's size (every rank, cheap) and checksum (each rank its share,
    so that the checkpoint is read once). Every rank raises the same ManifestError, or
    none does: the ranks agree before any other collective. When a rank cannot read a
    file (not a verdict on it), every rank raises the same CheckpointUnreadable instead.
    False: there is no manifest (a checkpoint saved before hpclaunch wrote them),
    nothing was checked."""
    error: ManifestError | None = None
    unread: BaseException | None = None  # what kept a file from being read
    unread_file: str | None = None
    found: manifest.Manifest | None = None
    try:
        found = manifest.read(manifest.location(chosen.path))
        if found is not None and not files:
            manifest.check_step(found, chosen.step)
        elif found is not None:
            manifest.check(found, chosen.path, chosen.step)
            manifest.check_sums(
                found, chosen.path, manifest.share_of(found, ranks.rank, ranks.world)
            )
    except ManifestError as exc:
        error = exc
    except manifest.ReadError as exc:
        unread, unread_file = exc.error, exc.file
    except Exception as exc:  # a rank that raised past the agreement below would hang the rest
        unread, unread_file = exc, _UNKNOWN
    read_on = ranks.first_true(unread is not None)
    if read_on is not None:
        _refuse_unread(chosen, ranks, read_on, unread, unread_file, found)
    failed_on = ranks.first_true(error is not None)
    if failed_on is None:
        return ranks.from_rank0(int(found is not None)) == 1
    # The failing rank tells the others how (the problem, the file by its place in the
    # manifest), so that rank 0 names it on stderr and in the job folder.
    problems = list(Problem)
    names = list(found.files) if found is not None else []
    mine = error.file if error is not None else None
    problem = problems[ranks.from_rank(failed_on, problems.index(error.problem) if error else 0)]
    index = ranks.from_rank(failed_on, names.index(mine) if mine in names else -1)
    file = names[index] if 0 <= index < len(names) else None
    if error is not None and failed_on == ranks.rank:
        if ranks.rank != 0:  # rank 0 names the checkpoint; what this rank found is here
            _say(f"{chosen.path} fails its manifest on rank {ranks.rank}: {error}")
        raise error
    raise ManifestError(problem, file, f"found by rank {failed_on} (its log says more)")


_UNKNOWN = "\0"  # a file name no manifest holds: which file failed is not known


def _refuse_unread(
    chosen: Checkpoint,
    ranks: Ranks,
    read_on: int,
    unread: BaseException | None,
    unread_file: str | None,
    found: manifest.Manifest | None,
) -> None:
    """Raise the same CheckpointUnreadable on every rank: rank ``read_on`` tells the
    others which file (by its place in the manifest) and the errno."""
    if unread is not None:
        _say(f"{chosen.path} cannot be read on rank {ranks.rank}: {unread!r}")
    names = list(found.files) if found is not None else []
    mine = -1 if unread_file is None else names.index(unread_file) if unread_file in names else -2
    index = ranks.from_rank(read_on, mine)
    code = ranks.from_rank(read_on, getattr(unread, "errno", None) or 0)
    raise CheckpointUnreadable(
        unreadable_message(chosen.path, read_on, names[index] if index >= 0 else index, code)
    )


def unreadable_message(path: Path, rank: int, file: str | int, code: int) -> str:
    """What every rank says when rank ``rank`` could not read ``file`` of the checkpoint
    at ``path`` (-1: its manifest, -2: not known) with errno ``code`` (0: not an OSError)."""
    what = (
        str(_file_path(path, file))
        if isinstance(file, str)
        else str(manifest.location(path))
        if file == -1
        else "its files"
    )
    how = (
        f"[Errno {code}] {errno.errorcode.get(code, '?')}: {os.strerror(code)}"
        if code > 0
        else "not an error of the filesystem (out of memory, say)"
    )
    return (
        f"{path} cannot be verified: reading {what} failed on rank {rank}: {how}; rank "
        f"{rank}'s log says more. It was not set aside: a read error says nothing of what "
        "the file holds. Fix the filesystem (or the permissions) and run again"
    )


def _file_path(checkpoint: Path, name: str) -> Path:
    return checkpoint / name if not checkpoint.name.endswith(".pt") else checkpoint


def _problem(error: ManifestError) -> str:
    return f"{error.problem.value} in {error.file}" if error.file else error.problem.value


def _build(into: Callable[[], Mapping[str, Any]], ranks: Ranks) -> Mapping[str, Any]:
    """The state ``into()`` builds, on every rank; when it raises or returns no dict on
    any rank, every rank raises (none is left alone in the load's collectives)."""

    def build() -> Mapping[str, Any]:
        state = into()
        if not isinstance(state, Mapping):
            raise CheckpointMismatch(
                f"load_latest(into=...) was given a function that returned a "
                f"{type(state).__name__}, not the dict of state to load into"
            )
        return state

    return _on_every_rank(
        build,
        ranks,
        lambda rank: CheckpointMismatch(
            f"the function given as load_latest(into=...) failed on rank {rank} (its log says how)"
        ),
    )


def _on_every_rank(
    act: Callable[[], T], ranks: Ranks, elsewhere: Callable[[int], BaseException]
) -> T:
    """``act()`` on every rank, which then agree whether it raised anywhere: a rank
    where it raised raises its own error, the others ``elsewhere(that rank)``, so that
    none goes on alone into a collective the others never reach."""
    error: BaseException | None = None
    result: T | None = None
    try:
        result = act()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        error = exc
    failed_on = ranks.first_true(error is not None)
    if error is not None:
        raise error
    if failed_on is not None:
        raise elsewhere(failed_on)
    return cast(T, result)


def _tell_progress(step: int, ranks: Ranks) -> None:
    """Tell this worker's progress the steps the loaded checkpoint holds, in the job's
    count: what the job folder's record of its save says. ``step`` is only the script's
    label (an epoch, say): without a record (another job's checkpoint, or a save whose
    count was not the job's) nothing is told, and the optimizer's state may still tell.
    Rank 0 reads the record; every rank takes its answer (a collective), so that every
    rank counts on from the same step."""
    held = ranks.from_rank0(_recorded_steps(step) if ranks.rank == 0 else -1)
    if held >= 0:
        progress.resumed_from(step, held=held, by=progress.BY_CHECKPOINT)


def _recorded_steps(step: int, env: Mapping[str, str] = os.environ) -> int:
    """The steps done that the newest save record of ``step`` in the job folder counts
    (the one of the checkpoint committed now: a committed one is never overwritten);
    -1 when there is no job folder, no record of it (another job's checkpoint) or no
    count in it."""
    job_dir = env.get(JOB_DIR_VAR, "").strip()
    if not job_dir:
        return -1
    found = [r for r in saves.read(JobFolder(Path(job_dir)).saves) if r.step == step]
    done = found[-1].steps_done if found else None
    return done if done is not None and done >= 0 else -1


def _committed(root: Path, below: int | None) -> list[Checkpoint]:
    return [c for c in store.complete(root) if below is None or c.step < below]


def _refuse_none_left(root: Path, failed: list[_Failed]) -> None:
    """No committed checkpoint (left to try) is a fresh start, unless one failed or an
    earlier run set some aside: then starting from step 0 would lose work without a
    word, so this raises."""
    if failed:
        raise CheckpointError(none_loads_message(root, failed))
    try:
        aside = list(scan(root, times=False).damaged)
    except OSError:
        aside = []
    if aside:
        raise CheckpointError(
            f"{root} holds no committed checkpoint, only ones set aside as damaged: "
            f"{', '.join(aside)}; {_rename_back(aside[-1])} to resume from it, or move "
            "them away to start from step 0"
        )


def none_loads_message(root: Path, failed: list[_Failed]) -> str:
    """What load_latest says when every committed checkpoint failed: each one and why,
    and only the advice that fits the failures."""
    tried = "; ".join(f"{f.checkpoint.path.name} ({f.why})" for f in failed)
    problems = {f.problem for f in failed}
    advice = []
    if Problem.LOAD in problems:
        advice.append("when the script changed (the state given to into=, weights_only), fix it")
    if problems - {Problem.LOAD, Problem.LAYOUT}:
        advice.append("when they are damaged, move them out of the folder")
    if Problem.LAYOUT in problems:
        advice.append("ones of a newer layout load with the hpclaunch that saved them")
    return (
        f"no checkpoint in {root} can be loaded: {tried}. Nothing was renamed, since none "
        f"loads: {'; '.join(advice)}"
    )


def _rename_back(name: str) -> str:
    """How to put a checkpoint set aside back (a one-file one with its manifest)."""
    match = DAMAGED.match(name)
    committed = name[: name.index(DAMAGED_SUFFIX)] if match else name
    if committed.endswith(".pt"):
        return (
            f"rename one back, as {name} to {committed} and its manifest "
            f"{name}{manifest.SIDECAR_SUFFIX} to {committed}{manifest.SIDECAR_SUFFIX},"
        )
    return f"rename one back, as {name} to {committed},"


def _load(
    chosen: Checkpoint,
    into: Mapping[str, Any] | None,
    map_location: Any,
    weights_only: bool,
    ranks: Ranks,
    near: bool,
) -> Any:
    import torch

    if not chosen.sharded:
        state = torch.load(chosen.path, map_location=map_location, weights_only=weights_only)
        wrong = shape_mismatch(state, into) if into is not None else None
        if wrong:  # as DCP says it for a sharded one: a damaged checkpoint, the previous next
            raise ValueError(wrong)
        return state
    if into is None:
        raise CheckpointMismatch(
            f"{chosen.path} is a sharded checkpoint: pass the state to load it into, "
            f"load_latest(into=state); {_SHARDED_HELP}"
        )
    # DCP replaces the top level's non-tensor values in the dict it is given: give it
    # the caller's own, so that ``into`` holds what was loaded, as documented.
    return _load_sharded(chosen, into if isinstance(into, dict) else dict(into), ranks, near)


def shape_mismatch(saved: Any, into: Any, key: str = "") -> str | None:
    """The first tensor of ``saved`` whose shape differs from the one at its key in
    ``into`` (nested dicts and lists, keys joined by dots); None when none does. A key
    only one of them has is not looked at: ``into`` need not hold all of a one-file
    checkpoint."""
    if isinstance(saved, Mapping) and isinstance(into, Mapping):
        pairs = [(k, saved[k], into[k]) for k in saved if k in into]
    elif isinstance(saved, list | tuple) and isinstance(into, list | tuple):
        pairs = list(zip(range(len(saved)), saved, into, strict=False))
    else:
        want, found = getattr(into, "shape", None), getattr(saved, "shape", None)
        if want is None or found is None or tuple(want) == tuple(found):
            return None
        return (
            f"Size mismatch between saved {tuple(found)} and current {tuple(want)} for "
            f"{key or 'the state'}"
        )
    for name, inner_saved, inner_into in pairs:
        found_here = shape_mismatch(inner_saved, inner_into, f"{key}.{name}" if key else str(name))
        if found_here:
            return found_here
    return None


def _load_sharded(
    chosen: Checkpoint, into: dict[str, Any], ranks: Ranks, near: bool
) -> dict[str, Any]:
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    reader = FileSystemReader(chosen.path)
    left_out = _left_out(reader, into, ranks)
    if left_out:
        raise CheckpointMismatch(
            f"{chosen.path} holds {len(left_out)} entries the state given to "
            f"load_latest(into=...) lacks, such as {', '.join(left_out[:3])}: they would not "
            f"be restored; {_SHARDED_HELP}"
        )
    if near:
        if _from_local(into, chosen.step, ranks):
            return into
        # The shared files were not summed (the copies were to be read instead): sum them
        # now, before DCP reads them, or damage there would be loaded without a word.
        _verify(chosen, ranks, files=True)
    dcp_load(into, storage_reader=reader, process_group=ranks.pg, no_dist=ranks.alone)
    return into


def _left_out(reader: Any, into: dict[str, Any], ranks: Ranks) -> list[str]:
    """The saved entries ``into`` has no place for. Every rank reads the metadata
    itself; they agree whether it could be read before any further collective."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    def read() -> list[str]:
        saved = reader.read_metadata().state_dict_metadata
        _check_coverage(saved)
        return sorted(set(saved) - set(flatten_state_dict(into)[0]))

    return _on_every_rank(
        read,
        ranks,
        lambda rank: CheckpointError(f"its metadata could not be read on rank {rank}"),
    )


def _check_coverage(saved: Mapping[str, Any]) -> None:
    """Raise when a tensor's saved chunks do not cover it: DCP would restore the rest
    from nothing, without a word (a checkpoint written by ranks that each took
    themselves for the only one)."""
    for key, meta in saved.items():
        chunks, size = getattr(meta, "chunks", None), getattr(meta, "size", None)
        if chunks is None or size is None:
            continue  # not a tensor
        held = sum(math.prod(chunk.sizes) for chunk in chunks)
        if held < math.prod(size):
            raise CheckpointError(
                f"its metadata covers {held} of the {math.prod(size)} elements of {key}"
            )


def _from_local(into: dict[str, Any], step: int, ranks: Ranks) -> bool:
    """Load every rank's node-local copy of ``step``; False (shared copy next) when
    any rank cannot."""
    error: BaseException | None = None
    try:
        local.load(into, step, ranks)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        error = exc
        why = store.reason_of(exc)
        _say(f"node-local copy of step {step} unusable on rank {ranks.rank}: {why}")
    if ranks.first_true(error is not None) is not None:
        return False
    if ranks.rank == 0:
        _say(f"step {step} read from the node-local copies")
    return True


def _set_aside(failed: list[_Failed], loaded: Checkpoint, ranks: Ranks) -> None:
    """An older checkpoint loaded, so the newer ones that failed are damaged: rank 0
    renames them out of the committed set, so that no later run tries them again, and
    notes each in the job folder for ``hpclaunch status``. One of a newer layout is not
    damaged (a newer hpclaunch reads it): it is named on stderr and left in place."""
    if ranks.rank != 0:
        return
    for bad in failed:
        damaged = bad.checkpoint
        if bad.problem is Problem.LAYOUT:  # not damaged: this hpclaunch cannot read it
            _say(
                f"{damaged.path} skipped as newer ({bad.why}); resumed from "
                f"{loaded.path.name}; it was left as it is"
            )
            continue
        try:
            target = store.set_aside(damaged)
        except OSError as exc:
            _say(f"{damaged.path} failed to load ({bad.why}) and could not be renamed: {exc}")
            continue
        _say(
            f"{damaged.path} failed to load ({bad.why}): set aside as {target.name}; "
            f"resumed from {loaded.path.name}"
        )
        reason = bad.why.splitlines()[0][:300] if bad.why else ""
        _note(
            set_aside.SetAside(
                damaged.step, bad.problem.value, bad.file, reason, str(target), time.time()
            )
        )


def _note(record: set_aside.SetAside, env: Mapping[str, str] = os.environ) -> None:
    """Into the job folder, when the job has one (hpclaunch's agent says where)."""
    job_dir = env.get(JOB_DIR_VAR, "").strip()
    if not job_dir:
        return
    try:
        set_aside.append(JobFolder(Path(job_dir)).set_aside, record)
    except OSError as exc:
        _say(f"cannot note in {job_dir} that step {record.step} was set aside: {exc}")


def _say(message: str) -> None:
    sys.stderr.write(f"hpclaunch checkpoint: {message}\n")
    sys.stderr.flush()
