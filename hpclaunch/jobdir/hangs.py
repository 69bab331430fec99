"""What the agents write into the job folder about hangs and stacks, and what a hang's
reports say together. No torch.

    hangs/requeue-Q/attempt-A-node-HOST.json    a node's hang report (``HangReport``)
    hangs/requeue-Q/attempt-A-node-HOST.txt     its ranks' stacks at the hang
    stacks/request-ID                           ``hpclaunch stacks`` asks ...
    stacks/ID/node-HOST.txt                     ... and each node's agent answers

A node's agent sees only its own ranks; the rank the job's hang began with is the one
a node names with evidence of its own (stopped, or not waiting in a collective while
the others do), else the one whose progress ended first (``first_hung``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from hpclaunch.jobdir import typed
from hpclaunch.jobdir.atomic import write_bytes_atomic
from hpclaunch.jobdir.layout import JobFolder


@dataclass(frozen=True)
class RankAtHang:
    rank: int
    local_rank: int
    pid: int
    state: str  # the process state /proc gives: R, S, D, T (stopped), Z
    step: int | None  # its last step (None: no progress reported)
    idle_s: float | None  # seconds since its last progress
    waiting: bool | None  # in a collective (from its stack); None: no stack
    where: str  # its innermost frame of its own, from the stack


@dataclass(frozen=True)
class HangReport:
    node: str
    node_rank: int
    requeue: int
    attempt: int
    time: float  # when it was found (wall clock)
    reason: str  # what was seen: no progress, or a stopped worker
    limit_s: float  # the hang timeout in force
    ranks: tuple[RankAtHang, ...]
    culprits: tuple[int, ...]  # the ranks this node names, with its evidence
    how: str  # that evidence, in words
    stacks: str  # the stacks file
    # Where the workers hung when not between two steps, past that stretch's bound: "in
    # checkpoint save for 31 s (bound 30 s)", "with no first step for 40 s (bound 30 s)".
    stretch: str | None = None
    # The kind of that stretch (hpclaunch.progress.Stretch, lower case: "save", "load",
    # "pause"); None: between steps, or before the first (an older report: unknown).
    stretch_kind: str | None = None

    def messages(self, blamed: bool) -> dict[int, str]:
        """rank -> the failure record's message for it (hpclaunch.jobdir.failures): the
        ranks named are the node's own error only when the hang is ``blamed`` on it."""
        from hpclaunch.jobdir.failures import HUNG, NOT_BLAMED, WAITED_FOR_HANG

        out = {}
        for seen in self.ranks:
            step = f" after step {seen.step}" if seen.step is not None else ""
            at = f" at {seen.where}" if seen.where else ""
            if seen.rank not in self.culprits:
                out[seen.rank] = f"{WAITED_FOR_HANG} {self.reason}"
            else:  # the rank's own message: where it was, not which ranks were there
                what = self.stretch or self.reason
                out[seen.rank] = f"{HUNG if blamed else NOT_BLAMED} {what}{step}; {self.how}{at}"
        return out


def report_path(job: JobFolder, requeue: int, attempt: int, node: str, suffix: str) -> Path:
    return job.hangs(requeue) / f"attempt-{attempt}-node-{node}.{suffix}"


def write_report(job: JobFolder, report: HangReport) -> Path:
    """Write ``report`` atomically; its path. Raises OSError."""
    path = report_path(job, report.requeue, report.attempt, report.node, "json")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, (json.dumps(asdict(report), indent=2) + "\n").encode())
    return path


def is_report(name: str) -> bool:
    """Whether ``name`` (in ``hangs/requeue-Q/``) is a node's hang report."""
    return name.startswith("attempt-") and "-node-" in name and name.endswith(".json")


def parse(text: str) -> HangReport:
    """A report from its file's text. Raises ValueError (a torn or foreign file)."""
    return typed.load(HangReport, json.loads(text))


@dataclass(frozen=True)
class FirstHung:
    """The rank a hang of one attempt began with, as the nodes' reports tell it."""

    requeue: int
    attempt: int
    rank: int | None  # None: no report names one, and no progress tells
    node: str
    step: int | None
    idle_s: float | None
    how: str
    waiting: int  # ranks seen waiting in a collective, on every node that reported
    read: int  # ranks whose stacks were read, on every node that reported
    stacks: tuple[str, ...]
    stretch: str | None = None  # where it hung, past that stretch's bound (HangReport's)


def began_on(reports: Sequence[HangReport]) -> str | None:
    """The node one attempt's hang began on, where the nodes' reports show it: the one
    node with a stopped worker; else the one node that named ranks of its own while every
    rank the other nodes read waited in a collective. None when they cannot tell (more
    than one such node, a stack not read, or no other node's report). Pure."""
    stopped = {r.node for r in reports if any(s.state == "T" for s in r.ranks)}
    if stopped:
        return stopped.pop() if len(stopped) == 1 else None
    named = [r for r in reports if r.culprits]
    others = [s for r in reports if r.node not in {n.node for n in named} for s in r.ranks]
    if len(named) == 1 and others and all(s.waiting for s in others):
        return named[0].node
    return None


