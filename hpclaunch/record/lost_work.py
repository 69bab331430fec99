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
    counted: int  # the steps it did itself
    resumed: int | None  # the step the next run resumed from; None: not (yet) seen
    resumed_by: str | None  # how that was seen (progress_notes.RESUMED_BY)
    repeats: int | None  # the steps the next run does again; None: unknown
    basis: Basis
    final: bool  # nothing later can change what is said (the next run resumed, or never will)
    text: str
    saved: str | None = None  # the last checkpoint the prediction is from, as named

    def to_json(self) -> dict[str, object]:
        return {
            "requeue": self.requeue,
            "steps": self.steps,
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
    counted = last.steps or 0
    done = last.last_step if last.job_count else None
    later = [a for a in following if a.stepped]
    resumed = later[0] if later else None
    if done is None:
        text = (
            f"run {run} did {_steps(counted)} after resuming from a step hpclaunch did not "
            f"see ({HOW_SEEN}): the steps the next run repeats are unknown"
        )
        final = resumed is not None or job_over
        return RunLoss(run, None, counted, None, None, None, Basis.UNKNOWN, final, text)
    if resumed is not None:
        own = newest_before([s for s in saved if s.kind is Kind.PATTERN], ended)
        return _after_resume(run, done, counted, resumed, own, last.last)
    return _before_resume(run, done, counted, saved, ended, job_over)


def _after_resume(
    run: int, done: int, counted: int, nxt: Attempt, own: Saved | None, last: float | None
) -> RunLoss:
    """The next run has stepped: what it showed of its resume point is what is said;
    ``own``: the run's last file matching --checkpoint-pattern, ``last``: when the run
    did its last step."""
    if nxt.resumed is None:
        text = (
            f"run {run} did {_steps(done)}; run {nxt.requeue} did not show which step it "
            f"resumed from ({HOW_SEEN}): the steps it repeated are unknown"
        )
        if own is not None and last is not None and own.time <= last:
            # What goodput counts as lost, said as what it is: a time, on a condition.
            text += (
                f"; if it resumed from the last checkpoint of its own ({own.label}), they are "
                f"the steps of run {run}'s last {duration(last - own.time)}"
            )
        return RunLoss(run, done, counted, None, None, None, Basis.UNKNOWN, True, text)
    repeats = max(done - nxt.resumed, 0)
    seen = resumed_from(nxt.resumed, nxt.resumed_by)
    head = f"run {run} did {_steps(done)}; run {nxt.requeue} {seen}"
    if nxt.resumed > done:
        text = f"{head}, after the last step noted: nothing was repeated"
    elif repeats == 0:
        text = f"{head}: nothing was repeated"
    else:
        text = f"{head}: it repeated {_steps(repeats)}"
    return RunLoss(
        run, done, counted, nxt.resumed, nxt.resumed_by, repeats, Basis.RESUMED, True, text
    )


def _before_resume(
    run: int,
    done: int,
    counted: int,
    saved: Sequence[Saved],
    ended: float | None,
    over: bool,
) -> RunLoss:
    """No later run has stepped yet: what the last checkpoint that says what it holds
    tells, else unknown."""
    counts = [s for s in saved if s.kind is not Kind.PATTERN and s.steps is not None]
    last = newest_before(counts, ended)
    if last is None or last.steps is None:
        own = newest_before([s for s in saved if s.kind is Kind.PATTERN], ended)
        mine = f"; its last checkpoint of its own is {own.label}" if own else ""
        text = (
            f"run {run} did {_steps(done)}{mine}: the step the next run resumes from is "
            f"unknown until it resumes ({HOW_SEEN})"
        )
        if over:
            text = f"run {run} did {_steps(done)}{mine}; no run resumed from it"
        return RunLoss(run, done, counted, None, None, None, Basis.UNKNOWN, over, text)
    if last.steps > done:
        text = (
            f"run {run}'s progress was last noted at step {done}, before its last checkpoint "
            f"({last.label}), which holds {last.steps}: a run that resumes from it repeats "
            "the steps it did after that checkpoint, which no note counted"
        )
        return RunLoss(
            run, done, counted, None, None, None, Basis.CHECKPOINT, over, text, last.label
        )
    repeats = done - last.steps
    if repeats == 0:
        tail = "nothing is repeated"
    else:
        tail = f"a run that resumes from it repeats {_steps(repeats)}"
    text = (
        f"run {run} did {_steps(done)}; its last checkpoint ({last.label}) holds "
        f"{last.steps}: {tail}"
    )
    return RunLoss(
        run, done, counted, None, None, repeats, Basis.CHECKPOINT, over, text, last.label
    )


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
