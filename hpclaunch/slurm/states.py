"""SLURM's job states, and what SLURM says of one job: pure parsing, no commands run.

``scontrol show job`` prints ``JobState=RUNNING``; ``sacct --format=State`` prints the
same names, ``CANCELLED by 1000`` for a job a user cancelled. The names are those of
SLURM 22.05's ``job_state_string`` (base states and the flags it prints instead of
them); a later SLURM may print a state not listed here, which parses as None rather
than failing, and is then neither final nor running.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class JobState(enum.Enum):
    """A job's state as SLURM prints it, plus ENDED, hpclaunch's own."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    # Flags that SLURM prints in place of the base state while they are set.
    LAUNCH_FAILED = "LAUNCH_FAILED"
    UPDATE_DB = "UPDATE_DB"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    RESIZING = "RESIZING"
    CONFIGURING = "CONFIGURING"
    COMPLETING = "COMPLETING"
    STOPPED = "STOPPED"
    RECONFIG_FAIL = "RECONFIG_FAIL"
    POWER_UP_NODE = "POWER_UP_NODE"
    REVOKED = "REVOKED"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    SIGNALING = "SIGNALING"
    STAGE_OUT = "STAGE_OUT"
    EXPEDITING = "EXPEDITING"  # SLURM 23.02 and later
    # hpclaunch's: SLURM forgot the job without saying how it ended (no accounting).
    ENDED = "ENDED"

    @classmethod
    def parse(cls, text: str | None) -> JobState | None:
        """The state ``text`` names (``CANCELLED by 0``: CANCELLED); None when it is
        empty or a state this version does not know."""
        words = (text or "").split()
        try:
            return cls(words[0].rstrip("+")) if words else None
        except ValueError:  # a state a later SLURM added
            return None

    @property
    def final(self) -> bool:
        """Whether the job runs no more (REQUEUED and PENDING are not)."""
        return self in FINAL


# The states after which the job runs no more. PREEMPTED is final: a preempted job
# that is requeued shows REQUEUED, then PENDING, instead.
FINAL = frozenset(
    {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.OUT_OF_MEMORY,
        JobState.BOOT_FAIL,
        JobState.DEADLINE,
        JobState.SPECIAL_EXIT,
        JobState.PREEMPTED,
        JobState.ENDED,
    }
)
# The states in which the job holds its nodes.
ON_NODES = frozenset({JobState.RUNNING, JobState.COMPLETING, JobState.CONFIGURING})


def is_final(text: str | None) -> bool:
    """Whether the state SLURM printed as ``text`` is final; an unknown state is not."""
    state = JobState.parse(text)
    return state is not None and state.final


class Source(enum.Enum):
    """Which of SLURM's commands answered."""

    SCONTROL = "scontrol"  # while slurmctld remembers the job (MinJobAge after its end)
    SACCT = "sacct"  # afterwards, where there is an accounting database


@dataclass(frozen=True)
class SlurmRecord:
    """What SLURM says of one job. Every field is as printed (``state`` without sacct's
    ``by UID``); None where the command did not say."""

    source: Source
    state: str | None
    nodes: str = ""  # a hostlist, "(null)" or "None assigned" before it has nodes
    exit_code: str | None = None  # "STATUS:SIGNAL"
    job_id: str | None = None
    name: str | None = None  # scontrol only
    reason: str | None = None  # why it is pending ("Resources"); scontrol only
    restarts: int | None = None  # SLURM's requeue count; scontrol only
    stdout: str | None = None  # the batch log's path; scontrol only

    @property
    def job_state(self) -> JobState | None:
        return JobState.parse(self.state)

    @classmethod
    def from_scontrol(cls, fields: Mapping[str, str]) -> SlurmRecord:
        """From ``scontrol show job``'s KEY=VALUE pairs (see parse_show_job)."""
        restarts = fields.get("Restarts", "")
        reason = fields.get("Reason", "")
        return cls(
            Source.SCONTROL,
            fields.get("JobState") or None,
            fields.get("NodeList", ""),
            fields.get("ExitCode") or None,
            fields.get("JobId") or None,
            fields.get("JobName") or None,
            reason if reason and reason != "None" else None,
            int(restarts) if restarts.isdigit() else None,
            fields.get("StdOut") or None,
        )

    @classmethod
    def from_sacct(cls, line: str, job_id: str) -> SlurmRecord:
        """From one ``sacct --parsable2 --format=State,NodeList,ExitCode`` line."""
        state, nodes, exit_code = [*line.split("|"), "", "", ""][:3]
        words = state.split()  # "CANCELLED by 0"
        return cls(Source.SACCT, words[0] if words else None, nodes, exit_code or None, job_id)