def first_hung(reports: Sequence[HangReport]) -> list[FirstHung]:
    """For each (requeue, attempt) among ``reports``: the rank it began with (see
    ``began_on``), or none named. Pure."""
    by_attempt: dict[tuple[int, int], list[HangReport]] = {}
    for report in reports:
        by_attempt.setdefault((report.requeue, report.attempt), []).append(report)
    out = []
    for (requeue, attempt), some in sorted(by_attempt.items()):
        seen = [s for r in some for s in r.ranks]
        waiting = sum(1 for s in seen if s.waiting)
        read = sum(1 for s in seen if s.waiting is not None)
        stacks = tuple(r.stacks for r in some)
        node = began_on(some)
        if node is None:
            named = sorted(rank for r in some for rank in r.culprits)
            how = (
                f"ranks {','.join(map(str, named))} were not waiting in a collective, on "
                "more than one node"
                if named
                else "no rank was seen outside a collective"
            )
            stretch = next((r.stretch for r in some if r.stretch), None)
            out.append(
                FirstHung(
                    requeue, attempt, None, "", None, None, how, waiting, read, stacks, stretch
                )
            )
            continue
        report = next(r for r in some if r.node == node)
        rank = next(s for s in report.ranks if s.rank == min(report.culprits))
        how = f"{report.how}{f' at {rank.where}' if rank.where else ''}"
        out.append(
            FirstHung(
                requeue,
                attempt,
                rank.rank,
                node,
                rank.step,
                rank.idle_s,
                how,
                waiting,
                read,
                stacks,
                report.stretch,
            )
        )
    return out


def describe(hung: FirstHung) -> str:
    """One line for status and the batch log."""
    when = f"run {hung.requeue}, " if hung.requeue else ""
    where = f" {hung.stretch}" if hung.stretch else ""
    if hung.rank is None:
        return (
            f"{when}attempt {hung.attempt}: the workers hung{where}, no rank named "
            f"({hung.how}); {_waited(hung)}; stacks: {_files(hung.stacks)}"
        )
    step = f" after step {hung.step}" if hung.step is not None else ""
    if hung.stretch:  # how long it was in the stretch says more than since the last step
        what = f"{where}{',' if step else ''}{step}"
    else:
        idle = f", no progress for {hung.idle_s:.0f} s" if hung.idle_s is not None else ""
        what = f"{step}{idle}"
    return (
        f"{when}attempt {hung.attempt}: rank {hung.rank} on {hung.node} hung{what} "
        f"({hung.how}); {_waited(hung)}; stacks: {_files(hung.stacks)}"
    )


def _waited(hung: FirstHung) -> str:
    if not hung.read:
        return "no other rank's stack was read"
    ranks = "rank" if hung.read == 1 else "ranks"
    return f"{hung.waiting} of the {hung.read} {ranks} read waited in a collective"


def _files(paths: Sequence[str]) -> str:
    """One path, or the nodes' paths as one glob (they differ in the node name only)."""
    if len(paths) == 1:
        return paths[0]
    first = Path(paths[0])
    return str(first.with_name(first.name.split("-node-")[0] + "-node-*" + first.suffix))


def hang_block(report: HangReport) -> str:
    """The lines a node's root-cause block begins with when its workers hung."""
    named = ",".join(map(str, report.culprits)) or "none"
    lines = [
        f"hang on {report.node} (attempt {report.attempt}): {report.reason}",
        f"  ranks named: {named} ({report.how})",
    ]
    for seen in report.ranks:
        state = "stopped" if seen.state == "T" else "waiting" if seen.waiting else "running"
        step = seen.step if seen.step is not None else "-"
        lines.append(f"  rank {seen.rank}: {state}, step {step}, at {seen.where or '?'}")
    lines.append(f"  stacks: {report.stacks}")
    return "\n".join(lines)


# How long `hpclaunch stacks` waits for the agents' answers by default: an agent answers
# within about 2 s (it looks for requests every few seconds), plus py-spy's read.
ANSWER_WAIT_S = 30.0


def request_stacks(job: JobFolder) -> str:
    """Ask the agents of a running job for their ranks' stacks; the request's id."""
    folder = job.stacks
    folder.mkdir(parents=True, exist_ok=True)
    request = f"{time.time_ns():x}"
    write_bytes_atomic(folder / f"request-{request}", b"")
    return request


def open_requests(job: JobFolder, node: str) -> list[str]:
    """The requests ``node`` has not answered yet."""
    try:
        names = [p.name for p in job.stacks.iterdir()]
    except OSError:
        return []
    asked = [n.removeprefix("request-") for n in names if n.startswith("request-")]
    return [r for r in asked if not answer_path(job, r, node).exists()]


def answer_path(job: JobFolder, request: str, node: str) -> Path:
    return job.stacks / request / f"node-{node}.txt"


def write_answer(job: JobFolder, request: str, node: str, stacks: Mapping[int, str]) -> None:
    """The stacks of ``node``'s ranks (rank -> text), for request ``request``; nothing
    when the request is gone (the command gave up and removed it while they were read)."""
    if not (job.stacks / f"request-{request}").exists():
        return
    path = answer_path(job, request, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, sections(stacks).encode())


def sections(stacks: Mapping[int, str]) -> str:
    """rank -> text as one file: a header line per rank. ``from_sections`` reads it."""
    return "".join(f"=== rank {rank}\n{text.rstrip()}\n" for rank, text in sorted(stacks.items()))


def from_sections(text: str) -> dict[int, str]:
    out: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("=== rank ") and line[9:].strip().isdigit():
            current = out.setdefault(int(line[9:].strip()), [])
        elif current is not None:
            current.append(line)
    return {rank: "\n".join(lines) for rank, lines in out.items()}
