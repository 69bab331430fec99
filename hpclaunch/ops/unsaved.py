"""Runs whose workers died of a stop signal they do not catch (the agents' notes, see
``hpclaunch.recovery.deputy.note_end``): such a worker saved nothing on the time-limit
warning, so ``hpclaunch status`` says so, next to the batch log's line. No torch."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from hpclaunch.jobdir.layout import JobFolder


def uncaught(folder: Path, requeue: int) -> dict[str, str]:
    """node -> the stop signal that killed its workers in run ``requeue``."""
    found = {}
    for path in sorted(JobFolder(folder).agents(requeue).glob("node-*.json")):
        try:
            note = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(note, dict) and isinstance(note.get("uncaught"), str):
            found[str(note.get("node"))] = str(note["uncaught"])
    return found


def notes(folder: Path, requeues: Iterable[int]) -> list[str]:
    """A line for each run in which workers died of a stop signal they do not catch."""
    out = []
    for requeue in requeues:
        found = uncaught(folder, requeue)
        for sig in sorted(set(found.values())):
            nodes = ",".join(node for node, seen in found.items() if seen == sig)
            out.append(
                f"run {requeue}: the workers on {nodes} were killed by {sig}, which they do not "
                "catch, so they saved nothing on it; catch it (hpclaunch.checkpoint.Preemption, "
                "or for Lightning hpclaunch.frameworks.lightning.StopCheckpoint)"
            )
    return out
