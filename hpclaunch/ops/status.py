"""What ``hpclaunch status`` knows about a job, from SLURM and from the job folder.

SLURM says the state, the nodes and the requeue count (``scontrol show job``
while it remembers the job, ``sacct`` afterwards where accounting exists). The
job folder says the rest: ``history.json`` (every run, why it ended, the nodes
kept out), the rank logs (the worker group's attempts), the failure records
(the root cause) and the checkpoints. Either side may be missing; what is known
is reported, and ``notes`` say what could not be read. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpclaunch import checkpoint
from hpclaunch.errors import SlurmError, SlurmNotFound
from hpclaunch.jobdir import failures
from hpclaunch.jobdir.history import Action, History, HistoryError, Reason
from hpclaunch.jobdir.layout import JobFolder, batch_log
from hpclaunch.ops import registry
from hpclaunch.slurm.commands import Slurm
from hpclaunch.slurm.hostlist import HostlistError, expand

# SLURM states after which the job runs no more (REQUEUED and PENDING are not);
# ENDED is hpclaunch's, for a job SLURM forgot without saying how it ended.
FINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "PREEMPTED", "ENDED",
})  # fmt: skip
# A run that ended the job, by what the supervisor did next and why: the state to show
# once SLURM has forgotten the job. After a requeue the job is not over.
_ENDING_ACTIONS = {
    Action.NONE.value,
    Action.GIVE_UP.value,
    Action.REQUEUE_FAILED.value,
}
_REQUEUED_ACTIONS = {Action.REQUEUE.value, Action.SLURM_REQUEUES.value}
_HISTORY_STATES = {
    Reason.COMPLETED.value: "COMPLETED",
    Reason.CANCELLED.value: "CANCELLED",
}
# scontrol's answer for a job it no longer remembers (ended longer ago than MinJobAge).
SCONTROL_INVALID_JOB = "Invalid job id"


def history_state(action: str | None, reason: str | None) -> str | None:
    """The state history.json gives a run that has ended: the job's, when that run was
    its last; None when the run did not say."""
    if action in _REQUEUED_ACTIONS:
        return "REQUEUED"
    if action in _ENDING_ACTIONS:
        if action == Action.NONE.value:
            return _HISTORY_STATES.get(reason or "", "FAILED")
        return "FAILED"
    return None


@dataclass(frozen=True)
class Exclusion:
    node: str
    reason: str  # why the run that kept it out ended, and the error seen there


@dataclass(frozen=True)
class RunSummary:
    requeue: int
    nodes: list[str]
    started: float
    ended: float | None
    reason: str | None
    action: str | None


@dataclass
class JobStatus:
    """Everything ``hpclaunch status`` prints; ``to_json`` is its ``--json``."""

    job_id: int
    state: str | None = None  # SLURM's, or derived from history.json (see state_source)
    state_source: str | None = None  # "scontrol", "sacct" or "history"
    pending_reason: str | None = None
    name: str | None = None
    nodes: list[str] = field(default_factory=list)
    exit_code: str | None = None  # SLURM's ExitCode, "STATUS:SIGNAL"
    requeues: int | None = None
    max_requeues: int | None = None
    attempts: int = 0  # the worker group's attempts in the latest run (1: no restart)
    attempts_total: int = 0  # in every run
    excluded: list[Exclusion] = field(default_factory=list)
    checkpoint_step: int | None = None
    checkpoint_path: str | None = None
    checkpoint_dir: str | None = None
    root_cause: str | None = None  # the latest run's root-cause block, if it failed
    job_dir: str | None = None
    batch_log: str | None = None
    runs: list[RunSummary] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    slurm_forgot: bool = False  # scontrol: "Invalid job id", and no sacct answer
    slurm_unreachable: bool = False  # SLURM's commands are missing, or did not answer

    @property
    def ended(self) -> bool:
        return self.state is not None and self.state.split()[0] in FINAL_STATES

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ended"] = self.ended
        return data


def gather(
    job_id: int,
    slurm: Slurm | None,
    env: Mapping[str, str],
    job_dir: Path | None = None,
) -> JobStatus:
    """The job's status. ``job_dir`` overrides where the job folder is looked for;
    ``slurm`` None: do not ask SLURM (it is known to be unreachable)."""
    status = JobStatus(job_id)
    fields: dict[str, str] = {}
    if slurm is None:
        status.slurm_unreachable = True
    else:
        fields = _slurm_fields(job_id, slurm, status)
    entry = registry.find(env, job_id)
    folder = job_dir or locate(job_id, entry, fields)
    if folder is None:
        status.notes.append(
            f"job {job_id}'s folder is unknown (not in {registry.path(env)}, and SLURM "
            "does not say where its log is); pass --job-dir LOG_DIR/JOBID"
        )
    elif not folder.is_dir():
        status.notes.append(f"job folder {folder} does not exist (or is not shared here)")
    else:
        status.job_dir = str(folder)
        _from_folder(folder, status)
    if status.name is None and entry is not None:
        status.name = entry.name
    if status.state is None and status.slurm_forgot and status.runs:
        last = status.runs[-1]
        if last.ended is not None:
            status.state = history_state(last.action, last.reason)
            status.state_source = "history" if status.state else None
        if status.state in (None, "REQUEUED"):
            status.state, status.state_source = "ENDED", "history"
            status.notes.append(
                "SLURM no longer knows the job and its last run did not record how it "
                "ended (cancelled while pending, or its batch node was lost)"
            )
    if status.batch_log is None and status.job_dir is not None:
        status.batch_log = _batch_log(Path(status.job_dir).parent, job_id, status.name)
    return status


def _batch_log(log_dir: Path, job_id: int, name: str | None) -> str | None:
    """``LOG_DIR/NAME-JOBID.out``, the rendered script's --output."""
    if name is not None and batch_log(log_dir, name, job_id).exists():
        return str(batch_log(log_dir, name, job_id))
    found = sorted(log_dir.glob(batch_log(Path(), "*", job_id).name))
    return str(found[0]) if found else None


