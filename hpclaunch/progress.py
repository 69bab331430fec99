"""Training progress, from each worker to its node's agent, with no change to the script.

Every completed optimizer step counts (torch's global optimizer-step hook, installed in
every worker before the script runs); a loop without a torch optimizer calls ``beat()``
(optionally with its own step number) once per step. Each worker writes its count and
times into a small file in node memory that only its node's agent reads
(``HPCLAUNCH_PROGRESS_FILE``): nothing goes over the network per step. The agent uses
it to notice a hang (hpclaunch.node.hangs) and for status; ``report`` adds the run's
length and the script's metrics.

``install`` also registers a handler that writes every thread's Python stack to
``HPCLAUNCH_STACKS_FILE`` on ``stack_signal()``, a real-time signal that no scheduler
or framework sends (the preemption signals TERM, INT, HUP, QUIT, USR1, USR2 stay the
script's). This module imports no torch: the hook is registered when the script
imports torch's optimizers, or at once if it has.
"""

from __future__ import annotations

import contextlib
import ctypes
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
from types import ModuleType
from typing import IO, Any, TypeVar, cast

from hpclaunch.jobdir.atomic import write_bytes_atomic
from hpclaunch.node.worker_env import PROGRESS_FILE as PROGRESS_FILE
from hpclaunch.node.worker_env import STACKS_FILE as STACKS_FILE
from hpclaunch.node.worker_env import WATCHER_PID as WATCHER_PID

# magic, flags, progress count, the script's step (-1: none given), first and last
# progress (CLOCK_MONOTONIC, the same for every process of the node), slowest interval,
# the pid of the process that writes the file, the steps the run is to take (-1: unknown).
_LAYOUT = struct.Struct("<4sIqqdddqq")
_MAGIC = b"HPCp"
STACKS_ON_SIGNAL = 1  # flag: the writer dumps its stacks on stack_signal()
PAUSED = 2  # flag: the script said a pause between steps has begun (see paused())
JOB_STEPS = 4  # flag: the steps are the job's (resumed_from, or the script's own numbers)
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
    paused: bool = False
    pid: int = 0  # the process that writes it
    total: int | None = None  # the steps the run is to take, when the script said
    job_steps: bool = False  # ``step`` counts on from a resumed checkpoint (or is the script's)

    @property
    def steps_per_s(self) -> float | None:
        span = self.last - self.first
        return (self.count - 1) / span if self.count > 1 and span > 0 else None


_PACK = _LAYOUT.pack_into


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
        "slowest",
        "step",
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
        self.metrics: dict[str, float] = {}
        self.metrics_path = metrics_path(path)
        self.metrics_written = -METRICS_EVERY_S
        self.pending = False  # metrics reported since the last write (the next beat writes)
        self.write()

    def write(self) -> None:
        _PACK(
            self._map,
            0,
            _MAGIC,
            self.flags,
            self.count,
            self.step,
            self.first,
            self.last,
            self.slowest,
            self.pid,
            self.total,
        )

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
        _PACK(
            self._map,
            0,
            _MAGIC,
            self.flags,
            count,
            self.step,
            self.first,
            now,
            self.slowest,
            self.pid,
            self.total,
        )
        if self.pending and now - self.metrics_written >= METRICS_EVERY_S:
            self.write_metrics(now)  # the last report's, held back by the rate


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
        board.explicit = True
        if step is not None:
            board.flags |= JOB_STEPS
        board.beat(step)
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


def pausing(fn: _Fn) -> _Fn:
    """``fn`` run in ``paused()`` (hpclaunch.checkpoint's save and load)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with paused():
            return fn(*args, **kwargs)

    return cast(_Fn, run)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """A stretch between steps that may outlast the hang timeout (an evaluation, an export):
    the agent does not take it for a hang, unless a worker is stopped. hpclaunch.checkpoint
    wraps its saves and loads in it.

        with hpclaunch.progress.paused():
            evaluate(model)
    """
    if not set_paused(True):  # nested: the outer one ends it
        yield
        return
    try:
        yield
    finally:
        set_paused(False)


def set_paused(on: bool) -> bool:
    """Begin (``on``) or end a pause (see ``paused``), for code whose pause begins and
    ends in two calls (a framework's callbacks); whether that changed anything."""
    board = _board if _opened else _open(os.environ)
    if board is None or bool(board.flags & PAUSED) == on:
        return False
    board.flags = board.flags | PAUSED if on else board.flags & ~PAUSED
    board.write()
    return True


def resumed_from(step: int) -> None:
    """The script resumed from the checkpoint of ``step`` (hpclaunch.checkpoint calls
    this): the steps counted go on from there, as the script's own numbers do."""
    board = _board if _opened else _open(os.environ)
    if board is not None:
        board.base = step + 1 - board.count
        board.flags |= JOB_STEPS
        board.write()


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
_monotonic = time.monotonic


def _after_optimizer_step(optimizer: object, args: object, kwargs: object) -> None:
    """One step of the first optimizer stepped (a GAN's second one, or the inner
    optimizer of a wrapper, steps in the same training step); none once the script
    reports its own steps with beat()."""
    board = _board
    if board is None or board.explicit:
        return
    counted = _counted[0]() if _counted else None
    if counted is None:
        _counted[:] = [weakref.ref(optimizer)]
        counted = optimizer
    if counted is optimizer:
        board.beat(None)


def _hook(module: ModuleType) -> None:
    module.register_optimizer_step_post_hook(_after_optimizer_step)


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
    """A worker's progress from its file (for the agent); None before it wrote any."""
    try:
        with open(path, "rb") as file:
            data = file.read(_LAYOUT.size)
    except OSError:
        return None
    if len(data) < _LAYOUT.size:
        return None
    magic, flags, count, step, first, last, slowest, pid, total = _LAYOUT.unpack(data)
    if magic != _MAGIC or (count and not last >= first > 0):  # not written, or half
        return None
    return Progress(
        count,
        step,
        first,
        last,
        slowest,
        bool(flags & STACKS_ON_SIGNAL),
        bool(flags & PAUSED),
        pid,
        total if total >= 0 else None,
        bool(flags & JOB_STEPS),
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
