"""The job handles ``hpclaunch.Executor`` returns: submitit's ``Job`` with
hpclaunch's logs, failures and a state that needs no accounting database.

``result()`` returns global rank 0's return value. When the job ends without
one, it raises submitit's ``FailedJobError`` with hpclaunch's root-cause block
(the first failing rank, its node and its traceback), or ``UncompletedJobError``
with the SLURM state and the end of the batch log.
"""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path
from typing import Any, TypeVar

from submitit.core.utils import FailedJobError, UncompletedJobError
from submitit.local.local import LocalJob as _SubmititLocalJob
from submitit.slurm.slurm import SlurmInfoWatcher
from submitit.slurm.slurm import SlurmJob as _SubmititSlurmJob

from hpclaunch.jobdir.layout import ExecutorFolder, JobFolder, RankFile, batch_log
from hpclaunch.ops import status as jobstatus
from hpclaunch.slurm.commands import Slurm
from hpclaunch.slurm.states import JobState, is_final

R = TypeVar("R")

# submitit's state of a job no command has said anything of yet.
UNKNOWN_STATE = "UNKNOWN"
LOG_TAIL_LINES = 40
# After SLURM says the job ended, how long result() waits for rank 0's result
# file to be visible (a shared filesystem may show it late).
RESULT_GRACE_S = 5.0


class ScontrolWatcher(SlurmInfoWatcher):
    """Job states from ``scontrol show job``, which needs no accounting database,
    then from ``sacct`` once SLURM has forgotten the job (after MinJobAge)."""

    def __init__(self, delay_s: int = 30, slurm: Slurm | None = None) -> None:
        super().__init__(delay_s)
        self._slurm = slurm or Slurm()

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        return self.get_info(job_id, mode=mode).get("State") or UNKNOWN_STATE

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        return is_final(self.get_state(job_id, mode=mode))

    def update(self) -> None:
        self._num_calls += 1
        for job_id in sorted(self._registered - self._finished):
            info = self._query(job_id)
            if info:
                self._info_dict[job_id] = info
        self._last_status_check = time.time()
        for job_id in self._registered - self._finished:
            if self.is_done(job_id, mode="cache"):
                self._finished.add(job_id)

    def _query(self, job_id: str) -> dict[str, str]:
        """submitit's info dict of the job; empty when SLURM said nothing new."""
        answer = self._slurm.lookup(job_id)
        record = answer.record
        if record is not None:
            restarts = "" if record.restarts is None else str(record.restarts)
            return {
                "State": record.state or "",
                "NodeList": record.nodes,
                "JobId": record.job_id or "",
                "Restarts": restarts,
            }
        if answer.forgotten and answer.sacct_error is not None:
            # Ended longer ago than MinJobAge, and no accounting to ask: it runs no
            # more (a controller that cannot be reached says otherwise).
            return {"State": JobState.ENDED.value, "JobId": job_id}
        return {}


