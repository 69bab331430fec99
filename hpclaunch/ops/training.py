"""What ``hpclaunch status`` and ``--follow`` say about the training itself: the step
(out of how many), the rate, the time left, the script's last metrics, why the worker
group restarted in place, and the work each run lost. From the job folder: the agents'
progress notes (hpclaunch.jobdir.hangs), the failure records and the checkpoints
(hpclaunch.jobdir.lost_work). Pure but for the clock and the folder reads. No torch."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from hpclaunch.jobdir import failures
from hpclaunch.jobdir.goodput import duration
from hpclaunch.jobdir.hangs import NodeProgress
from hpclaunch.jobdir.layout import JobFolder

# A node whose steps per second are below this share of the fastest node's is named.
SLOWER = 0.9
# From how long without a step the progress line says so (a hang, a pause, or the end),
# and gives no time left.
IDLE_SHOWN_S = 30.0
# Metrics shown (the first this many, in the order the script reported them).
METRICS_SHOWN = 4


@dataclass(frozen=True)
class Training:
    """The latest attempt's progress, as its nodes noted it (``--json``'s ``training``)."""

    step: int  # steps done by every rank (the job's count when it resumed through hpclaunch)
    total: int | None  # the steps the run is to take, when the script said
    steps_per_s: float | None  # the slowest node's, over the attempt so far
    eta_s: float | None  # time left at that rate; None when unknown or not stepping
    metrics: dict[str, float] = field(default_factory=dict)  # the lowest rank's latest
    attempt: int = 0
    run: int = 0  # the requeue count of the run the notes are of
    noted: float = 0.0  # when the newest note was written (seconds since the epoch)
    idle_s: float = 0.0  # since the last step, as of the look
    slowest_node: str | None = None  # named when clearly slower than the others
    slowest_s_per_step: float | None = None
    others_s_per_step: float | None = None


def of_notes(
    notes: Sequence[NodeProgress], now: float | None = None, run: int = 0
) -> Training | None:
    """The progress of the latest attempt the ``notes`` (of run ``run``) speak of; None
    without progress."""
    if not notes:
        return None
    attempt = max(n.attempt for n in notes)
    latest = [n for n in notes if n.attempt == attempt and n.ranks]
    if not latest:
        return None
    now = time.time() if now is None else now
    step = min(r.step for n in latest for r in n.ranks)
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
    if total is not None and step < total and rate and idle < IDLE_SHOWN_S:
        eta = (total - step) / rate
    with_metrics = [n for n in latest if n.metrics]
    first = min(with_metrics, key=lambda n: n.metrics_rank or 0) if with_metrics else None
    training = Training(
        step,
        total,
        rate,
        eta,
        dict(first.metrics) if first else {},
        attempt,
        run,
        noted,
        max(idle, 0.0),
    )
    if known:
        slowest = min(known, key=lambda node: known[node])
        others = [r for node, r in known.items() if node != slowest]
        # Ranks that step together all show the same rate; only a gap says which is slow.
        if others and known[slowest] < SLOWER * max(others):
            return replace(
                training,
                slowest_node=slowest,
                slowest_s_per_step=1 / known[slowest],
                others_s_per_step=1 / max(others),
            )
    return training


def line(training: Training, now: float | None = None) -> str:
    """``step 120 of 1000 (12 %), 3.41 steps/s, ETA 4 min 18 s; loss 0.312 (attempt 0,
    noted 3 s ago)``, with ``no step for N s`` and the slowest node when they apply."""
    now = time.time() if now is None else now
    text = f"step {training.step}"
    if training.total:
        share = min(100, 100 * training.step // training.total)
        text += f" of {training.total} ({share} %)"
    if training.idle_s >= IDLE_SHOWN_S:
        text += f", no step for {training.idle_s:.0f} s"
    if training.steps_per_s:
        text += f", {training.steps_per_s:.2f} steps/s"
    if training.eta_s is not None:
        text += f", ETA {duration(training.eta_s)}"
    shown = list(training.metrics.items())[:METRICS_SHOWN]
    if shown:
        text += "; " + ", ".join(f"{key} {_number(value)}" for key, value in shown)
    text += f" (attempt {training.attempt}, noted {max(now - training.noted, 0):.0f} s ago)"
    if training.slowest_node and training.slowest_s_per_step and training.others_s_per_step:
        text += (
            f"; slowest node {training.slowest_node} ({training.slowest_s_per_step:.3f} "
            f"s/step, the others {training.others_s_per_step:.3f})"
        )
    return text


def _number(value: float) -> str:
    return f"{value:.4g}"


def restarts(job: JobFolder, requeue: int) -> list[str]:
    """Why each in-place restart of run ``requeue`` happened, oldest first: ``attempt 1
    began after attempt 0 failed: rank 3 on n2: hung: ...`` (attempts are numbered from 0,
    as the folders and HPCLAUNCH_ATTEMPT are)."""
    records = failures.read(job.root, requeue)
    attempts = sorted({r.attempt for r in records})
    started = {a.attempt for a in job.attempts() if a.requeue == requeue}
    out = []
    for attempt in attempts:
        if attempt + 1 not in started:
            continue  # the run's last attempt: the run ended, it did not restart
        out.append(
            f"attempt {attempt + 1} began after attempt {attempt} failed: "
            + why(r for r in records if r.attempt == attempt)
        )
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
