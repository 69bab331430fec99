"""The job folder's one owner: every path in it, and the one way to find it. Pure
paths (the only I/O: listing attempts, reading and writing a node's rank list); no
torch, no SLURM. The names below are a file format: a folder an earlier version
wrote must still be read, so tests pin each one.

::

    LOG_DIR/NAME-JOBID.out                    the batch log (sbatch --output)
    LOG_DIR/JOBID/                            the job folder (HPCLAUNCH_JOB_DIR)
        job.sbatch                            the script as submitted
        history.json                          every run (hpclaunch.jobdir.history)
        cancelled                             `hpclaunch cancel`'s note to the supervisor
        checkpoints/                          HPCLAUNCH_CHECKPOINT_DIR, unless given
        checkpoint-saves.jsonl                each save's times (hpclaunch.jobdir.saves)
        checkpoints-set-aside.jsonl           checkpoints that failed to load (set_aside)
        logs/requeue-Q/step-S/attempt-A/      one attempt's rank logs:
            rank-R.out  rank-R.err  rank-R.json   stdout, stderr, torch's error file
            node-NAME.ranks                   the global ranks node NAME ran (JSON)
        failures/requeue-Q/attempt-A/node-HOST.json   a node's failure record
        failures/requeue-Q/root-cause-HOST.txt        a supervised agent's root cause
        local-requeues                        Executor(cluster="local"): requeues so far
        agents/requeue-Q/node-HOST.json       a --no-kill job's agent on HOST ended (status)
        agents/requeue-Q/deputy.json          the agent that took a lost batch host's role

Q is SLURM's requeue count, S the job step (SLURM's step id, or ``batch``), A the
worker group's attempt (the rendezvous round, the same on every node), R the global
rank. No run overwrites another's files.

An ``hpclaunch.Executor``'s own folder (submitit's, keyed by submitit's job id)::

    JOBID_hpclaunch.json                      which SLURM job and job folder ran it
    JOBID_every_result.pkl                    every rank's return value (job.results())
    .JOBID_finished/Q-S-A/                    the ranks of one run that returned
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.contract import worker_env
from hpclaunch.contract.job_folder import BATCH_LOG_PATTERN as BATCH_LOG_PATTERN
from hpclaunch.contract.job_folder import CHECKPOINTS
from hpclaunch.contract.worker_env import DEFAULT_LOG_DIR

# Set by the rendered script (and the local Executor); see hpclaunch.contract.worker_env.
JOB_DIR_VAR = worker_env.JOB_DIR
SCRIPT = "job.sbatch"
HISTORY = "history.json"
CANCELLED = "cancelled"
SAVES = "checkpoint-saves.jsonl"
SET_ASIDE = "checkpoints-set-aside.jsonl"
LOGS = "logs"
FAILURES = "failures"
LOCAL_REQUEUES = "local-requeues"
AGENTS = "agents"
DEPUTY = "deputy.json"
HANGS = "hangs"
PROGRESS = "progress"
STACKS = "stacks"
EXECUTOR_INFO_SUFFIX = "_hpclaunch.json"
# The parts of a run that are the same on every node: SLURM's requeue count, the
# job step, and the rendezvous round (HPCLAUNCH_ATTEMPT, job-wide, unlike torch's
# per-agent TORCHELASTIC_RESTART_COUNT).
_RUN_VARS = (worker_env.REQUEUE_COUNT, "SLURM_STEP_ID", worker_env.ATTEMPT)


class RankFile(enum.Enum):
    """The files of one rank in an attempt's folder, by their suffix."""

    OUT = "out"  # its stdout
    ERR = "err"  # its stderr
    ERROR = "json"  # torch's error file (scripts using @record)


def batch_log(log_dir: Path, name: str, job_id: int | str) -> Path:
    """``LOG_DIR/NAME-JOBID.out``: where BATCH_LOG_PATTERN puts the batch log."""
    return log_dir / f"{name}-{job_id}.out"


@dataclass(frozen=True)
class AttemptFolder:
    """One attempt's rank logs: the ``requeue`` count, the job ``step`` and the
    ``attempt`` (the rendezvous round)."""

    requeue: int
    step: str
    attempt: int
    path: Path

    @property
    def label(self) -> str:
        return f"requeue {self.requeue}, step {self.step}, attempt {self.attempt}"

    def rank_file(self, rank: int, kind: RankFile) -> Path:
        return self.path / f"rank-{rank}.{kind.value}"

    def node_ranks_file(self, node: str) -> Path:
        return self.path / f"node-{node}.ranks"

    def write_node_ranks(self, node: str, ranks: Sequence[int]) -> None:
        """Note which global ranks ``node`` ran (for ``hpclaunch logs --node``). Raises
        OSError."""
        self.node_ranks_file(node).write_text(json.dumps(list(ranks)) + "\n")

    def node_ranks(self) -> dict[str, list[int]]:
        """Node name -> the global ranks it ran in this attempt (from the agents' notes);
        unreadable notes are skipped."""
        found: dict[str, list[int]] = {}
        for path in self.path.glob("node-*.ranks"):
            try:
                ranks = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(ranks, list):
                found[path.name[len("node-") : -len(".ranks")]] = [int(r) for r in ranks]
        return found


