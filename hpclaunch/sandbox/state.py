"""What a sandbox's state file records, and the pure decision ``up`` makes from it.

The file holds what was asked for, where the sandbox was placed, every process
started (PID and start time) and whether ``up`` finished. Everything else is
derived from it again by ``conf.layout``.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpclaunch.procs import Tracked
from hpclaunch.sandbox.conf import Mode, Partitions, Placement, SandboxSpec

CONTROL_DAEMONS = ("munged", "slurmctld")


@dataclass(frozen=True)
class SandboxState:
    """The contents of ``state.json``."""

    spec: SandboxSpec
    mode: Mode
    place: Placement
    procs: Mapping[str, Tracked] = field(default_factory=dict)
    complete: bool = False  # set when up has seen every node idle

    def expected(self) -> set[str]:
        """The daemons a complete sandbox runs: munged, slurmctld, one slurmd per node."""
        return {*CONTROL_DAEMONS, *(f"n{i + 1}" for i in range(self.spec.nodes))}

    def dead(self) -> list[str]:
        """Daemons that are expected but not running (all of them before up completes)."""
        return sorted(
            name
            for name in self.expected()
            if not (name in self.procs and self.procs[name].alive())
        )

    def healthy(self) -> bool:
        return self.complete and not self.dead()

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": {
                "nodes": self.spec.nodes,
                "gpus_per_node": self.spec.gpus_per_node,
                "partitions": self.spec.partitions.value,
                "mode": self.spec.mode.value,
                "first_job_id": self.spec.first_job_id,
            },
            "mode": self.mode.value,
            "place": {
                "sid": self.place.sid,
                "subnet": self.place.subnet,
                "base_port": self.place.base_port,
            },
            "procs": {name: [t.pid, t.start_time] for name, t in self.procs.items()},
            "complete": self.complete,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SandboxState:
        raw = data["spec"]
        spec = SandboxSpec(
            nodes=raw["nodes"],
            gpus_per_node=raw["gpus_per_node"],
            partitions=Partitions(raw["partitions"]),
            mode=Mode(raw["mode"]),
            first_job_id=raw.get("first_job_id", 1),  # absent in states written before it
        )
        place = Placement(**data["place"])
        procs = {name: Tracked(pid, start) for name, (pid, start) in data["procs"].items()}
        return cls(spec, Mode(data["mode"]), place, procs, bool(data["complete"]))


def read(path: Path) -> SandboxState | None:
    try:
        return SandboxState.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None


def write(path: Path, state: SandboxState) -> None:
    """Atomically: a reader sees the old state or the new one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2))
    os.replace(tmp, path)


class UpAction(enum.Enum):
    START = "start"  # nothing there: start one
    REUSE = "reuse"  # the same sandbox is up and healthy
    REPAIR = "repair"  # the same sandbox, with nodes killed: start those nodes again
    CONFLICT = "conflict"  # a healthy sandbox with other settings is up: refuse
    REPLACE = "replace"  # what is there is broken or half-started: tear it down, start anew


def decide_up(current: SandboxState | None, wanted: SandboxSpec) -> UpAction:
    """What ``up`` does, given the recorded state (with liveness) and the request."""
    if current is None:
        return UpAction.START
    dead = current.dead()
    if not current.complete or any(name in CONTROL_DAEMONS for name in dead):
        return UpAction.REPLACE
    same_mode = wanted.mode in (Mode.AUTO, current.mode)
    same = (wanted.nodes, wanted.gpus_per_node, wanted.partitions, wanted.first_job_id) == (
        current.spec.nodes,
        current.spec.gpus_per_node,
        current.spec.partitions,
        current.spec.first_job_id,
    )
    if not (same and same_mode):
        return UpAction.CONFLICT
    return UpAction.REPAIR if dead else UpAction.REUSE


def differences(current: SandboxState, wanted: SandboxSpec) -> str:
    """The settings in which ``wanted`` differs from the running sandbox, for messages."""
    pairs = [
        ("--nodes", current.spec.nodes, wanted.nodes),
        ("--gpus-per-node", current.spec.gpus_per_node, wanted.gpus_per_node),
        ("--partitions", current.spec.partitions.value, wanted.partitions.value),
        ("--mode", current.mode.value, wanted.mode.value),
        ("first job id", current.spec.first_job_id, wanted.first_job_id),
    ]
    return ", ".join(
        f"{flag} {new} (running: {old})"
        for flag, old, new in pairs
        if old != new and not (flag == "--mode" and new == Mode.AUTO.value)
    )
