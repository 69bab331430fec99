"""The job's history (``history.json`` in the job folder): every run of the job, why
it ended and what the supervisor did then. ``Reason`` and ``Action`` are the words
stored there; ``hpclaunch.recovery.policy`` decides with them. No torch, no SLURM.
"""

from __future__ import annotations

import enum
import json
import signal
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hpclaunch.errors import HpclaunchError
from hpclaunch.jobdir import typed
from hpclaunch.jobdir.atomic import write_bytes_atomic
from hpclaunch.jobdir.layout import JobFolder


class Reason(enum.Enum):
    COMPLETED = "completed"
    FAILED = "failed"  # the step failed by itself
    TIME_LIMIT = "time limit"  # SLURM's warning signal before the time limit
    # SIGTERM (or SIGINT) sent to the job's steps only, not to the batch script: scancel
    # --signal TERM, submitit's _interrupt(); the job goes on, so it is requeued.
    STEPS_STOPPED = "steps stopped"
    REQUEUED_BY_SLURM = "requeued by SLURM"  # scontrol requeue, preemption, a lost node
    CANCELLED = "cancelled"  # scancel, or the time limit itself
    OVER_BUDGET = "over the requeue budget"
    BAD_NODES = "bad nodes"  # some nodes' workers failed with errors of their own
    BUG = "the same error on every node"  # a bug in the script: no requeue helps
    STORAGE = "shared folder not writable"  # full, over quota, read-only: no node is to blame
    HANG = "hang"  # collectives timed out waiting for a rank; no node can be named yet
    # A rank exited 0 while the others trained on, and they failed without it: the
    # script's choice, which a requeue would repeat (hpclaunch.jobdir.failures).
    EARLY_EXIT = "a rank exited early"
    # A node's agent (or the step's srun) was killed by a signal: the OOM killer, a crash
    # or an administrator (hpclaunch.recovery.stepdeath). A node fault, as BAD_NODES is.
    AGENT_DIED = "agent died"
    # Another job's checkpoint folder, or one with checkpoints this job was not told to
    # continue from (hpclaunch.checkpoint.sharing): no step ran.
    FOLDER_REFUSED = "checkpoint folder refused"
    # The run recorded no end: its batch host was lost, or a newer run had started by the
    # time it ended (a partitioned host's stale supervisor). hpclaunch.jobdir.history_store
    LOST = "lost"
    # A --no-kill job's batch host (supervisor, srun) was lost; a surviving agent took
    # the supervisor's role and requeued or ended the job (hpclaunch.recovery.deputy).
    BATCH_HOST_LOST = "batch host lost"
    # The layers' watch (hpclaunch.recovery.watch): an agent that noted nothing while the
    # others went on (a node fault, as a dead agent is); srun stopped or not exiting
    # after every agent ended (ended by the supervisor); the supervisor's heartbeat
    # still for the bound (a deputy agent ended or requeued the job).
    AGENT_SILENT = "agent silent"
    SRUN_STUCK = "srun stuck"
    SUPERVISOR_SILENT = "supervisor silent"


TORN_RETRY_S = 0.2  # before a history that did not parse is read once more
_NODE_FAULTS = (Reason.BAD_NODES.value, Reason.AGENT_DIED.value, Reason.AGENT_SILENT.value)


class Action(enum.Enum):
    NONE = "none"  # the job ends with the step's status
    REQUEUE = "requeue"  # the supervisor runs scontrol requeue
    REQUEUE_FAILED = "requeue failed"  # scontrol requeue refused; the job ends
    SLURM_REQUEUES = "SLURM requeues"  # SLURM already is; nothing to do
    GIVE_UP = "give up"  # a requeue was due but the budget is spent


class Outcome(Protocol):
    """What ``finish`` records of a decision (``hpclaunch.recovery.policy.Decision``)."""

    @property
    def action(self) -> Action: ...
    @property
    def reason(self) -> Reason: ...
    @property
    def exclude(self) -> tuple[str, ...]: ...


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
    verdict: str | None = None  # why the job ended, for a person (storage, hang)
    token: str | None = None  # this run's own mark, so its supervisor writes only its entry


