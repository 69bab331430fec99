"""What the batch-step supervisor does when the step ends: the pure policy
(``decide``) and the job's history (``history.json`` in the job folder).

The supervisor learns why the step ended from the first signal it received and,
for SIGTERM, from SLURM: a requeue by SLURM (``scontrol requeue``, preemption in
REQUEUE mode, a lost node) raises the job's ``Restarts`` count at once, while a
user's ``scancel`` does not.
"""

from __future__ import annotations

import enum
import json
import signal
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpclaunch.checkpoint import write_atomic
from hpclaunch.errors import ExitCode, HpclaunchError
from hpclaunch.job.spec import DEFAULT_MAX_FAILURE_REQUEUES
from hpclaunch.jobdir.failures import Finding, Verdict

HISTORY_FILE = "history.json"
# Written into the job folder by `hpclaunch cancel` before its scancel: whatever
# signal the supervisor got first, the job is not requeued.
CANCELLED_FILE = "cancelled"


class Reason(enum.Enum):
    COMPLETED = "completed"
    FAILED = "failed"  # the step failed by itself
    TIME_LIMIT = "time limit"  # SLURM's warning signal before the time limit
    REQUEUED_BY_SLURM = "requeued by SLURM"  # scontrol requeue, preemption, a lost node
    CANCELLED = "cancelled"  # scancel, or the time limit itself
    OVER_BUDGET = "over the requeue budget"
    BAD_NODES = "bad nodes"  # some nodes' workers failed with errors of their own
    BUG = "the same error on every node"  # a bug in the script: no requeue helps


class Action(enum.Enum):
    NONE = "none"  # the job ends with the step's status
    REQUEUE = "requeue"  # the supervisor runs scontrol requeue
    REQUEUE_FAILED = "requeue failed"  # scontrol requeue refused; the job ends
    SLURM_REQUEUES = "SLURM requeues"  # SLURM already is; nothing to do
    GIVE_UP = "give up"  # a requeue was due but the budget is spent


# The supervisor's exit status when a requeue was due and --max-requeues is spent.
GAVE_UP_STATUS = int(ExitCode.GAVE_UP)
WARNING_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class Situation:
    """What the supervisor knows when the step has ended."""

    status: int  # the step's exit status
    first_signal: int | None  # the first signal the supervisor received, if any
    requeue_count: int  # SLURM_RESTART_COUNT of this run
    slurm_restarts: int | None  # the job's Restarts in scontrol now (None: not asked)
    max_requeues: int
    finding: Finding | None = None  # what the failure records say (failed steps)
    failure_requeues: int = 0  # requeues for bad nodes so far
    max_failure_requeues: int = DEFAULT_MAX_FAILURE_REQUEUES
    earlier_errors: tuple[str, ...] = ()  # the errors that got nodes excluded before
    cancelled: bool = False  # `hpclaunch cancel` asked for the end of the job


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: Reason
    exit_status: int
    exclude: tuple[str, ...] = ()  # nodes to keep out of the next run


# Step statuses that mean "stopped by a signal" (128 + N), as the agents and srun
# report a step that ended because of the warning or SLURM's SIGTERM.
STOPPED_STATUSES = frozenset(128 + int(sig) for sig in (*WARNING_SIGNALS, *STOP_SIGNALS,
                                                        signal.SIGKILL))  # fmt: skip


def decide(s: Situation) -> Decision:
    """The policy. A job ``hpclaunch cancel`` ended is never requeued; SLURM's own
    requeues are left to SLURM; a step stopped by the
    time-limit warning leads to one requeue by the supervisor while the budget lasts;
    cancellations end the job; a step that failed by itself is requeued without its
    bad nodes while both budgets last, and ends the job when the failure records show
    a bug (or say nothing)."""
    if s.cancelled:
        return Decision(Action.NONE, Reason.CANCELLED, s.status)
    if s.slurm_restarts is not None and s.slurm_restarts > s.requeue_count:
        return Decision(Action.SLURM_REQUEUES, Reason.REQUEUED_BY_SLURM, 0)
    stopped = s.first_signal is not None and s.status in STOPPED_STATUSES
    if stopped and s.first_signal in WARNING_SIGNALS:
        if s.requeue_count >= s.max_requeues:
            return Decision(Action.GIVE_UP, Reason.OVER_BUDGET, GAVE_UP_STATUS)
        return Decision(Action.REQUEUE, Reason.TIME_LIMIT, 0)
    if stopped:
        return Decision(Action.NONE, Reason.CANCELLED, s.status)
    if s.status == 0:
        return Decision(Action.NONE, Reason.COMPLETED, 0)
    if s.finding is not None and s.finding.verdict is Verdict.BUG:
        return Decision(Action.NONE, Reason.BUG, s.status)
    if (
        s.finding is not None
        and s.finding.verdict is Verdict.BAD_NODES
        and s.finding.message in s.earlier_errors
    ):
        # The error followed its rank onto other nodes: the script, not the node.
        return Decision(Action.NONE, Reason.BUG, s.status)
    if s.finding is not None and s.finding.verdict is Verdict.BAD_NODES:
        spent = s.failure_requeues >= s.max_failure_requeues or s.requeue_count >= s.max_requeues
        if spent:
            return Decision(Action.GIVE_UP, Reason.BAD_NODES, GAVE_UP_STATUS, s.finding.nodes)
        return Decision(Action.REQUEUE, Reason.BAD_NODES, 0, s.finding.nodes)
    return Decision(Action.NONE, Reason.FAILED, s.status)


