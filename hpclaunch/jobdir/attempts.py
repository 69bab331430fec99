"""When each attempt of the worker group began, stepped first, stepped on and ended, per
node: what the goodput split and the lost work need that the progress notes do not keep
(``progress/requeue-Q/node-HOST.json`` holds only the latest attempt). No torch.

    progress/requeue-Q/attempts-node-HOST.jsonl    one line per event (``AttemptEvent``)

A node's hang watch (hpclaunch.node.hangs) appends a line when an attempt's workers
are about to start (``begin``), when it first sees one of their steps (``first``: the
wall time and step of the node's first step, and the step the attempt resumed from when a
worker saw it), at each progress note (``step``: the node's lowest step and when it was
done), when a stop signal comes (``stop``: the node's last step then), and when the
group ends (``end``: the time, and the node's last step and its time). A node that is
lost writes no ``end``; a survivor that SLURM kills first, only its ``stop``.
``hpclaunch.record`` reads the log.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from hpclaunch.jobdir import typed
from hpclaunch.jobdir.atomic import append_line
from hpclaunch.jobdir.layout import JobFolder

BEGIN = "begin"
FIRST = "first"
# A sample of the node's progress (its lowest rank's step and when it was done), one per
# progress note: when the run passed a step, for the lost part of the goodput.
STEP = "step"
# A stop signal came (the agent's shutdown): the node's last step then, before the agent
# waits for its workers; SLURM may kill the agent before it can log the ``end``.
STOP = "stop"
END = "end"
EVENTS = (BEGIN, FIRST, STEP, STOP, END)
PREFIX, SUFFIX = "attempts-node-", ".jsonl"


@dataclass(frozen=True)
class AttemptEvent:
    node: str
    attempt: int
    event: str  # one of EVENTS
    time: float  # wall clock: the start, the first step, a step, or the group's end
    # FIRST: the first step; STEP: the node's lowest step; END: the last (the lowest rank's)
    step: int | None = None
    step_time: float | None = None  # END: when the last step was done (wall clock)
    # FIRST: the steps done before the attempt's first step, in the job's count, and how a
    # worker saw that (hpclaunch.jobdir.progress_notes.RESUMED_BY); None: not seen.
    resumed: int | None = None
    resumed_by: str | None = None
    # The node's rank in the job (host names change across requeues; the hang watch arms
    # an attempt's first step on a node whose rank stepped before). None: an older log.
    node_rank: int | None = None


def path(job: JobFolder, requeue: int, node: str) -> Path:
    return job.progress(requeue) / f"{PREFIX}{node}{SUFFIX}"


def is_log(name: str) -> bool:
    """Whether ``name`` (in ``progress/requeue-Q/``) is a node's attempts log."""
    return name.startswith(PREFIX) and name.endswith(SUFFIX)


def append(job: JobFolder, requeue: int, event: AttemptEvent) -> None:
    """One line, appended in one write. Raises OSError."""
    target = path(job, requeue, event.node)
    target.parent.mkdir(parents=True, exist_ok=True)
    append_line(target, json.dumps(asdict(event), sort_keys=True) + "\n")


def parse(lines: Iterable[str]) -> list[AttemptEvent]:
    """The events among ``lines`` (JSON objects); torn or foreign lines are skipped. Pure."""
    out = []
    for line in lines:
        try:
            event = typed.load(AttemptEvent, json.loads(line))
        except ValueError:
            continue
        if event.event in EVENTS:
            out.append(event)
    return out


def highest(job: JobFolder, requeue: int) -> int | None:
    """The highest attempt any node's attempts log of run ``requeue`` names; None when
    none does (or none can be read now)."""
    found: list[int] = []
    try:
        logs = [entry for entry in os.scandir(job.progress(requeue)) if is_log(entry.name)]
    except OSError:
        return None
    for entry in logs:
        try:
            with open(entry.path, encoding="utf-8", errors="replace") as log:
                found += [event.attempt for event in parse(log)]
        except OSError:
            continue
    return max(found, default=None)
