"""When each attempt of the worker group began, stepped first and ended, per node: what
the goodput split (hpclaunch.jobdir.goodput) needs that the progress notes do not keep
(``progress/requeue-Q/node-HOST.json`` holds only the latest attempt). No torch.

    progress/requeue-Q/attempts-node-HOST.jsonl    one line per event (``AttemptEvent``)

A node's hang watch (hpclaunch.node.hangs) appends a line when an attempt's workers
are about to start (``begin``), when it first sees one of their steps (``first``: the
wall time and step of the node's first step), and when the group ends (``end``: the
time, and the node's last step and its time). A node that is lost writes no ``end``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from hpclaunch.jobdir.atomic import append_line
from hpclaunch.jobdir.layout import JobFolder

BEGIN = "begin"
FIRST = "first"
END = "end"
# A sample of the node's progress (its lowest rank's step and when it was done), one per
# progress note: when the run passed a step, for the lost part of the goodput.
STEP = "step"


@dataclass(frozen=True)
class AttemptEvent:
    node: str
    attempt: int
    event: str  # BEGIN, FIRST, STEP or END
    time: float  # wall clock: the start, the first step, or the group's end
    step: int | None = None  # FIRST: the first step; END: the last (the node's lowest rank's)
    step_time: float | None = None  # END: when the last step was done (wall clock)


def path(job: JobFolder, requeue: int, node: str) -> Path:
    return job.progress(requeue) / f"attempts-node-{node}.jsonl"


def append(job: JobFolder, requeue: int, event: AttemptEvent) -> None:
    """One line, appended in one write. Raises OSError."""
    target = path(job, requeue, event.node)
    target.parent.mkdir(parents=True, exist_ok=True)
    append_line(target, json.dumps(asdict(event), sort_keys=True) + "\n")


def read(job: JobFolder, requeue: int) -> list[AttemptEvent]:
    """Every node's events of one run, oldest first; torn or foreign lines skipped."""
    out: list[AttemptEvent] = []
    for found in sorted(job.progress(requeue).glob("attempts-node-*.jsonl")):
        try:
            text = found.read_text(errors="replace")
        except OSError:
            continue
        out += parse(text.splitlines())
    return sorted(out, key=lambda e: (e.attempt, e.time))


def parse(lines: Iterable[str]) -> list[AttemptEvent]:
    """The events among ``lines`` (JSON objects); the others are skipped. Pure."""
    out = []
    for line in lines:
        try:
            event = AttemptEvent(**json.loads(line))
        except (ValueError, TypeError):
            continue
        if event.event in (BEGIN, FIRST, STEP, END):
            out.append(event)
    return out
