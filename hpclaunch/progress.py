"""Training progress, from each worker to its node's agent, with no change to the script.

Every completed optimizer step counts (torch's global optimizer-step hook, installed in
every worker before the script runs); a loop without a torch optimizer calls ``beat()``
(optionally with its own step number) once per step. Each worker writes its count and
times into a small file in node memory that only its node's agent reads
(``HPCLAUNCH_PROGRESS_FILE``): nothing goes over the network per step. The agent uses
it to notice a hang (hpclaunch.node.hangs) and to report steps per second.

``install`` also registers a handler that writes every thread's Python stack to
``HPCLAUNCH_STACKS_FILE`` on ``stack_signal()``, a real-time signal that no scheduler
or framework sends (the preemption signals TERM, INT, HUP, QUIT, USR1, USR2 stay the
script's). This module imports no torch: the hook is registered when the script
imports torch's optimizers, or at once if it has.

    import hpclaunch.progress
    for batch in loader:              # a loop without torch.optim
        ...
        hpclaunch.progress.beat()     # or beat(step=n)
"""

from __future__ import annotations

import faulthandler
import importlib.abc
import importlib.machinery
import json
import mmap
import os
import signal
import struct
import sys
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import IO, Any

from hpclaunch.node.worker_env import PROGRESS_FILE as PROGRESS_FILE
from hpclaunch.node.worker_env import STACKS_FILE as STACKS_FILE

# The fresh workers' boot (hpclaunch/node/progress_boot/sitecustomize.py) rides on
# PYTHONPATH; the value the worker was meant to have is kept here and put back.
SAVED_PYTHONPATH = "HPCLAUNCH_SAVED_PYTHONPATH"
BOOT_FOLDER = os.path.join(os.path.dirname(__file__), "node", "progress_boot")

# magic, flags, progress count, the script's step (-1: none given), first and last
# progress (CLOCK_MONOTONIC, the same for every process of the node), slowest interval.
_LAYOUT = struct.Struct("<4sIqqddd")
_MAGIC = b"HPCp"
STACKS_ON_SIGNAL = 1  # flag: the worker dumps its stacks on stack_signal()
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

    @property
    def steps_per_s(self) -> float | None:
        span = self.last - self.first
        return (self.count - 1) / span if self.count > 1 and span > 0 else None


class _Board:
    """This worker's progress file, mapped: each report is one write into memory."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, _LAYOUT.size)
            self._map = mmap.mmap(fd, _LAYOUT.size)
        finally:
            os.close(fd)
        self.flags = 0
        self.base = 0  # the steps done before this attempt (see resumed_from)
        self.count = 0
        self.step = -1
        self.first = self.last = self.slowest = 0.0
        self.write()

    def write(self) -> None:
        _LAYOUT.pack_into(self._map, 0, _MAGIC, self.flags, self.count, self.step,
                          self.first, self.last, self.slowest)  # fmt: skip

    def beat(self, step: int | None) -> None:
        now = time.monotonic()
        if self.count:
            interval = now - self.last
            if interval > self.slowest:
                self.slowest = interval
        else:
            self.first = now
        self.count += 1
        self.last = now
        self.step = self.base + self.count if step is None else step
        _LAYOUT.pack_into(self._map, 0, _MAGIC, self.flags, self.count, self.step,
                          self.first, now, self.slowest)  # fmt: skip


_board: _Board | None = None
_opened = False


def beat(step: int | None = None) -> None:
    """Report one step of progress (``step``: the script's own step number). Call it once
    per step in a loop that does not step a torch optimizer (those count by themselves).
    Outside a job hpclaunch launched it does nothing."""
    board = _board if _opened else _open(os.environ)
    if board is not None:
        board.beat(step)


def resumed_from(step: int) -> None:
    """The script resumed from the checkpoint of ``step`` (hpclaunch.checkpoint calls
    this): the steps counted go on from there, as the script's own numbers do."""
    board = _board if _opened else _open(os.environ)
    if board is not None:
        board.base = step + 1 - board.count


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
    stacks = env.get(STACKS_FILE)
    if stacks and _dump_stacks_on_signal(stacks):
        board.flags |= STACKS_ON_SIGNAL
        board.write()
    if _OPTIMIZER_MODULE in sys.modules:
        _hook(sys.modules[_OPTIMIZER_MODULE])
    else:
        sys.meta_path.insert(0, _HookOnImport())


_stacks_file: IO[str] | None = None


def _dump_stacks_on_signal(path: str) -> bool:
    global _stacks_file
    try:
        _stacks_file = open(path, "a")  # noqa: SIM115 - open for the process's life
        faulthandler.register(stack_signal(), file=_stacks_file, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return False
    return True


def _after_optimizer_step(optimizer: object, args: object, kwargs: object) -> None:
    if _board is not None:
        _board.beat(None)


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
    magic, flags, count, step, first, last, slowest = _LAYOUT.unpack(data)
    if magic != _MAGIC:
        return None
    return Progress(count, step, first, last, slowest, bool(flags & STACKS_ON_SIGNAL))


def boot_env(env: Mapping[str, str]) -> dict[str, str]:
    """What the agent adds to a worker's environment ``env`` so that a fresh python
    installs progress reporting before the script (the boot folder first on PYTHONPATH,
    the value meant kept in SAVED_PYTHONPATH); ``unboot`` in the worker puts it back."""
    meant = env.get("PYTHONPATH")
    parts = [BOOT_FOLDER, meant] if meant else [BOOT_FOLDER]
    return {"PYTHONPATH": os.pathsep.join(parts), SAVED_PYTHONPATH: json.dumps(meant)}


def unboot(environ: MutableMapping[str, str]) -> None:
    """Give the worker the PYTHONPATH it was meant to have (see ``boot_env``)."""
    saved = environ.pop(SAVED_PYTHONPATH, None)
    if saved is None:
        return
    meant = json.loads(saved)
    if meant is None:
        environ.pop("PYTHONPATH", None)
    else:
        environ["PYTHONPATH"] = meant
