"""The checkpoints a job is known to have committed, when, and what each holds.

Three kinds are seen without asking the script: hpclaunch's own (``checkpoint.save``:
its saves' records keep them after the folder pruned them), the Lightning callback's
(``hpclaunch.frameworks.lightning.StopCheckpoint``, named by global step), and files
that match ``--checkpoint-pattern`` (the script's own, by their modification time). Only
the first two say how many steps they hold; a file found by pattern says when it was
written, not what it holds. Files older than the job's first run are not the job's.
Pure.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from hpclaunch.contract.values import agent_grace_for
from hpclaunch.jobdir.checkpoint_folder import LIGHTNING_FOLDER
from hpclaunch.jobdir.saves import SaveRecord
from hpclaunch.record.job_record import JobRecord

# Clocks of different hosts (and a file server's): a checkpoint this much after a run's
# recorded end still counts as that run's, a file this much older than the job's first
# run is still taken as the job's.
CLOCK_SLACK_S = 2.0


class Kind(enum.Enum):
    HPCLAUNCH = "hpclaunch"  # hpclaunch.checkpoint.save
    LIGHTNING = "lightning"  # hpclaunch.frameworks.lightning.StopCheckpoint
    PATTERN = "pattern"  # a file matching --checkpoint-pattern


@dataclass(frozen=True)
class Saved:
    """One checkpoint the job committed."""

    kind: Kind
    label: str  # as status names it: "step 29", "lightning/step-000000000030.ckpt", a path
    time: float  # when it was committed (seconds since the epoch)
    steps: int | None  # the steps done it holds, in the job's count; None: unknown
    called: float  # when training asked for it (its state is training's at that time)
    blocked_s: float = 0.0  # how long training waited for it


def known(record: JobRecord) -> list[Saved]:
    """Every checkpoint the job is known to have committed, by time."""
    since = record.first_start
    out = [_of_save(r) for r in record.saves]
    recorded = {r.step for r in record.saves}
    for c in record.checkpoints.committed:
        if c.step not in recorded and c.written is not None and _own(c.written, since):
            # Committed, but its save noted nothing (an older hpclaunch, or the note
            # failed): when is known, what it holds is not.
            out.append(Saved(Kind.HPCLAUNCH, f"step {c.step}", c.written, None, c.written))
    for c in record.checkpoints.lightning:
        if c.written is not None and _own(c.written, since):
            # Named by Lightning's global step, which counts every optimizer's steps: the
            # steps it holds in hpclaunch's count (the first optimizer's) only with one.
            # Its time tells what it holds; where a run resumed from it, the run says.
            label = f"{LIGHTNING_FOLDER}/{c.path.name}"
            out.append(Saved(Kind.LIGHTNING, label, c.written, None, c.written))
    for f in record.found.found:
        if _own(f.written, since):
            out.append(Saved(Kind.PATTERN, str(f.path), f.written, None, f.written))
    return sorted(out, key=lambda s: (s.time, s.label))


def _of_save(record: SaveRecord) -> Saved:
    called = record.ended - record.total_s
    return Saved(
        Kind.HPCLAUNCH,
        f"step {record.step}",
        record.ended,
        record.steps_done,
        called,
        record.blocked_s,
    )


def _own(written: float, since: float | None) -> bool:
    """Whether a file written at ``written`` can be the job's (not older than its first run)."""
    return since is None or written >= since - CLOCK_SLACK_S


def newest_before(saved: Sequence[Saved], until: float | None) -> Saved | None:
    """The newest of ``saved`` committed by ``until`` (None: any)."""
    kept = [s for s in saved if until is None or s.time <= until + CLOCK_SLACK_S]
    return kept[-1] if kept else None


def last_by_pattern(record: JobRecord) -> Saved | None:
    """The newest file matching --checkpoint-pattern that is the job's."""
    found = [s for s in known(record) if s.kind is Kind.PATTERN]
    return found[-1] if found else None


def lead_warning(record: SaveRecord, signal_lead_s: float) -> str | None:
    """A warning when a save like ``record`` cannot finish between the time-limit
    warning and the workers' end: the agents give them three quarters of the signal
    lead (``hpclaunch.contract.values.agent_grace_for``)."""
    budget = agent_grace_for(signal_lead_s)
    if record.total_s < budget:
        return None
    needed = math.ceil((record.total_s * 1.5 + 10) * 4 / 3)
    return (
        f"the checkpoint save of step {record.step} took {record.total_s:.1f} s, but after "
        f"the time-limit warning (--signal-lead {signal_lead_s:g} s) the workers get "
        f"{budget} s: a save on the warning would not finish; raise --signal-lead to at "
        f"least {needed} s, or make the save smaller"
    )
