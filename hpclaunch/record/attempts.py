"""Each attempt of the worker group, every node's events and notes merged: when it began,
stepped first and last, and ended; the steps it did; and, when a worker saw it, the step
it resumed from. Pure.

Steps are counted as steps done (a checkpoint of the script's step S, the index of the
step just done, holds S + 1). An attempt's count is **the job's** (comparable with other
attempts' and with what checkpoints hold) when its workers saw where they resumed
(hpclaunch's checkpoint, the optimizer's restored step count, the script's own step
numbers, Lightning's callback), or when it is the job's very first attempt (which starts
the job's count). Otherwise it counts from the attempt's own start, and where it began in
the job's count is unknown.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from hpclaunch.jobdir.attempts import BEGIN, END, FIRST, STEP, STOP, AttemptEvent
from hpclaunch.jobdir.progress_notes import NodeProgress
from hpclaunch.record.job_record import JobRecord, RunRecord


@dataclass(frozen=True)
class Attempt:
    """One attempt of the worker group (run ``requeue``, rendezvous round ``attempt``),
    its nodes' events and notes merged."""

    requeue: int
    attempt: int
    began: float | None
    first: float | None  # the first step's wall time
    first_step: int | None  # steps done once its first step was (the lowest node's)
    last: float | None  # the last step's wall time (None: no step known)
    last_step: int | None  # steps done at its last step (the lowest node's)
    ended: float | None  # the group's end (None: not recorded: running, or nodes lost)
    resumed: int | None = None  # steps done before its first step, in the job's count
    resumed_by: str | None = None  # how a worker saw that (progress_notes.RESUMED_BY)
    job_count: bool = False  # its step counts are the job's (see the module)
    samples: tuple[tuple[float, int], ...] = ()  # (wall time, steps done), by time
    # False: no node's first-step event was read, so ``first`` is only the earliest
    # progress sample (the training began at that time or before).
    first_known: bool = True
    # Whether a node logged the attempt's end, or its count when a stop signal came: then
    # ``last_step`` is the attempt's last; else only its newest progress sample, a floor.
    end_known: bool = False

    @property
    def stepped(self) -> bool:
        return self.first is not None

    @property
    def steps(self) -> int | None:
        """The steps this attempt did itself; None when its first step is not known and
        its count does not start at it."""
        if self.last_step is None:
            return None
        if self.first_step is not None:
            return self.last_step - self.first_step + 1
        if self.resumed is not None:
            return self.last_step - self.resumed
        return None if self.job_count else self.last_step

    def passed(self, steps: int) -> float | None:
        """When this attempt had done ``steps`` (in its own count), from its samples taken
        as its nodes noted progress: exact at a sample, else between the two samples
        around it (at most a note's interval apart); None when no sample reaches it."""
        before: tuple[float, int] | None = None
        for when, done in self.samples:
            if done >= steps:
                if before is None:
                    return when
                share = (steps - before[1]) / (done - before[1])
                return before[0] + (when - before[0]) * share
            before = (when, done)
        return None


def of_run(run: RunRecord, first_of_job: bool) -> list[Attempt]:
    """Run ``run``'s attempts, oldest first; ``first_of_job``: this run is the job's first
    (its first attempt starts the job's count)."""
    numbers = sorted({e.attempt for e in run.events} | {n.attempt for n in run.notes})
    return [
        _merge(
            run.requeue,
            number,
            [e for e in run.events if e.attempt == number],
            [n for n in run.notes if n.attempt == number and n.ranks],
            first_of_job and number == 0,
        )
        for number in numbers
    ]


def of_job(record: JobRecord) -> dict[int, list[Attempt]]:
    """Every run's attempts, by requeue count."""
    first = min(record.runs, default=None)
    return {q: of_run(run, q == first) for q, run in record.runs.items()}


