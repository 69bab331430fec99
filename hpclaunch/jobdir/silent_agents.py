"""The supervisor's note of an agent that stopped noting progress while the others go on
(hpclaunch.recovery.watch), so that ``hpclaunch status`` says it while the run goes on,
not only the batch log. No torch.

    agents/requeue-Q/silent-HOST.json    one note per silent agent (``SilentAgent``)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from hpclaunch.jobdir import typed
from hpclaunch.jobdir.atomic import write_bytes_atomic
from hpclaunch.jobdir.layout import JobFolder

PREFIX, SUFFIX = "silent-", ".json"


@dataclass(frozen=True)
class SilentAgent:
    node: str
    time: float  # when the supervisor named it (wall clock)
    bound_s: float  # the seconds without a note it was named after
    live: tuple[str, ...] = ()  # the nodes whose agents' notes went on then


def write(folder: JobFolder, requeue: int, note: SilentAgent) -> None:
    """Note ``note`` for run ``requeue``. Raises OSError."""
    path = folder.agents(requeue) / f"{PREFIX}{note.node}{SUFFIX}"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, json.dumps(asdict(note)).encode() + b"\n")


def remove(folder: JobFolder, requeue: int, node: str) -> None:
    """Take back the note of ``node`` (its notes went on again). Raises OSError."""
    (folder.agents(requeue) / f"{PREFIX}{node}{SUFFIX}").unlink(missing_ok=True)


def is_note(name: str) -> bool:
    """Whether ``name`` (in ``agents/requeue-Q/``) is a silent agent's note."""
    return name.startswith(PREFIX) and name.endswith(SUFFIX)


def parse(text: str) -> SilentAgent:
    """A note from its file's text. Raises ValueError (a torn or foreign file)."""
    return typed.load(SilentAgent, json.loads(text))


def describe(note: SilentAgent) -> str:
    """The line ``hpclaunch status`` shows for ``note`` while its run goes on. Pure."""
    others = f" while the agents on {', '.join(note.live)} go on" if note.live else ""
    return (
        f"the agent on {note.node} noted no progress for {note.bound_s:g} s{others} "
        "(stopped or stuck: its workers may still train, its hang watch is blind); the "
        "supervisor ends the step when the others end or fall silent too"
    )
