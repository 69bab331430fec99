"""A job's folder, read once into typed data.

``JobRecord.read(folder, job_id)`` lists the folder and reads every file ``hpclaunch
status`` needs exactly once: the history, the checkpoint saves, each run's progress
notes, attempt events, hang reports, agents' end notes, failure records and root-cause
blocks, the attempts' log folders, the checkpoint folder and the files matching
``--checkpoint-pattern``. Each file is parsed by the module that writes it
(``hpclaunch.jobdir``); a file that cannot be read or parsed is left out (a note says so
where it matters), never guessed at. ``read_run`` reads one run's files only, for the
agents and the supervisor while the job runs. No torch, no SLURM.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from hpclaunch.jobdir import (
    agent_ends,
    attempts,
    checkpoint_folder,
    failures,
    found_checkpoints,
    hangs,
    progress_notes,
    saves,
    set_aside,
    silent_agents,
)
from hpclaunch.jobdir.agent_ends import AgentEnd
from hpclaunch.jobdir.attempts import AttemptEvent
from hpclaunch.jobdir.checkpoint_folder import Listing
from hpclaunch.jobdir.failures import NodeRecord
from hpclaunch.jobdir.found_checkpoints import Search
from hpclaunch.jobdir.hangs import HangReport
from hpclaunch.jobdir.history import History, HistoryError, Run, unreadable
from hpclaunch.jobdir.layout import (
    AGENTS,
    FAILURES,
    HANGS,
    PROGRESS,
    AttemptFolder,
    JobFolder,
    number_of,
)
from hpclaunch.jobdir.progress_notes import NodeProgress
from hpclaunch.jobdir.saves import SaveRecord
from hpclaunch.jobdir.set_aside import SetAside
from hpclaunch.jobdir.silent_agents import SilentAgent

T = TypeVar("T")


@dataclass(frozen=True)
class RunRecord:
    """What the job folder holds of one run (``requeue``: SLURM's requeue count)."""

    requeue: int
    notes: tuple[NodeProgress, ...] = ()  # each node's latest progress note, by node
    events: tuple[AttemptEvent, ...] = ()  # every node's attempt events, by attempt and time
    hangs: tuple[HangReport, ...] = ()  # by attempt and time
    ends: tuple[AgentEnd, ...] = ()  # the agents' end notes, by node
    failures: tuple[NodeRecord, ...] = ()  # the failure records, by attempt and node
    root_causes: tuple[tuple[str, str], ...] = ()  # (node, root-cause block), by node
    silent: tuple[SilentAgent, ...] = ()  # agents the supervisor named silent, by node

    def block(self, node: str | None) -> str | None:
        """``node``'s root-cause block, else the first other one (srun may have stopped
        that node's agent before it gave up); None when there is none."""
        found = dict(self.root_causes)
        if node is not None and node in found:
            return found[node]
        return self.root_causes[0][1] if self.root_causes else None

    def ended(self, nodes: tuple[str, ...]) -> dict[str, int]:
        """The exit statuses the agents of ``nodes`` noted."""
        return {end.node: end.status for end in self.ends if end.node in nodes}


@dataclass(frozen=True)
class JobRecord:
    """A job's folder as it was when read (see the module)."""

    root: Path
    job_id: int
    history: History  # empty when the folder has no history.json yet
    history_error: str | None = None  # why history.json could not be read
    runs: Mapping[int, RunRecord] = field(default_factory=dict)  # every run with files
    attempt_logs: tuple[AttemptFolder, ...] = ()  # every attempt's rank-log folder, in order
    saves: tuple[SaveRecord, ...] = ()
    checkpoint_dir: Path = Path()
    checkpoints: Listing = field(default_factory=Listing)
    found: Search = field(default_factory=Search)  # what --checkpoint-pattern matches
    notes: tuple[str, ...] = ()  # what could not be read
    set_aside: tuple[SetAside, ...] = ()  # checkpoints load_latest set aside, and why

    @classmethod
    def read(cls, root: Path, job_id: int) -> JobRecord:
        """Read ``root`` (a job folder). Never raises OSError: what cannot be read is
        left out, with a note where status must say so."""
        folder = JobFolder(root)
        history, error = _history(folder, job_id)
        notes: list[str] = []
        ckpt_dir = Path(history.checkpoint_dir) if history.checkpoint_dir else folder.checkpoints
        try:
            listing = checkpoint_folder.scan(ckpt_dir)
        except OSError as exc:
            notes.append(f"checkpoint folder {ckpt_dir} cannot be read: {exc.strerror}")
            listing = Listing()
        search = found_checkpoints.search(history.checkpoint_patterns)
        notes += search.notes
        runs = {q: RunRecord(q) for q in _numbered(folder.root)}
        for requeue in sorted({*runs, *(r.requeue_count for r in history.runs)}):
            runs[requeue] = read_run(root, requeue)
        return cls(
            root,
            job_id,
            history,
            error,
            dict(sorted(runs.items())),
            tuple(_attempt_logs(folder)),
            tuple(saves.read(folder.saves)),
            ckpt_dir,
            listing,
            search,
            tuple(notes),
            tuple(set_aside.read(folder.set_aside)),
        )

    def run(self, requeue: int) -> RunRecord:
        """Run ``requeue``'s record (empty when the folder holds nothing of it)."""
        return self.runs.get(requeue, RunRecord(requeue))

    @property
    def history_runs(self) -> list[Run]:
        return list(self.history.runs)

    @property
    def first_start(self) -> float | None:
        """When the job's first run began (nothing of the job is older)."""
        return min((r.started for r in self.history.runs), default=None)


def read_run(root: Path, requeue: int) -> RunRecord:
    """One run's files (see ``RunRecord``), each folder listed once. Never raises OSError."""
    folder = JobFolder(root)
    progress = _entries(folder.progress(requeue))
    notes = _each(progress, progress_notes.is_note, progress_notes.parse)
    events = [
        event
        for _, text in _texts(progress, attempts.is_log)
        for event in attempts.parse(text.splitlines())
    ]
    reports = _each(_entries(folder.hangs(requeue)), hangs.is_report, hangs.parse)
    agents = _entries(folder.agents(requeue))
    ends = _each(agents, agent_ends.is_note, agent_ends.parse)
    silent = _each(agents, silent_agents.is_note, silent_agents.parse)
    listed = _entries(folder.failures(requeue))
    records: list[NodeRecord] = []
    for entry in listed:
        if entry.name.startswith("attempt-") and entry.is_dir():
            records += _each(_entries(Path(entry.path)), failures.is_record, failures.parse)
    blocks = [
        (node, text)
        for name, text in _texts(listed, lambda name: failures.block_node(name) is not None)
        if (node := failures.block_node(name)) is not None
    ]
    return RunRecord(
        requeue,
        tuple(sorted(notes, key=lambda n: n.node)),
        tuple(sorted(events, key=lambda e: (e.attempt, e.time))),
        tuple(sorted(reports, key=lambda r: (r.attempt, r.time))),
        tuple(sorted(ends, key=lambda e: e.node)),
        tuple(sorted(records, key=lambda r: (r.attempt, r.node))),
        tuple(sorted(blocks)),
        tuple(sorted(silent, key=lambda s: s.node)),
    )


def _history(folder: JobFolder, job_id: int) -> tuple[History, str | None]:
    try:
        return History.load(folder.root, job_id), None
    except HistoryError as exc:
        return History(job_id, 0), str(exc)
    except OSError as exc:
        return History(job_id, 0), str(unreadable(folder.history, exc.strerror or str(exc)))


def _numbered(root: Path) -> set[int]:
    """The requeue counts any run folder (progress, hangs, agents, failures) is for."""
    found: set[int] = set()
    for name in (PROGRESS, HANGS, AGENTS, FAILURES):
        for entry in _entries(root / name):
            number = number_of(entry.name) if entry.name.startswith("requeue-") else None
            if number is not None:
                found.add(number)
    return found


def _attempt_logs(folder: JobFolder) -> list[AttemptFolder]:
    try:
        return folder.attempts()
    except OSError:
        return []


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as listing:
            return sorted(listing, key=lambda e: e.name)
    except OSError:  # not made yet, or not readable: nothing of it is known
        return []


def _texts(
    entries: list[os.DirEntry[str]], wanted: Callable[[str], bool]
) -> Iterator[tuple[str, str]]:
    for entry in entries:
        if wanted(entry.name):
            try:
                with open(entry.path, encoding="utf-8", errors="replace") as handle:
                    yield entry.name, handle.read()
            except OSError:
                continue


def _each(
    entries: list[os.DirEntry[str]], wanted: Callable[[str], bool], parse: Callable[[str], T]
) -> list[T]:
    out = []
    for _, text in _texts(entries, wanted):
        try:
            out.append(parse(text))
        except ValueError:  # torn (a writer died mid-write) or not ours
            continue
    return out
