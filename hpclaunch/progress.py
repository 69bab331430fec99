"""Training progress, from each worker to its node's agent, with no change to the script.

Every completed optimizer step counts (torch's global optimizer-step hook, installed in
every worker before the script runs); a loop without a torch optimizer calls ``beat()``
(optionally with its own step number) once per step. Each worker writes its count and
times into a small file in node memory that only its node's agent reads
(``HPCLAUNCH_PROGRESS_FILE``): nothing goes over the network per step. The agent uses
it to notice a hang (hpclaunch.node.hangs) and for status; ``report`` adds the run's
length and the script's metrics.

Each worker also says where its attempt resumed: the steps done before its first counted
step, in the job's count, and how that was seen (``RESUMED_BY``): a checkpoint loaded
through hpclaunch.checkpoint, the step count in the optimizer state the script restored
(looked at once, before the first step of the optimizer whose steps count), the script's
own step numbers (``beat(step=n)``), or Lightning's (hpclaunch.frameworks.lightning).
The first evidence wins; where there is none, the resume point is unknown, never 0.

``install`` also registers a handler that writes every thread's Python stack to
``HPCLAUNCH_STACKS_FILE`` on ``stack_signal()``, a real-time signal that no scheduler
or framework sends (the preemption signals TERM, INT, HUP, QUIT, USR1, USR2 stay the
script's). This module imports no torch: the hooks are registered when the script
imports torch's optimizers, or at once if it has.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import faulthandler
import functools
import importlib.abc
import importlib.machinery
import json
import mmap
import os
import signal
import struct
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import IO, Any, TypeVar, cast

from hpclaunch.contract.worker_env import ATTEMPT, REQUEUE_COUNT
from hpclaunch.contract.worker_env import PROGRESS_FILE as PROGRESS_FILE
from hpclaunch.contract.worker_env import STACKS_FILE as STACKS_FILE
from hpclaunch.contract.worker_env import WATCHER_PID as WATCHER_PID
from hpclaunch.jobdir.atomic import write_bytes_atomic

# The file: a head that every report rewrites, then the resume point, written only when
# it is seen (so that a report packs no more than before).
# Head: magic, write count, flags, progress count, steps done (-1: none yet), first and
# last progress (CLOCK_MONOTONIC, the same for every process of the node), slowest
# interval, the pid of the process that writes the file, the steps the run is to take
# (-1: unknown).
# Resume point: the steps done before this attempt's first counted step, in the job's
# count (-1: not seen), and how it was seen (1 + its index in RESUMED_BY; 0: not seen).
# Stretch: the stretch between steps the worker is in (its Stretch's code; 0: none; above
# the low byte, one bit per kind of the stretches open inside it, the outer one's too),
# and since when: its start, or, out of one, when the last one ended (0: none yet).
# Tail: the write count again.
# The agent reads the file while the worker writes it: each write makes both counts odd
# first and even last, so a read that saw them differ, or odd, saw half a write (a
# seqlock; the reader reads the file in one pass, head to tail).
_SEQ = struct.Struct("<Q")
_SEQ_AT = 4
_HEAD = struct.Struct("<Iqqdddqq")
_HEAD_AT = _SEQ_AT + _SEQ.size
_RESUME = struct.Struct("<qi")
_RESUME_AT = _HEAD_AT + _HEAD.size
_STRETCH = struct.Struct("<Id")
_STRETCH_AT = _RESUME_AT + _RESUME.size
_TAIL_AT = _STRETCH_AT + _STRETCH.size
_LAYOUT = struct.Struct("<4sQIqqdddqqqiIdQ")  # all of it, as read
assert _LAYOUT.size == _TAIL_AT + _SEQ.size
# b"HPCp": the layout before the resume point; b"HPCr": the one before the stretch;
# b"HPCs": the one before the write count. None is ever read as this one.
_MAGIC = b"HPCt"
_READ_TRIES = 5  # reads of a board being written, before it is "no news" this time
STACKS_ON_SIGNAL = 1  # flag: the writer dumps its stacks on stack_signal()
PAUSED = 2  # flag: the worker is in a stretch between steps (see paused())
JOB_STEPS = 4  # flag: the steps are the job's (resumed_from, or the script's own numbers)
# How a worker saw where it resumed: the same as hpclaunch.jobdir.progress_notes.RESUMED_BY
# (a test keeps them alike), here so that a worker's boot imports no more than this module.
RESUMED_BY = ("checkpoint", "optimizer", "script", "lightning")
BY_CHECKPOINT, BY_OPTIMIZER, BY_SCRIPT, BY_LIGHTNING = RESUMED_BY


class Stretch(enum.Enum):
    """A stretch between steps a worker says it is in, each bounded by its own timeout
    (hpclaunch.node.hangs): the script's own pause (``paused()``), and
    hpclaunch.checkpoint's save and load. The value is its code on the board."""

    PAUSE = 1
    SAVE = 2
    LOAD = 3

    def __str__(self) -> str:
        return self.name.lower()