def locate(job_id: int, entry: registry.Entry | None, fields: Mapping[str, str]) -> Path | None:
    """The job folder: the job list's entry, else the folder of SLURM's ``StdOut``
    (the rendered script writes the batch log next to the job folders)."""
    if entry is not None:
        return Path(entry.job_dir)
    out = fields.get("StdOut", "")
    if out.startswith("/"):
        return JobFolder.of(Path(out).parent, job_id).root
    return None


def _first_line(exc: SlurmError) -> str:
    text = (exc.stderr.strip() or str(exc)).splitlines()
    return text[0] if text else "no answer"


def _slurm_fields(job_id: int, slurm: Slurm, status: JobStatus) -> dict[str, str]:
    try:
        fields = slurm.job_fields(job_id)
    except SlurmNotFound:
        status.slurm_unreachable = True
        status.notes.append("SLURM's commands are not on PATH here; showing the job folder only")
        return {}
    except SlurmError as exc:
        forgotten = SCONTROL_INVALID_JOB in exc.stderr
        try:
            accounted = slurm.accounted_job(job_id)
        except SlurmError as sacct:
            status.slurm_forgot = forgotten
            status.slurm_unreachable = not forgotten
            status.notes.append(f"scontrol: {_first_line(exc)}; sacct: {_first_line(sacct)}")
            return {}
        if not accounted:
            status.slurm_forgot = forgotten
            status.notes.append(f"neither scontrol nor sacct knows job {job_id}")
            return {}
        status.state, status.state_source = accounted.get("State") or None, "sacct"
        status.nodes = _hosts(accounted.get("NodeList", ""))
        status.exit_code = accounted.get("ExitCode") or None
        return accounted
    status.state, status.state_source = fields.get("JobState") or None, "scontrol"
    status.name = fields.get("JobName") or None
    status.nodes = _hosts(fields.get("NodeList", ""))
    status.exit_code = fields.get("ExitCode") or None
    reason = fields.get("Reason", "")
    if status.state == "PENDING" and reason and reason != "None":
        status.pending_reason = reason
    restarts = fields.get("Restarts", "")
    if restarts.isdigit():
        status.requeues = int(restarts)
    out = fields.get("StdOut", "")
    if out.startswith("/") and Path(out).exists():
        status.batch_log = out
    return fields


def _hosts(hostlist: str) -> list[str]:
    if not hostlist or hostlist in ("(null)", "None assigned"):
        return []
    try:
        return expand(hostlist)
    except HostlistError:
        return [hostlist]


def _from_folder(folder: Path, status: JobStatus) -> None:
    try:
        history = History.load(folder, status.job_id)
    except HistoryError as exc:
        status.notes.append(str(exc))
        history = None
    if history is not None and history.runs:
        status.max_requeues = history.max_requeues
        if status.requeues is None:
            status.requeues = history.requeues
        for run in history.runs:
            status.runs.append(RunSummary(run.requeue_count, _hosts(run.nodes), run.started,
                                          run.ended, run.reason, run.action))  # fmt: skip
            why = run.reason or "unknown"
            if run.error:
                why += f": {run.error}"
            status.excluded += [Exclusion(node, why) for node in run.excluded]
    elif history is not None:
        status.notes.append(f"no history.json in {folder} yet (the job has not started)")
    found = JobFolder(folder).attempts()
    status.attempts_total = len(found)
    if found:
        latest = found[-1].requeue
        status.attempts = len({(a.step, a.attempt) for a in found if a.requeue == latest})
    ckpt_dir = Path(history.checkpoint_dir) if history and history.checkpoint_dir else None
    ckpt_dir = ckpt_dir or JobFolder(folder).checkpoints
    status.checkpoint_dir = str(ckpt_dir)
    try:
        complete = checkpoint.complete(ckpt_dir)
    except OSError as exc:
        status.notes.append(f"checkpoint folder {ckpt_dir} cannot be read: {exc.strerror}")
        complete = []
    if complete:
        status.checkpoint_step, status.checkpoint_path = complete[-1].step, str(complete[-1].path)
    status.root_cause = root_cause(folder, status.runs)


def root_cause(folder: Path, runs: Sequence[RunSummary] = ()) -> str | None:
    """The root-cause block of the latest run that has one (of the latest of ``runs``
    only, when given): the culprit's, as the supervisor printed it (the first bad
    node, else the earliest error of its own)."""
    layout = JobFolder(folder)
    latest = max((r.requeue for r in runs), default=None)
    for requeue_count, _ in reversed(layout.failure_runs()):
        if latest is not None and requeue_count != latest:
            return None  # an earlier run's failure is not why the job is where it is
        if not layout.root_causes(requeue_count):
            continue
        records = failures.read(folder, requeue_count)
        nodes = next((r.nodes for r in runs if r.requeue == requeue_count), [])
        node = failures.culprit(records, failures.classify(records, nodes))
        block = failures.read_block(folder, requeue_count, node)
        if block is not None:
            return block.rstrip()
    return None


def exit_status(status: JobStatus) -> int:
    """The exit status that mirrors the job's: 0 when it completed, its own exit
    status when it has one, else 1."""
    if status.state == "COMPLETED":
        return 0
    code = (status.exit_code or "").partition(":")[0]
    return int(code) if code.isdigit() and int(code) != 0 else 1
