"""``hpclaunch list``: this user's latest submissions with what SLURM and their
folders say of them now; one that cannot be read is listed with why, and never keeps
the others from being listed. No click, no torch."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.ops import registry
from hpclaunch.ops.status import gather
from hpclaunch.slurm.commands import Slurm
from hpclaunch.slurm.hostlist import compress

log = logging.getLogger(__name__)
UNREADABLE = "unreadable"


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
    error: str | None = None  # why the entry could not be read (state is then UNREADABLE)


def latest(env: Mapping[str, str], slurm: Slurm | None, last: int) -> list[ListedJob]:
    """The ``last`` latest submissions, oldest first. Once SLURM proves unreachable it
    is asked no more: each question would wait for the same time-out."""
    rows = []
    for entry in registry.entries(env)[-last:]:
        try:
            found = gather(entry.job_id, slurm, env, Path(entry.job_dir))
        except Exception as exc:  # one entry's fault must not hide the others
            log.debug("job %s could not be read", entry.job_id, exc_info=True)
            rows.append(_unreadable(entry, f"{type(exc).__name__}: {exc}"))
            continue
        if found.unreadable is not None:
            rows.append(_unreadable(entry, found.unreadable, found.state))
            continue
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


def _unreadable(entry: registry.Entry, why: str, state: str | None = None) -> ListedJob:
    """The row of an entry whose folder (or status) could not be read; ``state``: what
    SLURM said of it all the same."""
    return ListedJob(
        entry.job_id,
        entry.name,
        f"{state} ({UNREADABLE})" if state else UNREADABLE,
        None,
        None,
        entry.submitted,
        entry.job_dir,
        why,
    )