STRETCHES = tuple(Stretch)
PAUSE, SAVE, LOAD = Stretch.PAUSE, Stretch.SAVE, Stretch.LOAD
PR_SET_PTRACER = 0x59616D61  # Yama: who besides our ancestors may read our memory
_OPTIMIZER_MODULE = "torch.optim.optimizer"


def stack_signal() -> int:
    """The signal a worker dumps its threads' stacks on: SIGRTMIN+5, free of glibc's own
    real-time signals and of every stop signal SLURM or a framework sends."""
    return int(signal.SIGRTMIN) + 5


@dataclass(frozen=True)
class Progress:
    """One worker's progress as its file says. Times are CLOCK_MONOTONIC seconds."""

    count: int  # progress reports in this attempt
    step: int  # steps done: counted on from a resumed checkpoint's, or the script's own
    first: float
    last: float
    slowest: float  # the longest interval between two progress reports; 0 before two
    stacks_on_signal: bool
    stretch: Stretch | None = None  # the stretch between steps it is in (the outermost)
    # Every kind of stretch open, the outermost and those begun inside it (a save inside
    # the script's pause): the stretch's bound is the largest of theirs.
    within: frozenset[Stretch] = frozenset()
    pid: int = 0  # the process that writes it
    total: int | None = None  # the steps the run is to take, when the script said
    job_steps: bool = False  # ``step`` counts on from a resumed checkpoint (or is the script's)
    # The steps done before this attempt's first counted step, in the job's count, and how
    # that was seen (one of RESUMED_BY); None: not seen.
    resumed: int | None = None
    resumed_by: str | None = None
    # The start of its stretch; out of one, when the last one ended (0.0: none yet).
    since: float = 0.0

    @property
    def paused(self) -> bool:
        """Whether it is in a stretch between steps (a save, a load, a pause)."""
        return self.stretch is not None

    @property
    def steps_per_s(self) -> float | None:
        span = self.last - self.first
        return (self.count - 1) / span if self.count > 1 and span > 0 else None


_PACK = _HEAD.pack_into
_SEQ_PACK = _SEQ.pack_into


