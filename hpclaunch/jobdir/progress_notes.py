"""Each node's progress note: its ranks' steps, rates and resume points, the run's length
and the script's latest metrics, as its agent last saw them (hpclaunch.node.hangs writes
it every few seconds and once more when the attempt ends). No torch.

    progress/requeue-Q/node-HOST.json    the node's latest note (``NodeProgress``)

A note holds the node's latest attempt only; what earlier attempts did is in the attempts
log (hpclaunch.jobdir.attempts). ``hpclaunch.record`` reads the notes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from hpclaunch.jobdir import typed
from hpclaunch.jobdir.atomic import write_bytes_atomic
from hpclaunch.jobdir.layout import JobFolder

# How a worker saw the step it resumed from: hpclaunch.checkpoint.load_latest, the
# optimizer's own step count in the state the script restored (Adam and its family), the
# script's own step numbers (progress.beat(step=...)), a framework's callback
# (hpclaunch.frameworks.lightning.StopCheckpoint).
RESUMED_BY = ("checkpoint", "optimizer", "script", "lightning")
PREFIX, SUFFIX = "node-", ".json"


@dataclass(frozen=True)
class RankProgress:
    rank: int
    step: int
    steps_per_s: float | None
    slowest_s: float  # the longest time between two of its steps
    idle_s: float  # since its last step, when the note was written
    job_steps: bool = False  # step counts on from the checkpoint it resumed (or is its own)
    # The steps done before this attempt's first step, in the job's count, when the worker
    # saw where it resumed, and how it saw it (one of RESUMED_BY); None: not seen.
    resumed: int | None = None
    resumed_by: str | None = None


@dataclass(frozen=True)
class NodeProgress:
    node: str
    attempt: int
    time: float  # when the note was written (wall clock)
    ranks: tuple[RankProgress, ...] = field(default=())
    total: int | None = None  # the steps the run is to take, as the script said
    metrics: dict[str, float] = field(default_factory=dict)  # its lowest rank's latest
    metrics_rank: int | None = None


def write(job: JobFolder, requeue: int, note: NodeProgress) -> None:
    """Replace the node's progress note. Raises OSError."""
    path = job.progress(requeue) / f"{PREFIX}{note.node}{SUFFIX}"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, (json.dumps(asdict(note)) + "\n").encode())


def is_note(name: str) -> bool:
    """Whether ``name`` (in ``progress/requeue-Q/``) is a node's progress note."""
    return name.startswith(PREFIX) and name.endswith(SUFFIX)


def parse(text: str) -> NodeProgress:
    """A note from its file's text. Raises ValueError (not JSON, or a field of the wrong
    type: a torn or foreign file)."""
    return typed.load(NodeProgress, json.loads(text))
