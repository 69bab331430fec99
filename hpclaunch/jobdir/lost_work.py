"""The work a run loses: the steps its workers did after its last checkpoint, which the
next run does again. From the run's progress notes (hpclaunch.jobdir.hangs) and the
checkpoints: hpclaunch.checkpoint's (the saves' records and the folder) and the Lightning
ones of hpclaunch.frameworks.lightning.StopCheckpoint.

Steps are counted as steps done: hpclaunch.checkpoint's checkpoint of step S (the
script's index of the step just done) holds S + 1, a Lightning one holds its global
step. A run's count is the job's only when its workers resumed through hpclaunch
(``hpclaunch.progress.resumed_from``), numbered their own steps, or had no checkpoint to
resume from; and a job that also saves its own way (``--checkpoint-pattern``) holds
steps no one counted. Otherwise nothing is said rather than a wrong number. No torch."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.checkpoint import store
from hpclaunch.jobdir import hangs, saves
from hpclaunch.jobdir.layout import JobFolder

# Clocks of different nodes: a checkpoint this much after a run's recorded end still
# counts as that run's (its supervisor notes the end after the workers have stopped).
CLOCK_SLACK_S = 2.0


@dataclass(frozen=True, order=True)
class Saved:
    steps: int  # the steps done that it holds
    time: float  # when it was committed (seconds since the epoch)
    label: str  # as status names it: "step 29", "lightning/step-000000000030.ckpt"


@dataclass(frozen=True)
class RunLoss:
    """What run ``requeue`` did past its last checkpoint (``--json``'s ``lost_work``)."""

    requeue: int
    steps: int  # the steps done when its last progress was noted
    saved: Saved | None  # the newest checkpoint committed before it ended
    repeats: int | None  # the steps the next run does again; None: not noted (see text)

    def text(self) -> str:
        """``run 0 did 37 steps; its last checkpoint (step 29) holds 30: the next run
        repeats 7 steps``, or the same without a checkpoint."""
        if self.repeats is None and self.saved is not None:
            return (
                f"run {self.requeue}'s progress was last noted at step {self.steps}, before "
                f"its last checkpoint ({self.saved.label}), which holds {self.saved.steps}: "
                "the next run repeats the steps it did after that checkpoint, which no note "
                "counted"
            )
        if self.saved is None:
            return (
                f"run {self.requeue} did {self.steps} steps and no checkpoint was written: "
                f"the next run starts from step 0 and repeats {_steps(self.steps)}"
            )
        if self.repeats == 0:
            return (
                f"run {self.requeue} did {self.steps} steps, all in its last checkpoint "
                f"({self.saved.label}): nothing is repeated"
            )
        return (
            f"run {self.requeue} did {self.steps} steps; its last checkpoint ({self.saved.label}) "
            f"holds {self.saved.steps}: the next run repeats {_steps(self.repeats or 0)}"
        )


def _steps(count: int) -> str:
    return f"{count} step" + ("" if count == 1 else "s")


def checkpoints(job: JobFolder, ckpt_dir: Path) -> list[Saved]:
    """Every checkpoint the job is known to have committed, oldest first: its saves'
    records (kept after the folder pruned the old ones), the folder's own and the
    Lightning ones there."""
    found = {
        (r.step + 1, r.ended): Saved(r.step + 1, r.ended, f"step {r.step}")
        for r in saves.records(job.saves)
    }
    try:
        for c in store.complete(ckpt_dir):
            when = _mtime(c.path)
            if when is not None and not any(s.steps == c.step + 1 for s in found.values()):
                found[(c.step + 1, when)] = Saved(c.step + 1, when, f"step {c.step}")
        lightning = ckpt_dir / store.LIGHTNING_FOLDER
        names = os.listdir(lightning) if lightning.is_dir() else []
    except OSError:
        names = []
    for match in filter(None, map(store.LIGHTNING_NAME.match, names)):
        when = _mtime(lightning / match.group(0))
        if when is not None:
            label = f"{store.LIGHTNING_FOLDER}/{match.group(0)}"
            found[(int(match.group(1)), when)] = Saved(int(match.group(1)), when, label)
    return sorted(found.values(), key=lambda s: (s.time, s.steps))


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:  # pruned since
        return None


def run_loss(
    notes: Sequence[hangs.NodeProgress],
    requeue: int,
    started: float | None,
    ended: float | None,
    known: Sequence[Saved],
    own_way: bool = False,
) -> RunLoss | None:
    """What run ``requeue`` (its progress ``notes``) did past the newest of ``known``
    committed before ``ended``; None when it noted no progress, its count is not the
    job's (its workers resumed from a checkpoint without hpclaunch knowing), or the job
    saves ``own_way`` too (checkpoints matched by --checkpoint-pattern)."""
    if not notes or own_way:
        return None
    attempt = max(n.attempt for n in notes)
    ranks = [r for n in notes if n.attempt == attempt for r in n.ranks]
    if not ranks:
        return None
    steps = max(r.step for r in ranks)
    before_end = [s for s in known if ended is None or s.time <= ended + CLOCK_SLACK_S]
    saved = max(before_end, key=lambda s: (s.steps, s.time), default=None)
    job_steps = all(r.job_steps for r in ranks)
    resumable = [s for s in known if started is not None and s.time < started]
    if not job_steps and (resumable or (attempt > 0 and before_end)):
        return None  # counted from 0 after resuming (maybe): not the job's steps
    if saved is not None and saved.steps > steps:
        # Saved after the last note (a lost node's agent writes no last one): how many
        # steps followed the checkpoint, no note says.
        return RunLoss(requeue, steps, saved, None)
    return RunLoss(requeue, steps, saved, steps - (saved.steps if saved else 0))


def of_run(
    job: JobFolder,
    ckpt_dir: Path,
    requeue: int,
    started: float | None,
    ended: float | None,
    own_way: bool = False,
) -> RunLoss | None:
    """``run_loss`` from the job folder."""
    return run_loss(
        hangs.read_progress(job, requeue),
        requeue,
        started,
        ended,
        checkpoints(job, ckpt_dir),
        own_way,
    )


def never_saved(known: Sequence[Saved], steps: int, own_way: bool = False) -> str | None:
    """The warning for a job that has done ``steps`` steps and has no checkpoint at all
    (``known`` is empty and none matched --checkpoint-pattern)."""
    if steps <= 0 or known or own_way:
        return None
    return (
        f"{_steps(steps)} done and no checkpoint written: a requeue or an in-place restart "
        "starts again from step 0; save with hpclaunch.checkpoint.save (or, for Lightning, "
        "hpclaunch.frameworks.lightning.StopCheckpoint): docs/bring-your-script.md"
    )


def batch_lines(
    job: JobFolder,
    ckpt_dir: Path,
    runs: Sequence[tuple[int, float | None, float | None]],
    own_way: bool = False,
) -> list[str]:
    """What the batch log says when the last of ``runs`` (requeue, started, ended) is
    requeued: the steps the next run repeats, and, the first time a run ends with no
    checkpoint at all, the warning that every run starts from step 0."""
    if not runs:
        return []
    known = checkpoints(job, ckpt_dir)
    losses = [
        run_loss(hangs.read_progress(job, requeue), requeue, started, ended, known, own_way)
        for requeue, started, ended in runs
    ]
    last = losses[-1]
    if last is None:
        return []
    lines = [f"lost work: {last.text()}"]
    unsaved_before = any(loss is not None and loss.saved is None for loss in losses[:-1])
    warning = never_saved(known, last.steps, own_way)
    if warning and not unsaved_before:
        lines.append(f"warning: {warning}")
    return lines