class _Board:
    """This worker's progress file, mapped: each report is one write into memory (kept
    lean: it runs at every optimizer step)."""

    __slots__ = (
        "_map",
        "base",
        "count",
        "explicit",
        "first",
        "flags",
        "last",
        "metrics",
        "metrics_path",
        "metrics_written",
        "pending",
        "pid",
        "resumed",
        "resumed_by",
        "seq",
        "since",
        "slowest",
        "step",
        "stretch",
        "stretches",
        "total",
    )

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, _LAYOUT.size)
            self._map = mmap.mmap(fd, _LAYOUT.size)
        finally:
            os.close(fd)
        self.flags = 0
        self.explicit = False  # the script calls beat(): the optimizer hook stays quiet
        self.base = 0  # the steps done before this attempt (see resumed_from)
        self.count = 0
        self.step = -1
        self.first = self.last = self.slowest = 0.0
        self.pid = os.getpid()  # the writer: the process that opened it
        self.total = -1
        self.resumed = -1  # the steps done before this attempt's first counted step
        self.resumed_by = 0  # 1 + its index in RESUMED_BY; 0: not seen
        self.stretch = 0  # its code on the board (see the layout); 0: none
        self.stretches: list[Stretch] = []  # those open, the outermost first
        self.since = 0.0  # the stretch's start, or when the last one ended
        self.metrics: dict[str, float] = {}
        self.metrics_path = metrics_path(path)
        self.metrics_written = -METRICS_EVERY_S
        self.pending = False  # metrics reported since the last write (the next beat writes)
        self.seq = 0  # writes begun and ended: odd while one is under way
        self._map[:4] = _MAGIC
        self.write()

    def write(self) -> None:
        mapped = self._map
        self.seq = seq = self.seq + 1
        _SEQ_PACK(mapped, _SEQ_AT, seq)
        _SEQ_PACK(mapped, _TAIL_AT, seq)
        _PACK(
            mapped,
            _HEAD_AT,
            self.flags,
            self.count,
            self.step,
            self.first,
            self.last,
            self.slowest,
            self.pid,
            self.total,
        )
        _RESUME.pack_into(mapped, _RESUME_AT, self.resumed, self.resumed_by)
        _STRETCH.pack_into(mapped, _STRETCH_AT, self.stretch, self.since)
        self.seq = seq = seq + 1
        _SEQ_PACK(mapped, _TAIL_AT, seq)
        _SEQ_PACK(mapped, _SEQ_AT, seq)

    def set_stretch(self, kind: Stretch | None) -> bool:
        """Begin the stretch ``kind``, or end the innermost one open (None); whether that
        changed anything (ending none does not, nor beginning the kind it is in: the
        caller that began it ends it). One begun inside another keeps the outer
        one's start: the stretch lasts until the outer one ends, and its bound is the
        largest of their kinds' (the watch's)."""
        stretches = self.stretches
        if kind is None:
            if not stretches:
                return False
            stretches.pop()
        elif stretches and stretches[-1] is kind:
            return False  # already in it (a wait inside a save, a pause begun twice)
        else:
            stretches.append(kind)
        if len(stretches) == (0 if kind is None else 1):  # the outermost began or ended
            self.since = _monotonic()
        self.stretch = _stretch_code(stretches)
        self.flags = self.flags | PAUSED if stretches else self.flags & ~PAUSED
        self.write()
        return True

    def resume(self, held: int, by: str) -> bool:
        """The steps done before this attempt stand at ``held`` after the steps counted so
        far (seen as ``by``): the count goes on from there and is the job's. Only the first
        evidence counts; whether this one did (a count below the steps counted since the
        attempt began is none: the script's numbers went back)."""
        if self.resumed_by or held < self.count:
            return False
        self.base = self.resumed = held - self.count
        self.resumed_by = RESUMED_BY.index(by) + 1
        self.flags |= JOB_STEPS
        if self.count:
            self.step = held
        self.write()
        return True

    def counting_beats(self) -> None:
        """The script reports its own steps (``beat``): the optimizer hook stays quiet
        from now on, and the optimizer's step count, if it was taken for the resume point,
        is in steps that are no longer the ones counted (a loop may beat per micro-batch):
        it is dropped. Runs once, at the first beat."""
        self.explicit = True
        _drop_look()
        if self.resumed_by == RESUMED_BY.index(BY_OPTIMIZER) + 1:
            self.base, self.resumed, self.resumed_by = 0, -1, 0
            self.flags &= ~JOB_STEPS
            self.step = self.count if self.count else -1
            self.write()

    def steps_done(self, env: Mapping[str, str]) -> int | None:
        """The steps done, when that is a count in the job's steps: its resume point was
        seen, or this is the job's very first attempt (``env``: the worker's); None when
        not, or when nothing was counted (a script that reports no steps)."""
        if not self.count:
            return None
        return self.step if self.resumed_by or first_attempt(env) else None

    def report(self, total: int | None, metrics: Mapping[str, object]) -> None:
        """The run's length and the script's latest metrics (see ``report``): the length
        into the map, the metrics into their own file at most every METRICS_EVERY_S."""
        if total is not None and total != self.total:
            self.total = _whole(total)
            self.write()
        if not metrics:
            return
        for key, value in metrics.items():
            self.metrics[key] = _number(key, value)
        self.pending = True
        now = _monotonic()
        if now - self.metrics_written >= METRICS_EVERY_S:
            self.write_metrics(now)

    def write_metrics(self, now: float) -> None:
        self.metrics_written, self.pending = now, False
        # Metrics are worth less than the run: a failed write waits for the next report.
        with contextlib.suppress(OSError):
            write_bytes_atomic(Path(self.metrics_path), json.dumps(self.metrics).encode())

    def beat(self, step: int | None) -> None:
        now = _monotonic()
        count = self.count
        if count:
            interval = now - self.last
            if interval > self.slowest:
                self.slowest = interval
        else:
            self.first = now
        self.count = count = count + 1
        self.last = now
        # Steps done: counted, or the script's index of the step just done, plus one.
        self.step = self.base + count if step is None else step + 1
        mapped = self._map
        self.seq = seq = self.seq + 1
        _SEQ_PACK(mapped, _SEQ_AT, seq)
        _SEQ_PACK(mapped, _TAIL_AT, seq)
        _PACK(
            mapped,
            _HEAD_AT,
            self.flags,
            count,
            self.step,
            self.first,
            now,
            self.slowest,
            self.pid,
            self.total,
        )
        self.seq = seq = seq + 1
        _SEQ_PACK(mapped, _TAIL_AT, seq)
        _SEQ_PACK(mapped, _SEQ_AT, seq)
        if self.pending and now - self.metrics_written >= METRICS_EVERY_S:
            self.write_metrics(now)  # the last report's, held back by the rate


