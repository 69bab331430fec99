"""How each node's agent ended a run: its exit status, and the stop signal that killed
workers that do not catch it. No torch.

    agents/requeue-Q/node-HOST.json    one note per node's agent (``AgentEnd``)

Written by the agent as it ends (hpclaunch.node.agent); read through ``hpclaunch.record``
by the supervisor (a signal sent to the steps only, hpclaunch.recovery.stops), by a lost
batch host's deputy (hpclaunch.recovery.deputy) and by ``hpclaunch status`` (workers that
saved nothing on a stop signal they do not catch).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from hpclaunch.jobdir import typed
from hpclaunch.jobdir.atomic import write_bytes_atomic
from hpclaunch.jobdir.layout import JobFolder

PREFIX, SUFFIX = "node-", ".json"


@dataclass(frozen=True)
class AgentEnd:
    node: str
    status: int  # the agent's exit status
    uncaught: str | None = None  # the stop signal (its name) that killed workers outright


def write(folder: JobFolder, requeue: int, end: AgentEnd) -> None:
    """Note ``end`` for run ``requeue``. Raises OSError."""
    path = folder.agent_end(requeue, end.node)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {key: value for key, value in asdict(end).items() if value is not None}
    write_bytes_atomic(path, json.dumps(data).encode() + b"\n")


def is_note(name: str) -> bool:
    """Whether ``name`` (in ``agents/requeue-Q/``) is an agent's end note."""
    return name.startswith(PREFIX) and name.endswith(SUFFIX)


def parse(text: str) -> AgentEnd:
    """A note from its file's text. Raises ValueError (a torn or foreign file)."""
    return typed.load(AgentEnd, json.loads(text))
