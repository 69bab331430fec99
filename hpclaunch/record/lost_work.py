"""The work a run loses: the steps it did that the next run does again.

What a run lost is the steps it had done when it ended minus the step the next run
resumed from. Both are known only where hpclaunch saw them (hpclaunch.record.attempts):
the first when the run's count is the job's, the second when the next run's workers saw
where they resumed (hpclaunch's checkpoint, the optimizer's restored step count, the
script's own step numbers, Lightning's callback). Until the next run has resumed, the
last checkpoint that says what it holds (hpclaunch's own, Lightning's) tells what a run
that resumes from it would repeat. Where neither is known (a script that checkpoints its
own way and restores no step count hpclaunch can see) the steps repeated are unknown,
and that is what is said: never "from step 0", never a number that is a guess. Pure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpclaunch.record.attempts import Attempt
from hpclaunch.record.checkpoints import Kind, Saved, newest_before
from hpclaunch.record.goodput import duration

RESUMED_HOW = {
    "checkpoint": "its hpclaunch checkpoint",
    "optimizer": "the optimizer's restored step count",
    "script": "the script's own step numbers",
    "lightning": "Lightning's checkpoint",
}
HOW_SEEN = (
    "hpclaunch sees it in its own checkpoints, in an Adam-family optimizer's restored "
    "state, in hpclaunch.progress.beat(step=...) and in Lightning's StopCheckpoint"
)


def resumed_from(step: int, how: str | None) -> str:
    """``resumed from step 40 (the optimizer's restored step count)``; a load that found no
    checkpoint: ``started from step 0 (hpclaunch found no checkpoint)``."""
    if step == 0 and how == "checkpoint":
        return "started from step 0 (hpclaunch found no checkpoint)"
    return f"resumed from step {step} ({RESUMED_HOW.get(how or '', how or '?')})"


class Basis(enum.Enum):
    RESUMED = "resumed"  # the next run showed where it resumed: the count is a fact
    CHECKPOINT = "checkpoint"  # the next run has not resumed yet: from the last checkpoint
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class RunLoss:
    """What run ``requeue`` did that the next run repeats (``--json``'s ``lost_work``)."""

    requeue: int
    steps: int | None  # the steps done when it ended, in the job's count; None: unknown
    counted: int  # the steps it did itself (at least: see ``at_least``)
    resumed: int | None  # the step the next run resumed from; None: not (yet) seen
    resumed_by: str | None  # how that was seen (progress_notes.RESUMED_BY)
    repeats: int | None  # the steps the next run does again; None: unknown
    basis: Basis
    final: bool  # nothing later can change what is said (the next run resumed, or never will)
    text: str
    saved: str | None = None  # the last checkpoint the prediction is from, as named
    # No node noted the run's end (its agents were killed first): its last note, older than
    # its end, gives only a floor of the steps it did, in the job's count where known.
    at_least: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "requeue": self.requeue,
            "steps": self.steps,
            "at_least": self.at_least,
            "counted": self.counted,
            "resumed": self.resumed,
            "resumed_by": self.resumed_by,
            "repeats": self.repeats,
            "basis": self.basis.value,
            "final": self.final,
            "saved": self.saved,
            "text": self.text,
        }


def _steps(count: int) -> str:
    return f"{count} step" + ("" if count == 1 else "s")


@dataclass(frozen=True)
class _Done:
    """What a run did, as its last attempt noted it."""

    run: int
    steps: int | None  # in the job's count; None: the count is not the job's
    counted: int  # the steps it did itself
    exact: bool  # a node noted the attempt's end: the count is its last step's
    last: float | None  # when its last noted step was

    def said(self) -> str:
        """``run 0 did 45 steps``, or ``run 0 did at least 45 steps (its nodes noted no
        end)`` when its last note may be older than its end."""
        count = self.steps if self.steps is not None else self.counted
        floor = "" if self.exact else "at least "
        why = "" if self.exact else " (no node noted its end: its last note may be older)"
        return f"run {self.run} did {floor}{_steps(count)}{why}"


def run_loss(
    run: int,
    attempts: Sequence[Attempt],
    following: Sequence[Attempt],
    saved: Sequence[Saved],
    ended: float | None,
    job_over: bool,
) -> RunLoss | None:
    """What run ``run`` (its ``attempts``) lost to the run after it (``following``: its
    attempts, empty before it has any). ``saved``: the job's known checkpoints;
    ``ended``: when the run ended (None: not recorded); ``job_over``: the job has ended,
    so no run will resume any more. None when the run noted no step."""
    stepped = [a for a in attempts if a.stepped and a.last_step is not None]
    if not stepped:
        return None
    last = stepped[-1]
    done = _Done(
        run,
        last.last_step if last.job_count else None,
        last.steps or 0,
        last.end_known,
        last.last,
    )
    later = [a for a in following if a.stepped]
    resumed = later[0] if later else None
    if done.steps is None:
        text = (
            f"{done.said()} after resuming from a step hpclaunch did not see ({HOW_SEEN}): "
            "the steps the next run repeats are unknown"
        )
        final = resumed is not None or job_over
        return _loss(done, None, None, None, Basis.UNKNOWN, final, text)
    if resumed is not None:
        own = newest_before([s for s in saved if s.kind is Kind.PATTERN], ended)
        return _after_resume(done, resumed, own)
    return _before_resume(done, saved, ended, job_over)


def _loss(
    done: _Done,
    resumed: int | None,
    resumed_by: str | None,
    repeats: int | None,
    basis: Basis,
    final: bool,
    text: str,
    saved: str | None = None,
) -> RunLoss:
    exact = done.steps if done.exact else None
    floor = None if done.exact else done.steps
    return RunLoss(
        done.run,
        exact,
        done.counted,
        resumed,
        resumed_by,
        repeats,
        basis,
        final,
        text,
        saved,
        floor,
    )


def _after_resume(done: _Done, nxt: Attempt, own: Saved | None) -> RunLoss:
    """The next run has stepped: what it showed of its resume point is what is said;
    ``own``: the run's last file matching --checkpoint-pattern."""
    assert done.steps is not None
    if nxt.resumed is None:
        text = (
            f"{done.said()}; run {nxt.requeue} did not show which step it resumed from "
            f"({HOW_SEEN}): the steps it repeated are unknown"
        )
        if own is not None and done.last is not None and own.time <= done.last:
            # What goodput counts as lost, said as what it is: a time, on a condition.
            text += (
                f"; if it resumed from the last checkpoint of its own ({own.label}), they are "
                f"the steps of run {done.run}'s last {duration(done.last - own.time)}"
            )
        return _loss(done, None, None, None, Basis.UNKNOWN, True, text)
    seen = resumed_from(nxt.resumed, nxt.resumed_by)
    head = f"{done.said()}; run {nxt.requeue} {seen}"
    repeats: int | None = max(done.steps - nxt.resumed, 0)
    if nxt.resumed > done.steps:
        # It resumed past the last step noted: the note is older than the run's end.
        text = f"{head}, after the last step noted: the steps it repeated are unknown"
        repeats = None
    elif not done.exact and not repeats:
        text = f"{head}: it repeated what run {done.run} did after that step, which no note counted"
        repeats = None
    elif not done.exact:
        text = f"{head}: it repeated at least {_steps(repeats or 0)}"
        repeats = None
    elif repeats == 0:
        text = f"{head}: nothing was repeated"
    else:
        text = f"{head}: it repeated {_steps(repeats or 0)}"
    return _loss(done, nxt.resumed, nxt.resumed_by, repeats, Basis.RESUMED, True, text)


def _before_resume(done: _Done, saved: Sequence[Saved], ended: float | None, over: bool) -> RunLoss:
    """No later run has stepped yet: what the last checkpoint that says what it holds
    tells, else unknown."""
    assert done.steps is not None
    counts = [s for s in saved if s.kind is not Kind.PATTERN and s.steps is not None]
    last = newest_before(counts, ended)
    if last is None or last.steps is None:
        own = newest_before([s for s in saved if s.kind is Kind.PATTERN], ended)
        mine = f"; its last checkpoint of its own is {own.label}" if own else ""
        text = (
            f"{done.said()}{mine}: the step the next run resumes from is unknown until it "
            f"resumes ({HOW_SEEN})"
        )
        if over:
            text = f"{done.said()}{mine}; no run resumed from it"
        return _loss(done, None, None, None, Basis.UNKNOWN, over, text)
    if last.steps > done.steps:
        text = (
            f"run {done.run}'s progress was last noted at step {done.steps}, before its last "
            f"checkpoint ({last.label}), which holds {last.steps}: a run that resumes from it "
            "repeats the steps it did after that checkpoint, which no note counted"
        )
        return _loss(done, None, None, None, Basis.CHECKPOINT, over, text, last.label)
    repeats: int | None = done.steps - last.steps
    at_least = "" if done.exact else "at least "
    if repeats == 0 and done.exact:
        tail = "nothing is repeated"
    else:
        tail = f"a run that resumes from it repeats {at_least}{_steps(repeats or 0)}"
    if not done.exact:
        repeats = None
    text = f"{done.said()}; its last checkpoint ({last.label}) holds {last.steps}: {tail}"
    return _loss(done, None, None, repeats, Basis.CHECKPOINT, over, text, last.label)


def of_runs(
    runs: Sequence[tuple[int, float | None, Sequence[int]]],
    attempts: Mapping[int, Sequence[Attempt]],
    saved: Sequence[Saved],
    job_over: bool,
) -> list[RunLoss]:
    """The loss of each of ``runs``: (requeue, when it ended, the requeue counts of the
    runs after it, oldest first), oldest first. What a run lost is told by the first later
    run that stepped (one requeued before its first step resumed from nothing)."""
    out = []
    for requeue, ended, later in runs:
        stepped = [attempts[r] for r in later if any(a.stepped for a in attempts.get(r, ()))]
        following = stepped[0] if stepped else []
        loss = run_loss(requeue, attempts.get(requeue, []), following, saved, ended, job_over)
        if loss is not None:
            out.append(loss)
    return out


def never_saved(
    saved: Sequence[Saved], attempts: Mapping[int, Sequence[Attempt]], done: int
) -> str | None:
    """A note for a job that has done ``done`` steps with no checkpoint that hpclaunch
    can see, and no run that showed it resumed from one."""
    if done <= 0 or saved:
        return None
    if any(a.resumed for found in attempts.values() for a in found):
        return None
    return (
        f"{_steps(done)} done and no checkpoint of the job seen: if the script saves its own "
        "way, give its files with --checkpoint-pattern so that status shows them; if it does "
        "not save at all, save with hpclaunch.checkpoint.save (or, for Lightning, "
        "hpclaunch.frameworks.lightning.StopCheckpoint) so that a requeue or a restart does "
        "not start over: docs/bring-your-script.md"
    )
