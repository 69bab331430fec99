"""What ``hpclaunch status`` and ``--follow`` say about the training itself: the step
(out of how many), the rate, the time left, the script's last metrics, the node that is
clearly slower, and why the worker group restarted in place. Pure functions of the job
record (the clock is a parameter). No torch."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace

from hpclaunch.jobdir import failures
from hpclaunch.jobdir.attempts import END, FIRST, STEP, AttemptEvent
from hpclaunch.jobdir.layout import AttemptFolder
from hpclaunch.jobdir.progress_notes import NodeProgress
from hpclaunch.record.attempts import Attempt
from hpclaunch.record.goodput import duration
from hpclaunch.record.job_record import RunRecord
from hpclaunch.record.lost_work import resumed_from

# A node whose steps per second are below this share of the fastest node's, and whose
# count is behind the others' by more than the time between their notes explains, is
# named: ranks that step together show the same rate and the same count, so a gap in the
# rate alone (one note written early in the attempt, one later) names nobody.
SLOWER = 0.9
BEHIND_STEPS = 2
# From how long without a step the progress line says so (a hang, a pause, or the end),
# and gives no time left.
IDLE_SHOWN_S = 30.0
# Metrics shown (the first this many, in the order the script reported them).
METRICS_SHOWN = 4


@dataclass(frozen=True)
class Training:
    """The latest attempt's progress, as its nodes noted it (``--json``'s ``training``)."""

    step: int | None  # steps done by every rank, in the job's count; None: unknown
    counted: int  # steps done in this attempt
    total: int | None  # the steps the run is to take, when the script said
    steps_per_s: float | None  # the slowest node's, over the attempt so far
    eta_s: float | None  # time left at that rate; None when unknown or not stepping
    metrics: dict[str, float] = field(default_factory=dict)  # the lowest rank's latest
    attempt: int = 0
    run: int = 0  # the requeue count of the run the notes are of
    noted: float = 0.0  # when the newest note was written (seconds since the epoch)
    idle_s: float = 0.0  # since the last step, as of the look
    resumed: int | None = None  # the step the attempt resumed from, when seen
    resumed_by: str | None = None
    slowest_node: str | None = None  # named when clearly slower than the others
    slowest_s_per_step: float | None = None
    others_s_per_step: float | None = None


def of_run(
    run: RunRecord,
    attempts: Sequence[Attempt],
    now: float,
    nodes: Collection[str] = (),
) -> Training | None:
    """The progress of run ``run``'s latest attempt with notes (``attempts``: the run's,
    hpclaunch.record.attempts); ``nodes``: the nodes the run has now, when known (a lost
    node's last note says nothing of the run any more). None without progress."""
    notes = [n for n in run.notes if n.ranks and (not nodes or n.node in nodes)]
    if not notes:
        return None
    attempt = max(n.attempt for n in notes)
    latest = [n for n in notes if n.attempt == attempt]
    merged = next((a for a in attempts if a.attempt == attempt), None)
    lowest = min(r.step for n in latest for r in n.ranks)
    first_step = merged.first_step if merged is not None else None
    counted = lowest - first_step + 1 if first_step is not None else lowest
    step = lowest if merged is not None and merged.job_count else None
    rates = {
        n.node: min((r.steps_per_s for r in n.ranks if r.steps_per_s), default=None) for n in latest
    }
    known = {node: rate for node, rate in rates.items() if rate}
    noted = max(n.time for n in latest)
    # A node whose notes stopped (lost, or its agent stuck) has not stepped since either.
    idle = max(now - n.time + min(r.idle_s for r in n.ranks) for n in latest)
    total = max((n.total for n in latest if n.total is not None), default=None)
    rate = min(known.values()) if known else None
    eta = None
    if step is not None and total is not None and step < total and rate and idle < IDLE_SHOWN_S:
        eta = (total - step) / rate
    with_metrics = [n for n in latest if n.metrics]
    first = min(with_metrics, key=lambda n: n.metrics_rank or 0) if with_metrics else None
    training = Training(
        step,
        counted,
        total,
        rate,
        eta,
        dict(first.metrics) if first else {},
        attempt,
        run.requeue,
        noted,
        max(idle, 0.0),
        merged.resumed if merged is not None else None,
        merged.resumed_by if merged is not None else None,
    )
    slow = slowest(latest, run.events)
    if slow is not None:
        node, mine, others = slow
        training = replace(
            training, slowest_node=node, slowest_s_per_step=1 / mine, others_s_per_step=1 / others
        )
    return training


def slowest(
    notes: Sequence[NodeProgress], events: Sequence[AttemptEvent] = ()
) -> tuple[str, float, float] | None:
    """The node clearly slower than the others, its steps per second and the fastest
    other's; None when none is. Pure.

    Ranks that step together have the same count at the same moment, whatever their
    rates over different stretches say. So a node is named only when its rate is below
    SLOWER of the fastest other's *and*, at every moment two of its progress samples
    (``events``: the attempt's, and its note) share with each other node's, its count is
    behind that node's by more than BEHIND_STEPS (and 5 %), at two moments at least, the
    gap not shrinking."""
    rates = {
        n.node: min((r.steps_per_s for r in n.ranks if r.steps_per_s), default=0.0) for n in notes
    }
    known = {node: rate for node, rate in rates.items() if rate > 0}
    if len(known) < 2:
        return None
    node = min(known, key=lambda name: known[name])
    fastest = max(rate for name, rate in known.items() if name != node)
    if known[node] >= SLOWER * fastest:
        return None
    attempt = max(n.attempt for n in notes)
    samples = {n.node: _samples(n, [e for e in events if e.attempt == attempt]) for n in notes}
    mine = samples[node]
    for other, theirs in samples.items():
        if other == node or other not in known:
            continue
        gaps = [
            (count - done, done)
            for when, done in mine
            if (count := _count_at(theirs, when)) is not None
        ]
        behind = [gap > max(BEHIND_STEPS, 0.05 * done) for gap, done in gaps]
        if len(gaps) < 2 or not all(behind) or gaps[-1][0] < gaps[0][0]:
            return None  # not behind that one all along: the counts say nobody is slow
    return node, known[node], fastest


def _samples(note: NodeProgress, events: Sequence[AttemptEvent]) -> list[tuple[float, int]]:
    """(time, steps done) a node noted in an attempt: its events', then its note's."""
    points = [
        (e.step_time if e.event == END and e.step_time is not None else e.time, e.step)
        for e in events
        if e.node == note.node and e.event in (FIRST, STEP, END) and e.step is not None
    ]
    points.append((note.time - min(r.idle_s for r in note.ranks), min(r.step for r in note.ranks)))
    return sorted(set(points))


def _count_at(samples: Sequence[tuple[float, int]], when: float) -> float | None:
    """A node's count at ``when``, between two of its samples; None outside them."""
    for (t0, c0), (t1, c1) in itertools.pairwise(samples):
        if t0 <= when <= t1:
            return c0 if t1 == t0 else c0 + (c1 - c0) * (when - t0) / (t1 - t0)
    return None


def line(training: Training, now: float) -> str:
    """``step 120 of 1000 (12 %), 3.41 steps/s, ETA 4 min 18 s; loss 0.312 (attempt 0,
    noted 3 s ago)``, with ``no step for N s`` and the slowest node when they apply."""
    if training.step is not None:
        text = f"step {training.step}"
        if training.total:
            share = min(100, 100 * training.step // training.total)
            text += f" of {training.total} ({share} %)"
    else:
        text = (
            f"{training.counted} steps since attempt {training.attempt} began, from a step "
            "hpclaunch did not see"
        )
        if training.total:
            text += f" (of {training.total})"
    if training.idle_s >= IDLE_SHOWN_S:
        text += f", no step for {training.idle_s:.0f} s"
    if training.steps_per_s:
        text += f", {training.steps_per_s:.2f} steps/s"
    if training.eta_s is not None:
        text += f", ETA {duration(training.eta_s)}"
    shown = list(training.metrics.items())[:METRICS_SHOWN]
    if shown:
        text += "; " + ", ".join(f"{key} {value:.4g}" for key, value in shown)
    resumed = ""
    if training.resumed is not None and training.resumed > 0:
        resumed = f", {resumed_from(training.resumed, training.resumed_by)}"
    text += (
        f" (attempt {training.attempt}{resumed}, noted {max(now - training.noted, 0):.0f} s ago)"
    )
    if training.slowest_node and training.slowest_s_per_step and training.others_s_per_step:
        text += (
            f"; slowest node {training.slowest_node} ({training.slowest_s_per_step:.3f} "
            f"s/step, the others {training.others_s_per_step:.3f})"
        )
    return text


def restarts(run: RunRecord, logs: Iterable[AttemptFolder]) -> list[str]:
    """Why each in-place restart of ``run`` happened, oldest first: ``attempt 1 began
    after attempt 0 failed: rank 3 on n2: hung: ...`` (attempts are numbered from 0, as
    the folders and HPCLAUNCH_ATTEMPT are)."""
    failed = sorted({r.attempt for r in run.failures})
    started = {a.attempt for a in logs if a.requeue == run.requeue}
    out = []
    for attempt in failed:
        if attempt + 1 not in started:
            continue  # the run's last attempt: the run ended, it did not restart
        cause = why(r for r in run.failures if r.attempt == attempt)
        out.append(f"attempt {attempt + 1} began after attempt {attempt} failed: {cause}")
    return out


def why(records: Iterable[failures.NodeRecord]) -> str:
    """The first error of the attempt's own (a rank's, not an echo of another's): ``rank
    3 on n2: <its message>``; else the first rank that failed."""
    found = sorted(records, key=lambda r: r.time)
    for record in found:
        for worker in record.own_errors:
            return f"rank {worker.rank} on {record.node}: {worker.message}"
    for record in found:
        for worker in record.workers:
            return f"rank {worker.rank} on {record.node}: {worker.message}"
    return "no failure record says why"
