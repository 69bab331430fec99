"""Goodput: what a job got out of its allocations, across all its runs (requeues).

The job's wall time (submit to its end, or to now while it lives) is cut into parts
that add up to it exactly:

    queue          submit -> the first run's start, and between runs
    startup        a run's start -> its first training step
    productive     training steps kept (a checkpoint or the job's end holds them)
    checkpoint     training blocked by checkpoint saves (``blocked_s`` of each save)
    lost           training after the last checkpoint of an attempt that ended, which
                   the next attempt repeats
    restarts       the last step of an attempt that failed -> the next one's first step
    hangs          the last step before a hang -> the end of that attempt
    shutdown       the last step of a run that ended on purpose -> the run's end

The inputs are plain data (history's runs, the agents' attempt events and progress
notes, the saves, the hang reports; ``of_folder`` reads them from a job folder), and
``split`` is pure. No torch, no SLURM.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from hpclaunch.checkpoint import store
from hpclaunch.jobdir import attempts, hangs, lost_work, saves
from hpclaunch.jobdir.attempts import BEGIN, END, FIRST, AttemptEvent
from hpclaunch.jobdir.hangs import NodeProgress
from hpclaunch.jobdir.history import History, HistoryError
from hpclaunch.jobdir.layout import JobFolder

PARTS = ("queue", "startup", "productive", "checkpoint", "lost", "restarts", "hangs", "shutdown")
# Runs that ended this way end on purpose: the time after their last step is shut-down.
_ON_PURPOSE = ("completed", "time limit", "steps stopped", "cancelled")


@dataclass(frozen=True)
class RunTimes:
    """One run as history.json has it."""

    requeue: int
    started: float
    ended: float | None  # None: running (or its end was never recorded)
    reason: str | None = None


@dataclass(frozen=True)
class Attempt:
    """One attempt of the worker group, every node's events merged."""

    requeue: int
    attempt: int
    began: float | None
    first: float | None  # the first step's time
    first_step: int | None
    last: float | None  # the last step's time (None: no step known)
    last_step: int | None
    ended: float | None  # the group's end (None: not recorded: running, or nodes lost)


@dataclass(frozen=True)
class Save:
    step: int
    called: float  # when training asked for it: ``ended - total_s``
    blocked_s: float


@dataclass(frozen=True)
class Segment:
    """A stretch of one run's time (or of the queue, requeue -1 before the first run)."""

    requeue: int
    part: str  # one of PARTS
    start: float
    end: float


@dataclass(frozen=True)
class Split:
    """The goodput of a job; seconds. ``ratio`` is productive over wall."""

    wall_s: float
    queue_s: float
    startup_s: float
    productive_s: float
    checkpoint_s: float
    lost_s: float
    restarts_s: float
    hangs_s: float
    shutdown_s: float
    ratio: float | None  # None: no wall time yet
    submitted: float
    until: float  # the job's end, or when this was worked out
    submit_known: bool  # False: the first run's start stands for the submit time

    def parts(self) -> dict[str, float]:
        return {part: getattr(self, f"{part}_s") for part in PARTS}

    def line(self) -> str:
        """``goodput 81.2 % of 1 h 02 min: productive 50 min, queue 3 min, ...``."""
        ratio = f"{self.ratio * 100:.1f} %" if self.ratio is not None else "-"
        shown = [f"{part} {duration(s)}" for part, s in self.parts().items() if s >= 0.5]
        text = f"{ratio} of {duration(self.wall_s)}: " + ", ".join(shown or ["nothing yet"])
        return text + ("" if self.submit_known else " (submit time unknown: from the first run)")


@dataclass(frozen=True)
class Timeline:
    """The split and what it was cut from: each part's stretches, and the attempts."""

    split: Split
    segments: list[Segment] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    saves: list[Save] = field(default_factory=list)
    hung: list[tuple[int, int]] = field(default_factory=list)


