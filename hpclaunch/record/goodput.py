"""Goodput: what a job got out of its allocations, across all its runs (requeues).

The job's wall time (submit to its end, or to now while it lives) is cut into parts
that add up to it exactly:

    queue          submit -> the first run's start, and between runs
    startup        a run's start -> its first training step
    productive     training steps kept (a later attempt resumed after them, a checkpoint
                   or the job's end holds them)
    checkpoint     training blocked by checkpoint saves (``blocked_s`` of each save)
    lost           training that a later attempt did again
    unknown        training that a later attempt may have done again: where it resumed
                   and which checkpoint it resumed from hpclaunch did not see
    restarts       the last step of an attempt that failed -> the next one's first step
    hangs          the last step before a hang -> the end of that attempt
    shutdown       the last step of a run that ended on purpose -> the run's end

How much of an attempt's training is kept is told, best first, by where the next
attempt resumed (hpclaunch.record.attempts: the time this attempt passed that step, from
its progress samples), else by the last checkpoint it committed (hpclaunch's, Lightning's,
or a file matching --checkpoint-pattern) while the next has not shown where it resumed.
Where neither tells, the training is ``unknown``, never ``lost`` by a guess. A job that
never showed a training step has its runs' time ``unknown`` too, and no ratio.
``timeline`` is pure; ``of_record`` takes its inputs from a job record. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpclaunch.jobdir.history import Action
from hpclaunch.record.attempts import Attempt, of_job
from hpclaunch.record.checkpoints import Kind, Saved, known
from hpclaunch.record.job_record import JobRecord

PARTS = (
    "queue",
    "startup",
    "productive",
    "checkpoint",
    "lost",
    "unknown",
    "restarts",
    "hangs",
    "shutdown",
)
# Runs that ended this way end on purpose: the time after their last step is shut-down.
_ON_PURPOSE = ("completed", "time limit", "steps stopped", "cancelled")
_REQUEUED = (Action.REQUEUE.value, Action.SLURM_REQUEUES.value)


@dataclass(frozen=True)
class RunTimes:
    """One run as history.json has it."""

    requeue: int
    started: float
    ended: float | None  # None: running (or its end was never recorded)
    reason: str | None = None
    action: str | None = None


@dataclass(frozen=True)
class Segment:
    """A stretch of one run's time (or of the queue, requeue -1 before the first run)."""

    requeue: int
    part: str  # one of PARTS
    start: float
    end: float


@dataclass(frozen=True)
class Split:
    """The goodput of a job; seconds. ``ratio`` is productive over wall; with training of
    unknown fate, ``ratio_max`` is what it is if none of that was repeated."""

    wall_s: float
    queue_s: float
    startup_s: float
    productive_s: float
    checkpoint_s: float
    lost_s: float
    unknown_s: float
    restarts_s: float
    hangs_s: float
    shutdown_s: float
    ratio: float | None  # None: no wall time yet, or no training step seen at all
    ratio_max: float | None
    submitted: float
    until: float  # the job's end, or when this was worked out
    submit_known: bool  # False: the first run's start stands for the submit time
    stepped: bool = True  # False: no training step was ever seen

    def parts(self) -> dict[str, float]:
        return {part: getattr(self, f"{part}_s") for part in PARTS}

    def line(self) -> str:
        """``81.2 % of 1 h 02 min: productive 50 min, queue 3 min, ...``."""
        if not self.stepped:
            text = (
                f"unknown: no training step was seen in {duration(self.wall_s)} (a loop "
                "without a torch optimizer: call hpclaunch.progress.beat() at each step)"
            )
        else:
            if self.ratio is None:
                ratio = "-"
            elif self.ratio_max is not None and self.ratio_max > self.ratio:
                ratio = f"{self.ratio * 100:.1f} % to {self.ratio_max * 100:.1f} %"
            else:
                ratio = f"{self.ratio * 100:.1f} %"
            shown = [f"{part} {duration(s)}" for part, s in self.parts().items() if s >= 0.5]
            text = f"{ratio} of {duration(self.wall_s)}: " + ", ".join(shown or ["nothing yet"])
        return text + ("" if self.submit_known else " (submit time unknown: from the first run)")


