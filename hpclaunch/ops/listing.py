"""``hpclaunch list``: this user's latest submissions with what SLURM and their
folders say of them now. No click, no torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.ops import registry
from hpclaunch.ops.status import gather
from hpclaunch.slurm.commands import Slurm
from hpclaunch.slurm.hostlist import compress


@dataclass(frozen=True)
class ListedJob:
    """One row of ``hpclaunch list``; its fields, in order, are the ``--json`` keys."""

    job_id: int
    name: str
    state: str | None
    nodes: str | None  # a hostlist
    requeues: int | None
    submitted: float  # seconds since the epoch
    job_dir: str


def latest(env: Mapping[str, str], slurm: Slurm | None, last: int) -> list[ListedJob]:
    """The ``last`` latest submissions, oldest first. Once SLURM proves unreachable it
    is asked no more: each question would wait for the same time-out."""
    rows = []
    for entry in registry.entries(env)[-last:]:
        found = gather(entry.job_id, slurm, env, Path(entry.job_dir))
        if found.slurm_unreachable:
            slurm = None
        nodes = compress(found.nodes) if found.nodes else None
        rows.append(
            ListedJob(
                entry.job_id,
                entry.name,
                found.state,
                nodes,
                found.requeues,
                entry.submitted,
                entry.job_dir,
            )
        )
    return rows