def duration(seconds: float) -> str:
    """A length of time as people say it: ``45 s``, ``4 min 18 s``, ``2 h 05 min``,
    ``3 d 04 h`` (status's goodput and ETA, the report)."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"


def merge(requeue: int, events: Sequence[AttemptEvent]) -> list[Attempt]:
    """One run's attempts from every node's events: the earliest begin, first step and
    end, the latest last-step time and the lowest last step (the step all nodes
    reached). Pure."""
    out = []
    for number in sorted({e.attempt for e in events}):
        mine = [e for e in events if e.attempt == number]
        begins = [e.time for e in mine if e.event == BEGIN]
        firsts = [e for e in mine if e.event == FIRST]
        ends = [e for e in mine if e.event == END]
        first = min(firsts, key=lambda e: e.time, default=None)
        lasts = [e for e in ends if e.step_time is not None]
        steps = [e.step for e in lasts if e.step is not None]
        out.append(
            Attempt(
                requeue,
                number,
                min(begins, default=None),
                first.time if first else None,
                first.step if first else None,
                max((e.step_time for e in lasts if e.step_time), default=None),
                min(steps, default=None),
                min((e.time for e in ends), default=None),
            )
        )
    return out


class _Tiler:
    """Cuts [start, end] into segments in time order: each ``to`` claims from where the
    previous one stopped, so the parts add up to the whole even when clocks disagree."""

    def __init__(self, requeue: int, start: float, end: float) -> None:
        self.requeue, self.cursor, self.end = requeue, start, end
        self.segments: list[Segment] = []

    def to(self, when: float | None, part: str) -> None:
        if when is None:
            return
        stop = min(max(when, self.cursor), self.end)
        if stop > self.cursor:
            last = self.segments[-1] if self.segments else None
            if last is not None and last.part == part and last.end == self.cursor:
                self.segments[-1] = Segment(self.requeue, part, last.start, stop)
            else:
                self.segments.append(Segment(self.requeue, part, self.cursor, stop))
            self.cursor = stop


def _train(tiler: _Tiler, attempt: Attempt, last: float, lost: bool, saves: Sequence[Save]) -> None:
    """The training of one attempt (its first step to ``last``) into ``tiler``: kept
    up to its last checkpoint and lost after it when ``lost``; saves' blocking apart."""
    first = tiler.cursor
    done = [s for s in saves if first <= s.called <= last]
    ended = attempt.ended if attempt.ended is not None else last
    # A save taken before the attempt ended holds the steps before it was called.
    kept = [s.called + s.blocked_s for s in saves if first <= s.called <= min(last, ended)]
    keep_until = min(max([first, *kept]), last) if lost else last
    for save in done:
        if save.called > keep_until:
            break
        tiler.to(save.called, "productive")
        tiler.to(min(save.called + save.blocked_s, keep_until), "checkpoint")
    tiler.to(keep_until, "productive")
    tiler.to(last, "lost")


def _run(
    run: RunTimes,
    end: float,
    attempts: Sequence[Attempt],
    later: bool,
    saves: Sequence[Save],
    hung: set[tuple[int, int]],
) -> list[Segment]:
    """One run's segments over [run.started, end]. ``later``: an attempt comes after
    this run's last (a later run): its unsaved steps are lost."""
    tiler = _Tiler(run.requeue, run.started, end)
    waiting = "startup"
    for index, attempt in enumerate(attempts):
        if attempt.first is None:
            continue
        tiler.to(attempt.first, waiting)
        is_last = index == len(attempts) - 1
        running = is_last and run.ended is None and attempt.ended is None
        last = end if running else attempt.last or attempt.first
        # A save the attempt made after its last noted step (a lost node notes no end):
        # training went on at least until then.
        stop = attempt.ended if attempt.ended is not None else end
        last = max([last, *(s.called + s.blocked_s for s in saves if last < s.called <= stop)])
        _train(tiler, attempt, last, lost=not is_last or later, saves=saves)
        if (attempt.requeue, attempt.attempt) in hung:
            tiler.to(attempt.ended, "hangs")
            waiting = "restarts"
        elif not is_last:
            waiting = "restarts"
        else:
            waiting = "shutdown" if run.reason in _ON_PURPOSE else "restarts"
    tiler.to(end, waiting)
    return tiler.segments