def gave_up() -> Decision:
    """The decision for a run that SLURM requeued past the budget (see over_budget)."""
    return Decision(Action.GIVE_UP, Reason.OVER_BUDGET, GAVE_UP_STATUS)


def over_budget(requeue_count: int, max_requeues: int) -> bool:
    """Whether a run that SLURM requeued (which the supervisor cannot refuse) is past
    the budget: the supervisor then gives up before starting the step."""
    return requeue_count > max_requeues


@dataclass
class Run:
    """One run of the job (one allocation) in the history."""

    requeue_count: int
    nodes: str
    started: float
    ended: float | None = None
    step_status: int | None = None
    first_signal: str | None = None
    reason: str | None = None
    action: str | None = None
    excluded: list[str] = field(default_factory=list)  # nodes kept out of the next run
    error: str | None = None  # the error the failure records showed


@dataclass
class History:
    """``history.json``: every run of the job, newest last."""

    job_id: int
    max_requeues: int
    runs: list[Run] = field(default_factory=list)
    checkpoint_dir: str | None = None  # HPCLAUNCH_CHECKPOINT_DIR, for `hpclaunch status`

    @property
    def excluded_nodes(self) -> list[str]:
        """Every node any run kept out, in order."""
        return list(dict.fromkeys(node for run in self.runs for node in run.excluded))

    @property
    def exclusion_errors(self) -> tuple[str, ...]:
        """The errors for which earlier runs kept nodes out."""
        return tuple(r.error for r in self.runs if r.excluded and r.error)

    @property
    def failure_requeues(self) -> int:
        return sum(
            1 for r in self.runs if r.reason == Reason.BAD_NODES.value
            and r.action == Action.REQUEUE.value
        )  # fmt: skip

    @property
    def requeues(self) -> int:
        requeued = (Action.REQUEUE.value, Action.SLURM_REQUEUES.value)
        return sum(1 for run in self.runs if run.action in requeued)

    @classmethod
    def load(cls, job_dir: Path, job_id: int, max_requeues: int | None = None) -> History:
        """The history in ``job_dir``, or an empty one; ``max_requeues`` replaces the
        recorded budget (None keeps it). Raises HistoryError."""
        path = job_dir / HISTORY_FILE
        try:
            data = json.loads(path.read_text())
            runs = [Run(**run) for run in data["runs"]]
            checkpoint_dir = data.get("checkpoint_dir")
            budget = int(data["max_requeues"]) if max_requeues is None else max_requeues
        except FileNotFoundError:
            return cls(job_id, max_requeues or 0)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise HistoryError(
                f"{path} is not a history hpclaunch wrote ({type(exc).__name__}: {exc}); "
                "move it aside and requeue the job"
            ) from None
        return cls(job_id, budget, runs, checkpoint_dir)

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "max_requeues": self.max_requeues,
            "requeues": self.requeues,
            "excluded_nodes": self.excluded_nodes,
            "checkpoint_dir": self.checkpoint_dir,
            "runs": [asdict(run) for run in self.runs],
        }

    def save(self, job_dir: Path) -> None:
        """Replace history.json atomically (a reader sees the old or the new file)."""
        job_dir.mkdir(parents=True, exist_ok=True)
        text = (json.dumps(self.to_json(), indent=2) + "\n").encode()
        write_atomic(job_dir / HISTORY_FILE, lambda handle: handle.write(text), replace=True)

    def start(self, env: Mapping[str, str], requeue_count: int) -> Run:
        run = Run(requeue_count, env.get("SLURM_JOB_NODELIST", ""), time.time())
        self.runs.append(run)
        return run


class HistoryError(HpclaunchError):
    """history.json exists but cannot be read; the message names it and the fix."""


def finish(
    run: Run,
    status: int | None,
    first_signal: int | None,
    decision: Decision,
    error: str | None = None,
) -> None:
    """Record how ``run`` ended (``status`` None: no step ran)."""
    run.error = error
    run.ended = time.time()
    run.step_status = status
    run.first_signal = signal.Signals(first_signal).name if first_signal else None
    run.reason = decision.reason.value
    run.action = decision.action.value
    kept_out = decision.action in (Action.REQUEUE, Action.SLURM_REQUEUES)
    run.excluded = list(decision.exclude) if kept_out else []