class _HpclaunchLogs:
    """Where an hpclaunch job's logs and failure records are, for both backends."""

    job_id: str
    _log_dir: Path
    _job_name: str

    def _info(self) -> dict[str, Any]:
        try:
            data = json.loads(ExecutorFolder(self._folder()).info(self.job_id).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _folder(self) -> Path:
        folder: Path = self.paths.folder  # type: ignore[attr-defined]
        return folder

    @property
    def slurm_job_id(self) -> str:
        """SLURM's own id of the job (an array task has one besides ``123_4``)."""
        return str(self._info().get("slurm_job_id") or self.job_id)

    @property
    def job_dir(self) -> Path:
        """hpclaunch's folder of this job: rank logs, failure records, checkpoints."""
        given = self._info().get("job_dir")
        return Path(given) if given else JobFolder.of(self._log_dir, self.slurm_job_id).root

    def rank_log(self, rank: int, kind: str = "out") -> Path | None:
        """The latest run's log of global ``rank``: ``kind`` is ``out``, ``err`` or
        ``json`` (torch's error file). None while there is none. Raises ValueError for
        another ``kind``."""
        kinds = {k.value: k for k in RankFile}
        if kind not in kinds:
            raise ValueError(f"rank_log(kind={kind!r}): give one of {', '.join(kinds)}")
        for attempt in reversed(JobFolder(self.job_dir).attempts()):
            path = attempt.rank_file(rank, kinds[kind])
            if path.exists():
                return path
        return None

    def results(self) -> list[Any]:
        """Every rank's return value, in global rank order, as submitit gives one per
        task; ``result()`` stays global rank 0's. Raises what ``result()`` raises."""
        first: list[Any] = super().results()  # type: ignore[misc]  # waits; raises on failure
        try:
            raw = ExecutorFolder(self._folder()).every_result(self.job_id).read_bytes()
        except FileNotFoundError:  # a job from before this file existed
            return first
        values: list[Any] = pickle.loads(raw)
        return values

    def root_cause(self) -> str | None:
        """The root-cause block of the job's last failed run, if any."""
        from hpclaunch.record.job_record import JobRecord

        number = self.slurm_job_id
        job_id = int(number) if number.isdigit() else 0  # only names the job in messages
        return jobstatus.root_cause(JobRecord.read(self.job_dir, job_id))

    def exception(self) -> UncompletedJobError | FailedJobError | None:
        """submitit's, pointing at hpclaunch's logs rather than submitit's."""
        self.wait()  # type: ignore[attr-defined]
        try:
            outcome, block = self._get_outcome_and_result()  # type: ignore[attr-defined]
        except UncompletedJobError as exc:
            return exc
        if outcome != "error":
            return None
        return FailedJobError(
            f"job {self.job_id} failed:\n{str(block).rstrip()}\n"
            f"every rank's log: {JobFolder(self.job_dir).logs}; the job's: {self._own_log()}"
        )

    def _own_log(self) -> Path:
        return self.paths.stdout  # type: ignore[attr-defined,no-any-return]

    def _missing_result(self, state: str, log: str | None) -> tuple[str, Any]:
        block = self.root_cause()
        if block is not None:
            return "error", block
        lines = [f"job {self.job_id} ended ({state}) without a result from rank 0"]
        if log:
            lines += ["the end of its log:", *log.splitlines()[-LOG_TAIL_LINES:]]
        raise UncompletedJobError("\n".join(lines))


class Job(_HpclaunchLogs, _SubmititSlurmJob[R]):
    """A job submitted to SLURM by ``hpclaunch.Executor``."""

    watcher = ScontrolWatcher()

    @property
    def batch_log(self) -> Path:
        """The batch step's log: the supervisor's and every agent's output."""
        return batch_log(self._log_dir, self._job_name, self.slurm_job_id)

    def _own_log(self) -> Path:
        return self.batch_log

    def stdout(self) -> str | None:
        try:
            return self.batch_log.read_text(errors="replace")
        except OSError:
            return None

    def stderr(self) -> str | None:
        """The ranks' stderr: see ``ranks_stderr``. (SLURM writes the batch step's own
        stderr into the log of ``stdout()``.)"""
        return ranks_stderr(self.job_dir)

    def _get_outcome_and_result(self) -> tuple[str, Any]:
        deadline = time.monotonic() + RESULT_GRACE_S
        while not self.paths.result_pickle.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.paths.result_pickle.exists():
            return super()._get_outcome_and_result()
        return self._missing_result(self.state, self.stdout())


class LocalJob(_HpclaunchLogs, _SubmititLocalJob[R]):
    """A job run on this machine by ``hpclaunch.Executor(cluster="local")``."""

    def _get_outcome_and_result(self) -> tuple[str, Any]:
        if self.paths.result_pickle.exists():
            return super()._get_outcome_and_result()
        return self._missing_result(self.state, self.stdout())


def ranks_stderr(job_dir: Path) -> str | None:
    """Every rank's stderr in the job's latest attempt, rank by rank, each line prefixed
    ``[rankR]`` as the batch log prefixes their stdout; None while no rank has run."""
    attempts = JobFolder(job_dir).attempts()
    if not attempts:
        return None
    files = {
        _rank_of(path): path for path in attempts[-1].path.glob(f"rank-*.{RankFile.ERR.value}")
    }
    lines = []
    for rank in sorted(r for r in files if r is not None):
        text = files[rank].read_text(errors="replace")
        lines += [f"[rank{rank}] {line}" for line in text.splitlines()]
    return "".join(f"{line}\n" for line in lines)


def _rank_of(path: Path) -> int | None:
    try:
        return int(path.name.split(".")[0].removeprefix("rank-"))
    except ValueError:
        return None


def attach(job: Any, log_dir: Path, job_name: str) -> None:
    """Give a job made by submitit what hpclaunch needs to find its logs."""
    job._log_dir = log_dir
    job._job_name = job_name


# What an Executor returns: a SLURM job, or a job on this machine (cluster="local").
AnyJob = Job[R] | LocalJob[R]