@dataclass
class History:
    """``history.json``: every run of the job, newest last."""

    job_id: int
    max_requeues: int
    runs: list[Run] = field(default_factory=list)
    checkpoint_dir: str | None = None  # HPCLAUNCH_CHECKPOINT_DIR, for `hpclaunch status`
    signal_lead_s: float | None = None  # the time-limit warning's lead, for save warnings
    # --checkpoint-pattern, absolute (found_checkpoints.absolute), for `hpclaunch status`
    checkpoint_patterns: list[str] = field(default_factory=list)

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
            1 for r in self.runs if r.reason in _NODE_FAULTS and r.action == Action.REQUEUE.value
        )

    @property
    def requeues(self) -> int:
        requeued = (Action.REQUEUE.value, Action.SLURM_REQUEUES.value)
        return sum(1 for run in self.runs if run.action in requeued)

    @classmethod
    def load(cls, job_dir: Path, job_id: int, max_requeues: int | None = None) -> History:
        """The history in ``job_dir``, or an empty one; ``max_requeues`` replaces the
        recorded budget (None keeps it). Raises HistoryError."""
        path = JobFolder(job_dir).history
        why = ""
        for attempt in range(2):
            if attempt:
                # A supervisor may be rewriting it in place this moment (a full job
                # folder: hpclaunch.jobdir.history_store.write), under a lock readers do
                # not take: a torn read is read again once.
                time.sleep(TORN_RETRY_S)
            try:
                text = path.read_text()
            except FileNotFoundError:
                return cls(job_id, max_requeues or 0)
            try:
                data = json.loads(text)
            except ValueError as exc:  # not JSON
                why = f"{type(exc).__name__}: {exc}"
                continue
            try:
                return cls.from_json(data, job_id, max_requeues)
            except ValueError as exc:
                why = str(exc)
        raise unreadable(path, why)

    @classmethod
    def from_json(
        cls, data: Mapping[str, Any], job_id: int, max_requeues: int | None = None
    ) -> History:
        """The history ``data`` (what to_json wrote) holds. Raises ValueError."""
        try:
            runs = [typed.load(Run, run) for run in data["runs"]]
            checkpoint_dir = data.get("checkpoint_dir")
            lead = data.get("signal_lead_s")
            signal_lead_s = None if lead is None else float(lead)
            budget = int(data["max_requeues"]) if max_requeues is None else max_requeues
            patterns = [str(p) for p in data.get("checkpoint_patterns") or []]
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"{type(exc).__name__}: {exc}") from None
        return cls(job_id, budget, runs, checkpoint_dir, signal_lead_s, patterns)

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "max_requeues": self.max_requeues,
            "requeues": self.requeues,
            "excluded_nodes": self.excluded_nodes,
            "checkpoint_dir": self.checkpoint_dir,
            "signal_lead_s": self.signal_lead_s,
            "checkpoint_patterns": self.checkpoint_patterns,
            "runs": [asdict(run) for run in self.runs],
        }

    def save(self, job_dir: Path) -> None:
        """Replace history.json atomically (a reader sees the old or the new file).
        Raises OSError."""
        job_dir.mkdir(parents=True, exist_ok=True)
        text = (json.dumps(self.to_json(), indent=2) + "\n").encode()
        write_bytes_atomic(JobFolder(job_dir).history, text)

    def start(self, env: Mapping[str, str], requeue_count: int) -> Run:
        run = Run(requeue_count, env.get("SLURM_JOB_NODELIST", ""), time.time())
        run.token = uuid.uuid4().hex[:16]
        self.runs.append(run)
        return run


class HistoryError(HpclaunchError):
    """history.json exists but cannot be read; the message names it and the fix;
    ``why`` says what is wrong with it."""

    def __init__(self, message: str, why: str = "") -> None:
        super().__init__(message)
        self.why = why


def unreadable(path: Path, why: str) -> HistoryError:
    return HistoryError(
        f"{path} is not a history hpclaunch wrote ({why}); move it aside and requeue the job",
        why,
    )


def finish(
    run: Run,
    status: int | None,
    first_signal: int | None,
    decision: Outcome,
    error: str | None = None,
    verdict: str | None = None,
) -> None:
    """Record how ``run`` ended (``status`` None: no step ran)."""
    run.error = error
    run.verdict = verdict
    run.ended = time.time()
    run.step_status = status
    run.first_signal = signal.Signals(first_signal).name if first_signal else None
    run.reason = decision.reason.value
    run.action = decision.action.value
    kept_out = decision.action in (Action.REQUEUE, Action.SLURM_REQUEUES)
    run.excluded = list(decision.exclude) if kept_out else []
