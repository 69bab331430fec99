"""How long each checkpoint save took: global rank 0 appends one JSON line per
committed save to the job folder's ``checkpoint-saves.jsonl``; ``hpclaunch status``
and the supervisor read the last one, to show it and to warn when the time-limit
warning leaves less time than a save needs. No torch."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from hpclaunch.job.spec import agent_grace_for
from hpclaunch.jobdir.atomic import append_line


@dataclass(frozen=True)
class SaveRecord:
    step: int
    sharded: bool
    asynchronous: bool
    blocked_s: float  # how long training waited (staging, for an asynchronous save)
    total_s: float  # from the call to the commit
    bytes: int
    ranks: int
    ended: float  # seconds since the epoch
    # The steps done that it holds, in the job's count (hpclaunch.progress); None: the
    # saving rank's count was not the job's (its resume point unseen), or it counted none.
    steps_done: int | None = None

    def describe(self) -> str:
        """As ``hpclaunch status`` says it: ``step 42: 1.2 GiB sharded by 4 ranks,
        asynchronous, blocked training 0.31 s, committed after 4.20 s``."""
        form = f"sharded by {self.ranks} ranks" if self.sharded else "one file"
        how = "asynchronous, " if self.asynchronous else ""
        return (
            f"step {self.step}: {_size(self.bytes)} {form}, {how}blocked training "
            f"{self.blocked_s:.2f} s, committed after {self.total_s:.2f} s"
        )


def append(path: Path, record: SaveRecord) -> None:
    """One line, appended in one write (O_APPEND): a reader sees whole lines."""
    append_line(path, json.dumps(asdict(record), sort_keys=True) + "\n")


def last(path: Path) -> SaveRecord | None:
    """The newest readable record, or None (no file, or none readable)."""
    found = records(path)
    return found[-1] if found else None


def slowest(path: Path, count: int = 5) -> SaveRecord | None:
    """Of the newest ``count`` records, the one that took longest to commit."""
    return max(records(path)[-count:], key=lambda r: r.total_s, default=None)


def records(path: Path) -> list[SaveRecord]:
    """Every readable record, oldest first (a torn or foreign line is skipped)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            found.append(SaveRecord(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    return found


def lead_warning(record: SaveRecord, signal_lead_s: float) -> str | None:
    """A warning when a save like ``record`` cannot finish between the time-limit
    warning and the workers' end: the agents give them three quarters of the signal
    lead (``hpclaunch.job.spec.agent_grace_for``)."""
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


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