@dataclass(frozen=True)
class Timeline:
    """The split and what it was cut from: each part's stretches, the runs and attempts."""

    split: Split
    segments: list[Segment] = field(default_factory=list)
    runs: list[RunTimes] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    saves: list[Saved] = field(default_factory=list)
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


def kept_until(
    attempt: Attempt, last: float, nxt: Attempt | None, expected: bool, saved: Sequence[Saved]
) -> tuple[float, str]:
    """Until when ``attempt``'s training (its first step to ``last``) is kept, and what
    comes after that: "lost", or "unknown" (the time is then where the known part ends).
    ``nxt``: the next attempt that stepped (None: none yet); ``expected``: one will come
    (the run was requeued or the group restarts)."""
    if nxt is None and not expected:
        return last, "lost"  # nothing repeats it: all kept
    first = attempt.first if attempt.first is not None else last
    if nxt is not None and nxt.resumed is not None and attempt.job_count:
        passed = attempt.passed(nxt.resumed) if nxt.resumed > 0 else first
        return (last if passed is None else min(max(passed, first), last)), "lost"
    stop = attempt.ended if attempt.ended is not None else last
    mine = [s for s in saved if first <= s.called <= max(stop, last)]
    if nxt is not None:
        # It stepped without showing a resume point: it did not resume through hpclaunch's
        # or Lightning's checkpoints. Only the script's own files (by pattern) still tell.
        mine = [s for s in mine if s.kind is Kind.PATTERN]
    if mine:
        newest = mine[-1]
        return min(newest.called + newest.blocked_s, last), "lost"
    return first, "unknown"


def _train(
    tiler: _Tiler, attempt: Attempt, last: float, keep: float, after: str, saved: Sequence[Saved]
) -> None:
    """The training of one attempt (its first step to ``last``) into ``tiler``: kept up to
    ``keep`` and ``after`` past it; hpclaunch's saves' blocking apart."""
    first = tiler.cursor
    blocking = [s for s in saved if s.kind is Kind.HPCLAUNCH and s.blocked_s > 0]
    for save in blocking:
        if save.called < first or save.called > keep:
            continue
        tiler.to(save.called, "productive")
        tiler.to(min(save.called + save.blocked_s, keep), "checkpoint")
    tiler.to(keep, "productive")
    tiler.to(last, after)