@dataclass(frozen=True)
class JobFolder:
    """A job's folder (``LOG_DIR/JOBID`` unless HPCLAUNCH_JOB_DIR says otherwise)."""

    root: Path

    @classmethod
    def of(cls, log_dir: Path | str, job_id: int | str) -> JobFolder:
        """The folder ``hpclaunch sbatch`` makes for ``job_id`` in ``log_dir``."""
        return cls(Path(log_dir) / str(job_id))

    @classmethod
    def from_env(cls, env: Mapping[str, str], job_id: int) -> JobFolder:
        """HPCLAUNCH_JOB_DIR (set by the rendered script), else the folder ``hpclaunch
        sbatch`` uses by default, relative to the working directory."""
        given = env.get(JOB_DIR_VAR, "").strip()
        return cls(Path(given)) if given else cls.of(DEFAULT_LOG_DIR, job_id)

    @property
    def script(self) -> Path:
        return self.root / SCRIPT

    @property
    def history(self) -> Path:
        return self.root / HISTORY

    @property
    def cancelled(self) -> Path:
        return self.root / CANCELLED

    @property
    def checkpoints(self) -> Path:
        """The checkpoint folder when the job gives none of its own."""
        return self.root / CHECKPOINTS

    @property
    def saves(self) -> Path:
        """Global rank 0's note of each checkpoint save: its times and size."""
        return self.root / SAVES

    @property
    def set_aside(self) -> Path:
        """Global rank 0's note of each checkpoint it set aside, and why."""
        return self.root / SET_ASIDE

    @property
    def logs(self) -> Path:
        """The root of every attempt's rank logs."""
        return self.root / LOGS

    @property
    def local_requeues(self) -> Path:
        return self.root / LOCAL_REQUEUES

    def attempt(self, requeue: int, step: str, attempt: int) -> AttemptFolder:
        path = self.logs / f"requeue-{requeue}" / f"step-{step}" / f"attempt-{attempt}"
        return AttemptFolder(requeue, step, attempt, path)

    def attempts(self) -> list[AttemptFolder]:
        """Every attempt's log folder, oldest first."""
        found = []
        for path in self.logs.glob("requeue-*/step-*/attempt-*"):
            requeue, attempt = number_of(path.parents[1].name), number_of(path.name)
            step = path.parent.name.removeprefix("step-")
            if requeue is not None and attempt is not None and path.is_dir():
                found.append(AttemptFolder(requeue, step, attempt, path))
        return sorted(found, key=lambda a: (a.requeue, _step_order(a.step), a.attempt))

    def failures(self, requeue: int) -> Path:
        """One run's failure records and root-cause blocks."""
        return self.root / FAILURES / f"requeue-{requeue}"

    def failure_record(self, requeue: int, attempt: int, node: str) -> Path:
        return self.failures(requeue) / f"attempt-{attempt}" / f"node-{node}.json"

    def agents(self, requeue: int) -> Path:
        """One run's notes of its agents' ends, and of its deputy (hpclaunch.recovery.deputy)."""
        return self.root / AGENTS / f"requeue-{requeue}"

    def agent_end(self, requeue: int, node: str) -> Path:
        return self.agents(requeue) / f"node-{node}.json"

    def deputy(self, requeue: int) -> Path:
        return self.agents(requeue) / DEPUTY

    def root_cause(self, requeue: int, node: str) -> Path:
        """Where a supervised agent leaves its root-cause block for the supervisor."""
        return self.failures(requeue) / f"root-cause-{node}.txt"

    def hangs(self, requeue: int) -> Path:
        """One run's hang reports and the stacks read at each hang (hpclaunch.jobdir.hangs)."""
        return self.root / HANGS / f"requeue-{requeue}"

    def progress(self, requeue: int) -> Path:
        """One run's progress notes, one per node, each agent's own (hpclaunch.jobdir.hangs)."""
        return self.root / PROGRESS / f"requeue-{requeue}"

    @property
    def stacks(self) -> Path:
        """``hpclaunch stacks``' requests, and the agents' answers to them."""
        return self.root / STACKS


@dataclass(frozen=True)
class ExecutorFolder:
    """An ``hpclaunch.Executor``'s folder: submitit's pickles, and hpclaunch's notes
    shared by the job handles (login node) and the worker ranks."""

    root: Path

    def info(self, job_id: str) -> Path:
        """Where rank 0 notes which SLURM job (and job folder) ran submitit's ``job_id``:
        an array task's submitit id (``123_4``) is not its SLURM job id."""
        return self.root / f"{job_id}{EXECUTOR_INFO_SUFFIX}"

    def finished_root(self, job_id: str) -> Path:
        return self.root / f".{job_id}_finished"

    def every_result(self, job_id: str) -> Path:
        """Every rank's return value, in rank order (``job.results()``); rank 0's alone
        is submitit's result pickle (``job.result()``)."""
        return self.root / f"{job_id}_every_result.pkl"

    def finished(self, job_id: str, environ: Mapping[str, str]) -> Path:
        """Where the ranks of one run of the worker group note that their call returned:
        the same folder on every node, a new one for every restart of the group."""
        run = "-".join(environ.get(name) or "0" for name in _RUN_VARS)
        return self.finished_root(job_id) / run


def _step_order(step: str) -> tuple[int, int]:
    """Job steps in the order they ran: the batch step ("batch") before srun's 0, 1, ..."""
    return (1, int(step)) if step.isdigit() else (0, 0)


def number_of(name: str) -> int | None:
    """``attempt-3`` -> 3; None for a name of another form."""
    _, _, number = name.rpartition("-")
    return int(number) if number.isdigit() else None
