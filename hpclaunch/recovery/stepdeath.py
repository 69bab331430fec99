"""Agents that died by a signal (the OOM killer, a segfault, an administrator's
``kill -9``), and the srun under the supervisor killed the same way: a node fault
the failure records cannot show, as a dead agent writes none.

srun says which node's task died, on its stderr, one line per node::

    srun: error: n2: task 1: Killed
    srun: error: n3: tasks 2-3: Segmentation fault (core dumped)

(a task that exited by itself is "Exited with exit code N" instead). Only the deaths
srun reports before it begins to end the step count: once one task has exited with an
error, srun terminates the others (``--kill-on-bad-exit``), and SLURM's own SIGTERM and
SIGKILL to them are no node's fault. SLURM keeps no
other trace of it without accounting (``sacct``), and ``scontrol show step`` forgets
the step as soon as it ends, so the supervisor passes srun's stderr on to the batch
log line by line (``Tee``) and keeps these lines.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from hpclaunch.jobdir.unwritten import how
from hpclaunch.recovery.noise import Noise

_TASK_DIED = re.compile(r"^srun: error: (?P<node>[^\s:]+): tasks? [\d,\-]+: (?P<what>.+?)\s*$")
_EXITED = "Exited with exit code"
# srun's lines once it ends the step: the deaths after them are SLURM's doing.
_STEP_ENDING = re.compile(
    r"^srun: (launch/slurm: _step_signal: Terminating|Force Terminated|Job step aborted)"
)
# strsignal's words (as srun prints them) → the signal's name.
_NAMES = {signal.strsignal(s) or s.name: s.name for s in signal.Signals}
_JOIN_S = 5.0  # for srun's stderr to reach its end once srun has exited


@dataclass(frozen=True)
class Death:
    node: str
    signal: str  # SIGKILL, SIGSEGV ... (srun's words when they name no signal)


def deaths(lines: Iterable[str]) -> tuple[Death, ...]:
    """The nodes whose agent srun reports killed by a signal before it began to end
    the step, in order, each once."""
    found: dict[str, str] = {}
    for line in lines:
        if _STEP_ENDING.match(line):
            break
        match = _TASK_DIED.match(line)
        if match is None:
            continue
        if match["what"].startswith(_EXITED):
            break
        what = match["what"].removesuffix(" (core dumped)")
        found.setdefault(match["node"], _NAMES.get(what, what))
    return tuple(Death(node, sig) for node, sig in found.items())


def describe(died: tuple[Death, ...], srun_signal: int | None) -> str:
    """The history's error for the run: which agents died, or that srun did."""
    if died:
        return "; ".join(f"the agent on {d.node} was killed by {d.signal}" for d in died)
    name = signal.Signals(srun_signal).name if srun_signal else "a signal"
    return f"srun (the job step, on the batch host) was killed by {name}"


@dataclass
class Tee:
    """Copies a pipe (srun's stderr) to this process's stderr as it comes, keeping
    srun's own lines (a task's death, the step's end). torch's known-harmless lines
    (hpclaunch.recovery.noise) go to ``raw`` instead, when given, to be summarised."""

    source: IO[bytes]
    raw: Path | None = None
    kept: list[str] = field(default_factory=list)
    noise: Noise = field(default_factory=Noise)
    refused: OSError | None = None  # what the job folder said to the noise file, if it did
    _thread: threading.Thread | None = None

    def start(self) -> Tee:
        self._thread = threading.Thread(target=self._copy, name="srun-stderr", daemon=True)
        self._thread.start()
        return self

    def _copy(self) -> None:
        out = sys.stderr.buffer
        raw: IO[bytes] | None = None
        try:
            for line in iter(self.source.readline, b""):
                if self.raw is not None and self.noise.take(line.decode(errors="replace")):
                    # Once the job folder refused the file, its lines are only counted.
                    raw = raw or (None if self.refused else _open(self.raw))
                    if raw is not None:
                        self.refused = _wrote(raw, line)
                        raw = None if self.refused else raw
                    continue
                out.write(line)
                out.flush()
                if line.startswith(b"srun: "):
                    self.kept.append(line.decode(errors="replace"))
        finally:
            self.source.close()
            if raw is not None:
                self.refused = _wrote(raw, None)

    def summary(self) -> list[str]:
        """What the noise taken out amounts to (once the copy has ended: ``deaths``)."""
        if self.raw is None:
            return []
        if self.refused is not None:
            return self.noise.summary(f"{self.raw} (which refused them: {how(self.refused)})")
        return self.noise.summary(str(self.raw))

    def deaths(self) -> tuple[Death, ...]:
        """The deaths srun reported (waits for the end of its stderr, a while)."""
        if self._thread is not None:
            self._thread.join(_JOIN_S)
        return deaths(list(self.kept))


def _wrote(raw: IO[bytes], line: bytes | None) -> OSError | None:
    """``line`` appended to the noise file (None: the file closed); the error, with the
    file closed, when the job folder refused it: the copy of srun's stderr must go on."""
    try:
        if line is None:
            raw.close()
        else:
            raw.write(line)
        return None
    except OSError as exc:
        with contextlib.suppress(OSError):  # the buffer it could not flush is lost with it
            raw.close()
        return exc


def _open(path: Path) -> IO[bytes] | None:
    """The noise file, appended to; None (the lines are dropped, the counts kept) when
    the job folder cannot be written, which the supervisor reports elsewhere."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("ab")
    except OSError:
        return None