def _run(
    run: RunTimes,
    end: float,
    attempts: Sequence[Attempt],
    following: Attempt | None,
    expected: bool,
    saved: Sequence[Saved],
    hung: set[tuple[int, int]],
    live: bool,
) -> list[Segment]:
    """One run's segments over [run.started, end]. ``following``: the first attempt of a
    later run that stepped; ``expected``: a later run will come (the run was requeued);
    ``live``: the run is on its nodes now (its last attempt trains until ``end``)."""
    tiler = _Tiler(run.requeue, run.started, end)
    waiting = "startup"
    stepped = [a for a in attempts if a.first is not None]
    for index, attempt in enumerate(stepped):
        # Before a first step no event told, training may already have begun.
        tiler.to(attempt.first, waiting if attempt.first_known else "unknown")
        is_last = index == len(stepped) - 1
        running = live and is_last and attempt.ended is None
        last = end if running else attempt.last or attempt.first or end
        # A save the attempt made after its last noted step (a lost node notes no end):
        # training went on at least until then.
        stop = attempt.ended if attempt.ended is not None else end
        last = max([last, *(s.called + s.blocked_s for s in saved if last < s.called <= stop)])
        nxt = stepped[index + 1] if not is_last else following
        keep, after = kept_until(attempt, last, nxt, not is_last or expected, saved)
        _train(tiler, attempt, last, keep, after, saved)
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
    saved: Sequence[Saved],
    hung: set[tuple[int, int]],
    submitted: float | None,
    now: float,
    final: bool,
    running: bool = False,
) -> Timeline | None:
    """The job's goodput and its stretches, from plain data: ``attempts`` by requeue,
    ``saved`` the job's checkpoints, ``hung`` the (requeue, attempt) pairs a hang ended,
    ``final``: the job has ended (SLURM says so), else its time runs to ``now``;
    ``running``: the job is on its nodes now (SLURM says RUNNING), so its last run goes
    on until ``now`` when it recorded no end. None without a run. Pure."""
    if not runs:
        return None
    runs = sorted(runs, key=lambda r: r.started)
    start = runs[0].started if submitted is None else min(submitted, runs[0].started)
    live = running and not final
    last = runs[-1]
    last_end = now if live and last.ended is None else _seen_until(last, attempts)
    until = max(last_end if final else now, start)
    stepped = any(a.first is not None for found in attempts.values() for a in found)
    queue = _Tiler(-1, start, until)
    segments: list[Segment] = []
    for index, run in enumerate(runs):
        queue.to(run.started, "queue")
        begun = queue.cursor  # runs do not overlap, whatever their records say
        following_at = runs[index + 1].started if index + 1 < len(runs) else until
        # A run with no recorded end: the next run's start ends it; the last one goes on
        # while the job runs, else it ended after the last thing it was seen doing.
        own = run.ended if run.ended is not None else following_at
        if run is last and run.ended is None:
            own = last_end
        end = max(min(following_at, until, own), begun)
        later = [a for r in runs[index + 1 :] for a in attempts.get(r.requeue, ()) if a.first]
        expected = index + 1 < len(runs) or (run.action in _REQUEUED and not final)
        moved = RunTimes(run.requeue, begun, run.ended, run.reason, run.action)
        if stepped:
            mine = attempts.get(run.requeue, ())
            nxt = later[0] if later else None
            live_run = live and run is last
            segments += _run(moved, end, mine, nxt, expected, saved, hung, live_run)
        elif end > begun:  # no step seen anywhere: training cannot be told from waiting
            segments.append(Segment(run.requeue, "unknown", begun, end))
        queue.cursor = end
    queue.to(until, "queue")
    segments = sorted(segments + queue.segments, key=lambda s: s.start)
    totals = dict.fromkeys(PARTS, 0.0)
    for segment in segments:
        totals[segment.part] += segment.end - segment.start
    wall = until - start
    shares = {f"{part}_s": round(totals[part], 3) for part in PARTS}
    ratio = round(totals["productive"] / wall, 4) if wall > 0 and stepped else None
    best = totals["productive"] + totals["unknown"]
    ratio_max = round(best / wall, 4) if ratio is not None and totals["unknown"] > 0 else None
    split = Split(
        wall_s=round(wall, 3),
        **shares,
        ratio=ratio,
        ratio_max=ratio_max,
        submitted=start,
        until=until,
        submit_known=submitted is not None,
        stepped=stepped,
    )
    found = [a for requeue in sorted(attempts) for a in attempts[requeue]]
    return Timeline(split, segments, list(runs), found, list(saved), sorted(hung))


def _seen_until(run: RunTimes, attempts: Mapping[int, Sequence[Attempt]]) -> float:
    """When ``run`` ended, or, when it recorded no end, the last thing it was seen
    doing (an attempt's end, last step, first step or start)."""
    if run.ended is not None:
        return run.ended
    mine = attempts.get(run.requeue, ())
    times = [t for a in mine for t in (a.ended, a.last, a.first, a.began) if t is not None]
    return max([run.started, *times])


def of_record(
    record: JobRecord, submitted: float | None, now: float, final: bool, running: bool = False
) -> Timeline | None:
    """The goodput of the job ``record`` holds (``submitted``: the job list's submit time,
    None when unknown; ``final``, ``running``: as ``timeline`` takes them); None before
    its first run."""
    runs = [
        RunTimes(r.requeue_count, r.started, r.ended, r.reason, r.action)
        for r in record.history.runs
    ]
    hung = {(r.requeue, r.attempt) for run in record.runs.values() for r in run.hangs}
    return timeline(runs, of_job(record), known(record), hung, submitted, now, final, running)
