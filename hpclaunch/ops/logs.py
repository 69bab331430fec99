"""What ``hpclaunch logs`` shows: which files (the batch log, or the ranks' own output
across restarts and requeues), printed once or followed as the job writes them. The
caller gives the writers; no click, no torch."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.jobdir.layout import JobFolder, RankFile
from hpclaunch.ops import follow
from hpclaunch.ops.status import JobNotFound, JobStatus
from hpclaunch.slurm.states import JobState

Labelled = list[tuple[str, Path]]  # (label, file), oldest first


@dataclass(frozen=True)
class LogSelection:
    """Which logs: the batch log, or with ``rank``/``node`` the workers' own output
    (stderr with ``err``)."""

    rank: int | None = None
    node: str | None = None
    err: bool = False

    @property
    def of_ranks(self) -> bool:
        return self.rank is not None or self.node is not None

    def files(self, job_dir: Path, status: JobStatus) -> Labelled:
        """The files to show, oldest first, with a label each."""
        if not self.of_ranks:
            return [("batch log", Path(status.batch_log))] if status.batch_log else []
        kind = RankFile.ERR if self.err else RankFile.OUT
        files = []
        for attempt in JobFolder(job_dir).attempts():
            ranks = [self.rank] if self.rank is not None else []
            if self.node is not None:
                on_node = attempt.node_ranks().get(self.node, [])
                ranks = [r for r in on_node if self.rank is None or r == self.rank]
            for number in ranks:
                path = attempt.rank_file(number, kind)
                if path.exists():
                    files.append((f"rank {number}, {attempt.label}", path))
        return files

    def folder(self, status: JobStatus) -> Path:
        """The job folder to read ranks' logs from. Raises JobNotFound when they are
        asked for and the folder is unknown."""
        if status.job_dir is None and self.of_ranks:
            raise JobNotFound(
                f"job {status.job_id}'s folder is unknown: " + "; ".join(status.notes)
            )
        return Path(status.job_dir) if status.job_dir else Path()

    def nothing_yet(self, job_id: int, folder: Path, ranks: list[int] | None = None) -> JobNotFound:
        """The error for a job with none of these logs yet (``ranks``: the job's, when
        known; else those that wrote a log)."""
        what = "log of that rank or node" if self.of_ranks else "batch log"
        seen = f" (nodes it ran on: {nodes_seen(folder)})" if self.node is not None else ""
        ranks = ranks or ranks_seen(folder)
        if self.rank is not None and self.node is None and ranks:
            return JobNotFound(
                f"job {job_id} has no rank {self.rank} (from --rank): its ranks are "
                f"{compress_ranks(ranks)}; give one of them"
            )
        return JobNotFound(f"job {job_id} has no {what} yet{seen}")

    def absent_rank(self, folder: Path, current: JobStatus) -> list[int]:
        """The job's ranks when --rank asks for one it will not have, else []: no attempt
        ran or logged that rank, and every node of the current run (``current``) has
        noted its ranks in the run's latest attempt. A rank still to come (a node yet to
        start, another run, a node list that changed) is never refused."""
        if self.rank is None or self.node is not None or current.requeues is None:
            return []
        attempts = JobFolder(folder).attempts()
        if not attempts or attempts[-1].requeue != current.requeues:
            return []
        noted = attempts[-1].node_ranks()
        if not current.nodes or set(current.nodes) != set(noted):
            return []  # a node has not started yet, or the run's nodes changed
        every = {rank for a in attempts for ranks in a.node_ranks().values() for rank in ranks}
        if self.rank in every or self.rank in ranks_seen(folder):
            return []
        return sorted({rank for ranks in noted.values() for rank in ranks})


def nodes_seen(folder: Path) -> str:
    """The nodes any attempt of the job ran on, for a message."""
    names = sorted({name for a in JobFolder(folder).attempts() for name in a.node_ranks()})
    return ", ".join(names) or "none recorded"


def ranks_seen(folder: Path) -> list[int]:
    """The global ranks any attempt of the job wrote a log for."""
    found = set()
    for attempt in JobFolder(folder).attempts():
        for path in attempt.path.glob("rank-*.*"):
            number = path.name.split(".")[0].removeprefix("rank-")
            if number.isdigit():
                found.add(int(number))
    return sorted(found)


def compress_ranks(ranks: list[int]) -> str:
    """``0-3, 6`` for [0, 1, 2, 3, 6]."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


def show(
    selection: LogSelection,
    found: JobStatus,
    write: Callable[[Iterable[str]], None],
) -> None:
    """Write the selected logs as they are now. Raises JobNotFound when there are none."""
    folder = selection.folder(found)
    listed = selection.files(folder, found)
    if not listed:
        raise selection.nothing_yet(found.job_id, folder)
    write(follow.Tail().rest(listed, selection.of_ranks))


def follow_logs(
    selection: LogSelection,
    found: JobStatus,
    look: Callable[[], JobStatus],
    write: Callable[[Iterable[str]], None],
    warn: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Write the selected logs as the job writes them, until it ends (or its state
    can no longer be told: ``warn`` says so, and what is there is written)."""
    folder = selection.folder(found)
    tail = follow.Tail()
    headers = selection.of_ranks  # one header per rank, per attempt

    def files(current: JobStatus) -> Labelled:
        ranks = selection.absent_rank(folder, current)
        if ranks:  # a rank the job does not have: waiting for it would never end
            raise selection.nothing_yet(current.job_id, folder, ranks)
        return selection.files(folder, current)

    if not files(found) and found.job_state is JobState.PENDING:
        warn(f"hpclaunch: job {found.job_id} is pending; waiting for it to start")
    try:
        last = follow.loop(
            look, lambda now: write(tail.read(files(now), headers)), sleep, first=found
        )
    except follow.LostTrack as lost:
        warn(f"hpclaunch: lost track of job {found.job_id}'s state: " + "; ".join(lost.last.notes))
        last = lost.last
    listed = files(last)
    if not listed and not tail.offsets:  # it ended without ever writing one
        raise selection.nothing_yet(found.job_id, folder)
    write(tail.rest(listed, headers))
