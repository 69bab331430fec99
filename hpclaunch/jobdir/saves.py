"""How long each checkpoint save took and what it holds: global rank 0 appends one JSON
line per committed save to the job folder's ``checkpoint-saves.jsonl``
(hpclaunch.checkpoint.saving). ``hpclaunch.record`` reads them: status shows the last
one, the supervisor warns when the time-limit warning leaves less time than a save
needs, lost work and goodput know what each checkpoint holds and when it was taken;
``load_latest`` finds the steps the checkpoint it loaded holds. No torch."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from hpclaunch.jobdir import typed
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


def slowest(records: Sequence[SaveRecord], count: int = 5) -> SaveRecord | None:
    """Of the newest ``count`` of ``records``, the one that took longest to commit."""
    return max(records[-count:], key=lambda r: r.total_s, default=None)


def parse(lines: Iterable[str]) -> list[SaveRecord]:
    """The records among ``lines``, oldest first; a torn or foreign line is skipped."""
    found = []
    for line in lines:
        try:
            found.append(typed.load(SaveRecord, json.loads(line)))
        except ValueError:
            continue
    return found


def read(path: Path) -> list[SaveRecord]:
    """Every readable record in ``path``; none when it cannot be read."""
    try:
        return parse(path.read_text(errors="replace").splitlines())
    except OSError:
        return []


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