def _merge(
    requeue: int,
    number: int,
    events: Sequence[AttemptEvent],
    notes: Sequence[NodeProgress],
    starts_job: bool,
) -> Attempt:
    """One attempt from its nodes' events and latest notes: the earliest begin, first step
    and end, the latest last-step time and the lowest last step (the step all nodes
    reached)."""
    begins = [e.time for e in events if e.event == BEGIN]
    firsts = [e for e in events if e.event == FIRST]
    first = min(firsts, key=lambda e: e.time, default=None)
    ends = [e for e in events if e.event == END]
    lasts = [e for e in ends if e.step_time is not None and e.step is not None]
    if not lasts:  # no node logged its end, but a stop signal's count: the run's last
        lasts = [
            e for e in events if e.event == STOP and e.step_time is not None and e.step is not None
        ]
    last = max((e.step_time for e in lasts if e.step_time), default=None)
    last_step = min((e.step for e in lasts if e.step is not None), default=None)
    steps = [(e.time, e.step) for e in events if e.event == STEP and e.step is not None]
    if last is None and notes:
        # No end noted (a lost node writes none, and a survivor killed first neither): the
        # newest note says the most. An older note of a lost node is a count from before:
        # ranks that step together had all done about as many as the newest one says.
        newest = max(notes, key=lambda n: n.time - min(r.idle_s for r in n.ranks))
        last = newest.time - min(r.idle_s for r in newest.ranks)
        last_step = min(r.step for r in newest.ranks)
    elif last is None and steps:  # nor a note of this attempt: its last progress sample
        last, last_step = max(steps)
    first_time, first_step = (first.time, first.step) if first else (None, None)
    samples = _samples(events, notes, last, last_step)
    if first_time is None and samples:  # stepped before its first event was written
        first_time = samples[0][0]
    resumed, resumed_by = _resumed(events, notes)
    job_count = resumed is not None or starts_job or _numbered(notes)
    return Attempt(
        requeue,
        number,
        min(begins, default=None),
        first_time,
        first_step,
        last,
        last_step,
        min((e.time for e in ends), default=None),
        resumed,
        resumed_by,
        job_count,
        samples,
        first is not None,
        bool(lasts),
    )


def _resumed(
    events: Sequence[AttemptEvent], notes: Sequence[NodeProgress]
) -> tuple[int | None, str | None]:
    """The step the attempt resumed from, as its workers saw it: known only when every
    node that stepped saw one and all saw the same (a node that saw none, or another
    one, leaves it unknown: the ranks would not count alike)."""
    seen: dict[str, list[tuple[int | None, str | None]]] = {}
    for event in events:
        if event.event == FIRST:  # the node's ranks' agreed resume point, or None
            seen.setdefault(event.node, []).append((event.resumed, event.resumed_by))
    for note in notes:
        for rank in note.ranks:
            seen.setdefault(note.node, []).append((rank.resumed, rank.resumed_by))
    said = [pair for pairs in seen.values() for pair in pairs]
    points = Counter(point for point, _ in said)
    if not said or len(points) != 1 or None in points:
        return None, None
    point = next(iter(points))
    return point, next(how for p, how in said if p == point)


def _numbered(notes: Sequence[NodeProgress]) -> bool:
    """Whether every rank's count is the job's by its own word (``job_steps``)."""
    ranks = [r for n in notes for r in n.ranks]
    return bool(ranks) and all(r.job_steps for r in ranks)


def _samples(
    events: Sequence[AttemptEvent],
    notes: Sequence[NodeProgress],
    last: float | None,
    last_step: int | None,
) -> tuple[tuple[float, int], ...]:
    """(time, steps done) the attempt passed, the lowest node's at each time."""
    points = [(e.time, e.step) for e in events if e.event in (FIRST, STEP) and e.step is not None]
    points += [
        (e.step_time, e.step)
        for e in events
        if e.event == END and e.step_time is not None and e.step is not None
    ]
    points += [
        (n.time - min(r.idle_s for r in n.ranks), min(r.step for r in n.ranks)) for n in notes
    ]
    if last is not None and last_step is not None:
        points.append((last, last_step))
    ordered: list[tuple[float, int]] = []
    for when, done in sorted(points):
        # Nodes step together: a node behind the others by a note's age would make the
        # count go down; keep the count from going back.
        if ordered and done < ordered[-1][1]:
            continue
        ordered.append((when, done))
    return tuple(ordered)
