"""Who may use a checkpoint folder: one job at a time, and a later job only on purpose.

Two jobs in one folder train on each other's state: each resumes from the other's
newest checkpoint and prunes its own. The folder's marker (``hpclaunch.checkpoint.
owner``) names the job that uses it; ``decide`` is the pure rule a job is judged by,
when it is submitted and when it starts:

- the marker names this job (a requeue, a restart): it is the job's own;
- the marker names another job that is still active (pending, running, requeued,
  suspended), or whose state nobody can tell: refused. At submit a job that waits
  for that one (``--dependency=afterany:ID``, ``afterok``, ``afternotok``, or
  ``singleton`` with its name) is accepted, since it can start only once the other
  has ended; it must also say that it continues from the checkpoints left;
- no committed checkpoint in the folder: taken;
- committed checkpoints of an ended job, or of no job hpclaunch knows (no marker: an
  older hpclaunch, or copied in by hand): taken only with ``adopt_checkpoints``;
- at submit, a job with a dependency, without ``adopt_checkpoints``: refused, since the
  job it waits for may not have taken the folder yet (pending) and would leave
  checkpoints this job starts from, to be refused only at start, hours later.

No I/O: every input is a plain value.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from hpclaunch.checkpoint.owner import Owner


class Spelling(NamedTuple):
    """How the fixes are spelled where the message is read."""

    adopt: str  # the flag that continues from an ended job's checkpoints
    folder: str  # the checkpoint folder's option
    wait: str  # a dependency on job {job}


CLI = Spelling(
    "--adopt-checkpoints", "--checkpoint-dir", "--sbatch-option dependency=afterany:{job}"
)
EXECUTOR = Spelling(
    "adopt_checkpoints=True", "checkpoint_dir", 'sbatch_options={{"dependency": "afterany:{job}"}}'
)
# In the job's log, which either may have submitted.
ANYWHERE = Spelling(
    "--adopt-checkpoints (hpclaunch.Executor: adopt_checkpoints=True)",
    "--checkpoint-dir",
    "dependency=afterany:{job}",
)
# Dependency types after which the holder has ended ("after" is after it *started*).
_ENDED_AFTER = ("afterany", "afterok", "afternotok")


class Stage(enum.Enum):
    SUBMIT = "submit"
    START = "start"


class Liveness(enum.Enum):
    """What is known of the job a marker names."""

    ACTIVE = "active"  # pending, running, requeued, suspended, completing
    ENDED = "ended"
    UNKNOWN = "unknown"  # SLURM cannot be asked, or the process is on another host


@dataclass(frozen=True)
class Holder:
    """The marker's job and its liveness; ``detail`` says why (``RUNNING``, ``SLURM
    no longer knows the job``, the error of a controller that did not answer)."""

    owner: Owner
    liveness: Liveness
    detail: str


@dataclass(frozen=True)
class Situation:
    """What a job is judged on. ``me`` is None at submit (no job id yet)."""

    folder: str
    stage: Stage
    marker: Owner | None
    holder: Holder | None  # the marker's job, unless it is ``me`` or there is none
    latest_step: int | None  # the newest committed checkpoint in the folder
    adopt: bool
    me: Owner | None = None
    dependency: str | None = None  # sbatch's --dependency, at submit
    name: str | None = None  # this job's name and user (singleton)
    user: str | None = None
    spell: Spelling = ANYWHERE


class Verdict(enum.Enum):
    OWN = "own"  # the marker names this job
    FREE = "free"  # no checkpoint to resume from
    ADOPT = "adopt"  # continues from an ended job's checkpoints, as asked
    QUEUED = "queued"  # waits for the holder (a dependency), and adopts after it
    IN_USE = "in use"
    UNKNOWN = "cannot tell"
    LEFT = "left by an ended job"
    UNMARKED = "checkpoints of no known job"
    QUEUED_UNASKED = "would continue after the holder without saying so"

    @property
    def allowed(self) -> bool:
        return self in (Verdict.OWN, Verdict.FREE, Verdict.ADOPT, Verdict.QUEUED)


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    message: str  # what the user reads: the folder, the job, the fix

    @property
    def allowed(self) -> bool:
        return self.verdict.allowed


def waits_for(dependency: str | None, holder: Owner, name: str | None, user: str | None) -> bool:
    """Whether sbatch's ``--dependency`` lets the job start only after ``holder`` has
    ended: ``afterany``/``afterok``/``afternotok`` naming its id, or ``singleton``
    with its name and user. A list joined by ``?`` (any one suffices) never does."""
    if not dependency or "?" in dependency:
        return False
    for part in dependency.split(","):
        kind, _, ids = part.strip().partition(":")
        if kind == "singleton" and holder.job_name == name and holder.user == user:
            return True
        if kind in _ENDED_AFTER and holder.job_id in {i.split("+")[0] for i in ids.split(":")}:
            return True
    return False


def dependency_of(options: Sequence[tuple[str, str | None]]) -> str | None:
    """The ``dependency`` among extra sbatch options (``--sbatch-option``), if any."""
    found = [value for key, value in options if key in ("dependency", "d")]
    return found[-1] if found else None


def decide(s: Situation) -> Decision:
    """Whether the job may use the folder, and the message that says so."""
    marker, holder = s.marker, s.holder
    if marker is not None and s.me is not None and marker.same_job(s.me):
        return Decision(Verdict.OWN, f"checkpoint folder {s.folder} is this job's own")
    if holder is not None and holder.liveness is not Liveness.ENDED:
        if s.stage is Stage.SUBMIT and waits_for(s.dependency, holder.owner, s.name, s.user):
            if s.adopt:
                return Decision(
                    Verdict.QUEUED,
                    f"checkpoint folder {s.folder}: this job "
                    f"waits for {holder.owner.describe()} and continues from its "
                    "checkpoints",
                )
            return Decision(Verdict.QUEUED_UNASKED, _queued_unasked(s, holder))
        if holder.liveness is Liveness.UNKNOWN:
            return Decision(Verdict.UNKNOWN, _unknown(s, holder))
        return Decision(Verdict.IN_USE, _in_use(s, holder))
    if s.stage is Stage.SUBMIT and s.dependency and not s.adopt:
        return Decision(Verdict.QUEUED_UNASKED, _waits_unasked(s))
    if s.latest_step is None:
        return Decision(Verdict.FREE, f"checkpoint folder {s.folder} holds no checkpoint")
    if s.adopt:
        return Decision(
            Verdict.ADOPT,
            f"checkpoint folder {s.folder}: continuing, as asked, "
            f"from step {s.latest_step}, left by {_leaver(marker)}",
        )
    if holder is None:
        return Decision(
            Verdict.UNMARKED,
            _left(
                s,
                "that no hpclaunch job marked as its own "
                "(an older hpclaunch wrote them, or they were copied in)",
            ),
        )
    return Decision(
        Verdict.LEFT,
        _left(s, f"left by {holder.owner.describe()}, which has ended ({holder.detail})"),
    )


def _leaver(marker: Owner | None) -> str:
    return marker.describe() if marker is not None else "no job hpclaunch knows"


def _again(s: Situation) -> str:
    """How a fix begins: at start the job is over, and only a new submission helps."""
    if s.stage is Stage.START:
        return "This job ends without training; submit it again"
    return "Submit it"


def _in_use(s: Situation, holder: Holder) -> str:
    job = holder.owner
    queue = (
        f", or make it wait for that job ({s.spell.wait.format(job=job.job_id)}) with "
        f"{s.spell.adopt}"
        if s.stage is Stage.SUBMIT
        else ""
    )
    return (
        f"checkpoint folder {s.folder} is in use by {job.describe()}, which is "
        f"{holder.detail}: two jobs in one folder would train on each other's checkpoints. "
        f"{_again(s)} with another {s.spell.folder}, or once job {job.job_id} has ended "
        f"(scancel {job.job_id} ends it now) with {s.spell.adopt} to continue from its "
        f"checkpoints{queue}"
    )


def _unknown(s: Situation, holder: Holder) -> str:
    return (
        f"checkpoint folder {s.folder} is marked as used by {holder.owner.describe()}, and "
        f"whether that job still runs cannot be told ({holder.detail}); refusing rather "
        f"than guessing. {_again(s)} once it can be told, or with another {s.spell.folder}"
    )


def _queued_unasked(s: Situation, holder: Holder) -> str:
    return (
        f"checkpoint folder {s.folder} is in use by {holder.owner.describe()}, and this job "
        "waits for it (its dependency): it would then start from the checkpoints that job "
        f"leaves. Say so with {s.spell.adopt}, or give this job another {s.spell.folder}"
    )


def _waits_unasked(s: Situation) -> str:
    return (
        f"checkpoint folder {s.folder}: this job waits for another (dependency {s.dependency}) "
        "and would start from whatever checkpoints that job leaves in this folder, which "
        f"holds none of a running job yet. Say so with {s.spell.adopt} (harmless if that job "
        f"uses another folder), or give this job another {s.spell.folder}"
    )


def _left(s: Situation, whose: str) -> str:
    return (
        f"checkpoint folder {s.folder} holds checkpoints up to step {s.latest_step} {whose}; "
        f"this job would start from them. {_again(s)} with {s.spell.adopt} to continue from "
        f"them on purpose, or with another {s.spell.folder} to start afresh"
    )
