"""What the supervisor's watch (hpclaunch.recovery.watch) reads of a running step, every
few seconds: each node's progress note and end note (small files, read whole), and the
latest event of each node's attempts log, followed from where the last read stopped.

The attempts logs grow with the job (a step sample per node every 10 s: half a million
events for 64 nodes in a day); parsing them whole on every read took seconds at that
size, in the loop that also beats the supervisor's heartbeat, so that the agents would
take a live supervisor for silent. No torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from hpclaunch.jobdir import agent_ends, attempts, progress_notes
from hpclaunch.jobdir.agent_ends import AgentEnd
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.jobdir.progress_notes import NodeProgress

T = TypeVar("T")


@dataclass(frozen=True)
class Notes:
    """One read: the progress notes, each node's latest attempt event (by attempt, then
    time), and the end notes."""

    progress: tuple[NodeProgress, ...]
    latest: dict[str, attempts.AttemptEvent]
    ends: tuple[AgentEnd, ...]


@dataclass
class Follower:
    """Reads run ``requeue``'s notes; the attempts logs only from the last byte read."""

    folder: JobFolder
    requeue: int
    bytes_read: int = 0  # of the attempts logs, all reads together
    _offsets: dict[str, int] = field(default_factory=dict)  # log name -> bytes taken
    _latest: dict[str, attempts.AttemptEvent] = field(default_factory=dict)

    def read(self) -> Notes:
        """Never raises OSError: what cannot be read now is not known yet."""
        progress: list[NodeProgress] = []
        for name, path in _listed(self.folder.progress(self.requeue)):
            if attempts.is_log(name):
                self._follow(name, path)
            elif progress_notes.is_note(name):
                note = _parsed(path, progress_notes.parse)
                if note is not None:
                    progress.append(note)
        ends = [
            end
            for name, path in _listed(self.folder.agents(self.requeue))
            if agent_ends.is_note(name) and (end := _parsed(path, agent_ends.parse)) is not None
        ]
        return Notes(tuple(progress), dict(self._latest), tuple(ends))

    def _follow(self, name: str, path: str) -> None:
        offset = self._offsets.get(name, 0)
        try:
            with open(path, "rb") as log:
                if os.fstat(log.fileno()).st_size < offset:
                    offset = 0  # replaced by a shorter file: read it anew
                log.seek(offset)
                grown = log.read()
        except OSError:
            return
        whole = grown[: grown.rfind(b"\n") + 1]  # a line still being written waits
        self._offsets[name] = offset + len(whole)
        self.bytes_read += len(grown)
        lines = whole.decode("utf-8", errors="replace").splitlines()
        for event in attempts.parse(lines):
            known = self._latest.get(event.node)
            if known is None or (event.attempt, event.time) >= (known.attempt, known.time):
                self._latest[event.node] = event


def _listed(folder: os.PathLike[str] | str) -> list[tuple[str, str]]:
    try:
        with os.scandir(folder) as listing:
            return sorted((entry.name, entry.path) for entry in listing)
    except OSError:  # not made yet, or not readable: nothing of it is known
        return []


def _parsed(path: str, parse: Callable[[str], T]) -> T | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return parse(handle.read())
    except (OSError, ValueError):  # gone, torn (a writer died mid-write) or not ours
        return None