def timeline(
    runs: Sequence[RunTimes],
    attempts: Mapping[int, Sequence[Attempt]],
    saves: Sequence[Save],
    hung: set[tuple[int, int]],
    submitted: float | None,
    now: float,
    final: bool,
) -> Timeline | None:
    """The job's goodput and its stretches, from plain data: ``attempts`` by requeue,
    ``hung`` the (requeue, attempt) pairs a hang ended, ``final``: the job has ended
    (SLURM says so), else its time runs to ``now``. None without a run. Pure."""
    if not runs:
        return None
    runs = sorted(runs, key=lambda r: r.started)
    start = runs[0].started if submitted is None else min(submitted, runs[0].started)
    ends = [r.ended for r in runs if r.ended is not None]
    until = (runs[-1].ended or max([runs[-1].started, *ends])) if final else now
    until = max(until, start)
    queue = _Tiler(-1, start, until)
    segments: list[Segment] = []
    for index, run in enumerate(runs):
        queue.to(run.started, "queue")
        begun = queue.cursor  # runs do not overlap, whatever their records say
        following = runs[index + 1].started if index + 1 < len(runs) else until
        end = min(following, until, following if run.ended is None else run.ended)
        end = max(end, begun)
        later = any(attempts.get(r.requeue) for r in runs[index + 1 :])
        found = [a for a in attempts.get(run.requeue, ()) if a.first is not None]
        segments += _run(replace(run, started=begun), end, found, later, saves, hung)
        queue.cursor = end
    queue.to(until, "queue")
    segments = sorted(segments + queue.segments, key=lambda s: s.start)
    totals = dict.fromkeys(PARTS, 0.0)
    for segment in segments:
        totals[segment.part] += segment.end - segment.start
    wall = until - start
    shares = {f"{part}_s": round(totals[part], 3) for part in PARTS}
    split = Split(
        wall_s=round(wall, 3),
        **shares,
        ratio=round(totals["productive"] / wall, 4) if wall > 0 else None,
        submitted=start,
        until=until,
        submit_known=submitted is not None,
    )
    found = [a for requeue in sorted(attempts) for a in attempts[requeue]]
    return Timeline(split, segments, found, list(saves), sorted(hung))


def with_notes(found: Sequence[Attempt], notes: Sequence[NodeProgress]) -> list[Attempt]:
    """``found`` with the last step of an attempt that recorded no end taken from the
    nodes' progress notes (a lost node writes none; its note is at most NOTE_S old). Pure."""
    out = []
    for attempt in found:
        mine = [n for n in notes if n.attempt == attempt.attempt and n.ranks]
        if attempt.last is None and mine:
            last = max(n.time - min(r.idle_s for r in n.ranks) for n in mine)
            step = min(r.step for n in mine for r in n.ranks)
            attempt = replace(attempt, last=last, last_step=step)
        out.append(attempt)
    return out


def of_folder(
    folder: Path, job_id: int, submitted: float | None, now: float, final: bool
) -> Timeline | None:
    """The goodput of the job whose folder is ``folder`` (``submitted``: the job list's
    submit time, None when unknown); None before its first run. Raises HistoryError
    when history.json cannot be read."""
    job = JobFolder(folder)
    history = History.load(folder, job_id)
    runs = [RunTimes(r.requeue_count, r.started, r.ended, r.reason) for r in history.runs]
    found = {
        run.requeue: with_notes(
            merge(run.requeue, attempts.read(job, run.requeue)),
            hangs.read_progress(job, run.requeue),
        )
        for run in runs
    }
    records = [Save(r.step, r.ended - r.total_s, r.blocked_s) for r in saves.records(job.saves)]
    # StopCheckpoint's Lightning checkpoints note no save record: their commit time.
    ckpt_dir = Path(history.checkpoint_dir) if history.checkpoint_dir else job.checkpoints
    own = [
        Save(c.steps - 1, c.time, 0.0)
        for c in lost_work.checkpoints(job, ckpt_dir)
        if c.label.startswith(store.LIGHTNING_FOLDER)
    ]
    kept = sorted(records + own, key=lambda s: s.called)
    hung = {(r.requeue, r.attempt) for r in hangs.read_reports(job)}
    return timeline(runs, found, kept, hung, submitted, now, final)


def summary(folder: Path, job_id: int, submitted: float | None, final: bool) -> Split | None:
    """``hpclaunch status``'s goodput: None before the first run, or when history.json
    cannot be read (status notes that already)."""
    try:
        found = of_folder(folder, job_id, submitted, time.time(), final)
    except HistoryError:
        return None
    return found.split if found else None