def _stretch_code(stretches: Sequence[Stretch]) -> int:
    """The board's code of the stretches open (outermost first): the outermost's code,
    and above the low byte one bit per kind open. Pure."""
    if not stretches:
        return 0
    return stretches[0].value | sum(1 << (8 + kind.value) for kind in set(stretches))


# The script's metrics reach its file at most this often (each write is a small file).
METRICS_EVERY_S = 1.0


def metrics_path(progress_file: str) -> str:
    """Where a worker's metrics are, next to its progress file."""
    return progress_file + ".metrics.json"


def _whole(total: object) -> int:
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError(
            f"hpclaunch.progress: total={total!r} is not a step count; pass the number of "
            "steps the run is to take (an int, 0 or more)"
        )
    return total


def _number(key: str, value: object) -> float:
    """A number, or what ``float()`` takes (a CUDA tensor would wait for the GPU)."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(
            f"hpclaunch.progress: metric {key}={value!r} is not a number; pass "
            "a float (for a tensor, its .item())"
        ) from None


_board: _Board | None = None
_opened = False


def beat(step: int | None = None, total: int | None = None, **metrics: float) -> None:
    """Report one step, in a loop that steps no torch optimizer (those count by
    themselves); ``step``: the script's index of the step just done, from 0 (status counts
    ``step + 1`` done); ``total``, ``metrics``: see ``report``. A no-op outside a job."""
    board = _board if _opened else _open(os.environ)
    if board is not None:
        if not board.explicit:
            board.counting_beats()
        if step is not None:
            board.flags |= JOB_STEPS
        board.beat(step)
        if step is not None and not board.resumed_by:
            # The first numbered beat: the script's numbers say where the attempt began.
            board.resume(step + 1, BY_SCRIPT)
        if total is not None or metrics:
            board.report(total, metrics)


def report(
    total: int | None = None, metrics: Mapping[str, float] | None = None, **named: float
) -> None:
    """Tell ``hpclaunch status`` the run's length in steps (``total``: step out of how
    many, ETA) and the script's latest metrics (numbers, by name, in ``metrics`` or as
    keywords), counting no step. Cheap at every step: metrics are written at most once a
    second. A no-op outside a job.

        hpclaunch.progress.report(total=len(loader) * epochs)   # once
        hpclaunch.progress.report(loss=loss.item(), lr=scheduler.get_last_lr()[0])
    """
    board = _board if _opened else _open(os.environ)
    if board is not None:
        board.report(total, {**(metrics or {}), **named})


_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def pausing(kind: Stretch) -> Callable[[_Fn], _Fn]:
    """A decorator: the function run in the stretch ``kind`` (hpclaunch.checkpoint's save
    and load are in SAVE and LOAD): ``@pausing(SAVE)``. Raises TypeError for any other
    ``kind`` (``@pausing`` alone would make a function that runs nothing)."""
    _check_kind("pausing", kind)

    def wrap(fn: _Fn) -> _Fn:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with paused(kind):
                return fn(*args, **kwargs)

        return cast(_Fn, run)

    return wrap


def _check_kind(name: str, kind: object) -> None:
    if not isinstance(kind, Stretch):
        bare = callable(kind)  # ``@pausing`` with no stretch: kind is the function
        how = " (write @pausing(hpclaunch.progress.SAVE), with its stretch)" if bare else ""
        raise TypeError(
            f"hpclaunch.progress.{name}: kind={kind!r} is no hpclaunch.progress.Stretch; pass "
            f"one of {', '.join(f'hpclaunch.progress.{k.name}' for k in Stretch)}{how}"
        )


@contextlib.contextmanager
def paused(kind: Stretch = PAUSE) -> Iterator[None]:
    """A stretch between steps that may outlast the hang timeout (an evaluation, an export):
    the agent judges it by its own bound (``--pause-timeout``, an hour by default) instead
    of the time since the last step. hpclaunch.checkpoint wraps its saves and loads in it
    (their bound: ``--checkpoint-timeout``). Inside another stretch, it lasts as long as
    the outer one, and the larger of their bounds holds.

        with hpclaunch.progress.paused():
            evaluate(model)
    """
    if not set_paused(True, kind):  # no board: outside a job
        yield
        return
    try:
        yield
    finally:
        set_paused(False)


def set_paused(on: bool, kind: Stretch = PAUSE) -> bool:
    """Begin (``on``) the stretch ``kind`` or end the one begun (see ``paused``), for code
    whose pause begins and ends in two calls (a framework's callbacks); whether that
    changed anything: end only a stretch whose begin returned True. Raises TypeError for a
    ``kind`` that is no Stretch."""
    _check_kind("set_paused", kind)
    board = _board if _opened else _open(os.environ)
    if board is None:
        return False
    return board.set_stretch(kind if on else None)


def resumed_from(step: int | None = None, *, held: int | None = None, by: str = BY_SCRIPT) -> None:
    """The script resumed from the checkpoint of ``step`` (the index of the last step
    it holds, from 0: it holds ``step + 1`` steps), or from one that holds ``held`` steps
    (a count, where the checkpoint's label is not one: an epoch): the steps counted go on
    from there, as the script's own numbers do, and status knows where this attempt
    resumed. ``by``: how that was seen, one of RESUMED_BY (hpclaunch.checkpoint passes
    "checkpoint"; a script's own call is "script"). Only the first evidence in an attempt
    counts (a later call changes nothing). A no-op outside a job. Raises ValueError for
    a negative count, neither ``step`` nor ``held``, or an unknown ``by``."""
    if held is None:
        if step is None:
            raise ValueError("hpclaunch.progress.resumed_from: pass step= or held=")
        held = step + 1
    if isinstance(held, bool) or not isinstance(held, int) or held < 0:
        raise ValueError(
            f"hpclaunch.progress.resumed_from: the checkpoint holds {held!r} steps, which is "
            "not a step count; pass step= (the index of its last step, from 0) or held= "
            "(the steps it holds, 0 or more)"
        )
    if by not in RESUMED_BY:
        raise ValueError(
            f"hpclaunch.progress.resumed_from: by={by!r} is none of {', '.join(RESUMED_BY)}"
        )
    board = _board if _opened else _open(os.environ)
    if board is not None:
        board.resume(held, by)


def steps_done(env: Mapping[str, str] = os.environ) -> int | None:
    """The steps this worker has done, in the job's count (hpclaunch.checkpoint records
    it with each save): None outside a job, before the first step, and when the count
    is not the job's (an attempt after the first whose resume point was not seen)."""
    board = _board if _opened else _open(os.environ)
    return None if board is None else board.steps_done(env)


def first_attempt(env: Mapping[str, str]) -> bool:
    """Whether ``env`` is a worker's of the job's very first attempt (no requeue, no
    in-place restart yet), whose steps are the job's from 0. Pure."""
    return all(env.get(name, "0").strip() in ("", "0") for name in (REQUEUE_COUNT, ATTEMPT))


def _open(env: Mapping[str, str]) -> _Board | None:
    global _board, _opened
    _opened = True
    path = env.get(PROGRESS_FILE)
    if path:
        try:
            _board = _Board(path)
        except OSError as exc:  # progress is worth less than the run
            print(f"hpclaunch.progress: cannot report progress to {path}: {exc}", file=sys.stderr)
    return _board


def install(env: Mapping[str, str]) -> None:
    """In a worker, before its script runs: count optimizer steps, and dump the stacks on
    ``stack_signal()`` into ``HPCLAUNCH_STACKS_FILE``. Nothing without the variables."""
    board = _open(env)
    if board is None:
        return
    _allow_reading(env)
    stacks = env.get(STACKS_FILE)
    if stacks and _dump_stacks_on_signal(stacks):
        board.flags |= STACKS_ON_SIGNAL
        board.write()
    if _OPTIMIZER_MODULE in sys.modules:
        _hook(sys.modules[_OPTIMIZER_MODULE])
    else:
        sys.meta_path.insert(0, _HookOnImport())


def _allow_reading(env: Mapping[str, str]) -> None:
    """Let the agent's py-spy read this process where Yama allows only ancestors to
    (``ptrace_scope`` 1): the agent, and what it starts, may."""
    agent = env.get(WATCHER_PID, "")
    if agent.isdigit():
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, int(agent), 0, 0, 0)


_stacks_file: IO[str] | None = None


def _dump_stacks_on_signal(path: str) -> bool:
    global _stacks_file
    try:
        _stacks_file = open(path, "a")  # noqa: SIM115 - open for the process's life
        faulthandler.register(stack_signal(), file=_stacks_file, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return False
    return True


_counted: list[weakref.ref[object]] = []  # the optimizer whose steps count
_look: list[Any] = []  # the handle of the pre-hook that looks at the optimizer's state
_monotonic = time.monotonic


def _after_optimizer_step(optimizer: object, args: object, kwargs: object) -> None:
    """One step of the first optimizer stepped (a GAN's second one, or the inner
    optimizer of a wrapper, steps in the same training step); none once the script
    reports its own steps with beat()."""
    board = _board
    if board is None or board.explicit:
        return
    if _state_init(kwargs):
        _made_by_init(optimizer)
        return
    counted = _counted[0]() if _counted else None
    if counted is None:
        _counted[:] = [weakref.ref(optimizer)]
        counted = optimizer
        # The look before this first step is done: its hook goes, so that it costs no
        # step after it. Not from the pre-hook itself: torch is iterating its table.
        _drop_look()
    if counted is optimizer:
        board.beat(None)


def _before_first_step(optimizer: object, args: object, kwargs: object) -> None:
    """Before the first optimizer step (of the first optimizer stepped, the one whose
    steps count): the step count in the state the script restored, if any, is where this
    attempt resumed. ``_after_optimizer_step`` removes this hook right after that step."""
    board = _board
    if board is None or board.explicit or board.resumed_by or board.count or _state_init(kwargs):
        return
    if optimizer in _init_state:  # its count is the init's, no steps taken before
        return
    held = optimizer_steps(optimizer)
    if held is not None:
        board.resume(held, BY_OPTIMIZER)


# torch.distributed.checkpoint.state_dict's function that gives a fresh optimizer its state
# by stepping it with zero gradients at lr 0 (get_state_dict and set_state_dict call it):
# no training step, so neither counted nor looked at.
_STATE_INIT = "_init_optim_state"
_STATE_INIT_DEPTH = 6  # frames up from the hook: torch's step wrapper, an LR scheduler's


# The optimizers whose state torch's initialisation made, with nothing loaded into them
# since: the step count in it (Adam's 1) is no evidence of steps taken.
_init_state: weakref.WeakSet[Any] = weakref.WeakSet()


def _made_by_init(optimizer: Any) -> None:
    """Mark ``optimizer``'s state as the initialisation's, until state is loaded into it
    (its ``load_state_dict``, which torch's ``set_state_dict`` calls, unmarks it)."""
    if optimizer in _init_state:
        return
    register = getattr(optimizer, "register_load_state_dict_post_hook", None)
    if register is None:  # cannot tell when state is loaded: look at the count as before
        return
    _init_state.add(optimizer)
    register(_loaded_into)


def _loaded_into(optimizer: Any) -> None:
    _init_state.discard(optimizer)


def _state_init(kwargs: object) -> bool:
    """Whether this optimizer step is torch's state initialisation, not training. It
    calls ``step(closure=None)``; only such a call has its callers looked at, so that
    a training step costs a dict lookup."""
    if not isinstance(kwargs, Mapping) or "closure" not in kwargs or kwargs["closure"] is not None:
        return False
    frame: FrameType | None = sys._getframe(2)  # above this and the hook: torch's wrapper
    for _ in range(_STATE_INIT_DEPTH):
        if frame is None:
            return False
        if frame.f_code.co_name == _STATE_INIT:
            return True
        frame = frame.f_back
    return False


def optimizer_steps(optimizer: Any) -> int | None:
    """The steps an optimizer has taken, as its state says: the ``step`` that Adam, AdamW
    and their family (Adagrad, RMSprop, ...) keep for each parameter (a tensor or a
    number), when every parameter's state has one and they agree on a value above 0.
    None is no evidence, never "from 0": no state (a fresh optimizer, or a script that
    restored only the model), state without ``step`` (SGD's momentum), or disagreeing
    counts. An LR scheduler's position is not looked at: a scheduler may step once per
    epoch, and a number of epochs is not a number of steps."""
    found: set[float] = set()
    for state in getattr(optimizer, "state", {}).values():
        step = state.get("step") if isinstance(state, Mapping) else None
        if step is None:
            return None
        try:
            found.add(float(step))  # a tensor's .item(); on a GPU, once per attempt
        except (TypeError, ValueError, RuntimeError):
            return None
        if len(found) > 1:
            return None
    if len(found) != 1:
        return None
    (value,) = found
    # Adam's count is a float32 tensor: exact up to 2**24 steps, the nearest one above.
    return int(value) if value > 0 and value.is_integer() else None


def _drop_look() -> None:
    """Remove the pre-hook of the one look at the optimizer state (it is done, or the
    script reports its own steps)."""
    while _look:
        _look.pop().remove()


def _hook(module: ModuleType) -> None:
    module.register_optimizer_step_post_hook(_after_optimizer_step)
    _look.append(module.register_optimizer_step_pre_hook(_before_first_step))


class _HookOnImport(importlib.abc.MetaPathFinder):
    """Registers the optimizer-step hook once torch's optimizer module has loaded."""

    def __init__(self) -> None:
        self._done = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _OPTIMIZER_MODULE or self._done:
            return None
        self._done = True
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _hook(module)

        loader.exec_module = exec_module
        return spec


def read(path: str) -> Progress | None:
    """A worker's progress from its file (for the agent); None before it wrote any, and
    when every one of a few reads caught it half-written (no news, not no progress)."""
    for _ in range(_READ_TRIES):
        try:
            with open(path, "rb") as file:
                data = file.read(_LAYOUT.size)
        except OSError:
            return None
        if len(data) < _LAYOUT.size:
            return None
        if not torn(data):
            return parse(data)
    return None


def torn(data: bytes) -> bool:
    """Whether a board's bytes were read halfway through a write: its write counts differ
    or one is under way, or it says what no whole write says (a count without its times,
    a stretch without its start). Pure."""
    fields = _LAYOUT.unpack(data[: _LAYOUT.size])
    magic, seq, count, first, last = fields[0], fields[1], fields[3], fields[5], fields[6]
    kind, since, tail = fields[12], fields[13], fields[14]
    if magic != _MAGIC:
        return False  # no board of this layout: nothing to retry
    half = (count and not last >= first > 0) or (kind and not since > 0)
    # A count of 0: the board's first write has not ended (the file is still zeroes).
    return seq != tail or seq % 2 == 1 or seq == 0 or bool(half)


def parse(data: bytes) -> Progress | None:
    """The progress in a whole board's bytes (see ``torn``); None when they hold none
    (not written yet, another layout). Pure."""
    fields = _LAYOUT.unpack(data[: _LAYOUT.size])
    magic, _, flags, count, step, first, last, slowest, pid, total = fields[:10]
    resumed, by, kind, since, _ = fields[10:]
    if magic != _MAGIC:
        return None
    seen = 0 < by <= len(RESUMED_BY) and resumed >= 0
    return Progress(
        count,
        step,
        first,
        last,
        slowest,
        bool(flags & STACKS_ON_SIGNAL),
        stretch=Stretch(kind & 0xFF) if 0 < kind & 0xFF <= len(Stretch) else None,
        within=frozenset(k for k in Stretch if kind >> (8 + k.value) & 1),
        pid=pid,
        total=total if total >= 0 else None,
        job_steps=bool(flags & JOB_STEPS),
        resumed=resumed if seen else None,
        resumed_by=RESUMED_BY[by - 1] if seen else None,
        since=since,
    )


def read_metrics(progress_file: str) -> dict[str, float]:
    """A worker's latest metrics (see ``report``); empty when it reported none."""
    try:
        data = json.loads(Path(metrics_path(progress_file)).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}
