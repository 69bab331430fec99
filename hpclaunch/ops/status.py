"""What ``hpclaunch status`` knows about a job, from SLURM and from the job folder.

SLURM says the state, the nodes and the requeue count (``scontrol show job``
while it remembers the job, ``sacct`` afterwards where accounting exists). The
job folder, read once into a job record (hpclaunch.record), says the rest: every run
and why it ended, the nodes kept out, the worker group's attempts, the training's
progress, the work each run lost, the goodput, the hangs, the root cause and the
checkpoints. Either side may be missing; what is known is reported, and ``notes`` say
what could not be read. No torch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hpclaunch.errors import ExitCode, HpclaunchError
from hpclaunch.jobdir import failures, hangs, saves, silent_agents
from hpclaunch.jobdir.history import Action, Reason
from hpclaunch.jobdir.layout import JobFolder, batch_log
from hpclaunch.ops import deadends, registry, unclosed
from hpclaunch.record import checkpoints, goodput, lost_work, signals, training
from hpclaunch.record.attempts import Attempt, of_job
from hpclaunch.record.checkpoints import Kind, Saved
from hpclaunch.record.goodput import Timeline
from hpclaunch.record.job_record import JobRecord
from hpclaunch.slurm.commands import Slurm
from hpclaunch.slurm.hostlist import HostlistError, expand
from hpclaunch.slurm.states import JobState, SlurmRecord, Source, is_final

# A run that ended the job, by what the supervisor did next and why: the state to show
# once SLURM has forgotten the job. After a requeue the job is not over.
_ENDING_ACTIONS = {
    Action.NONE.value,
    Action.GIVE_UP.value,
    Action.REQUEUE_FAILED.value,
}
_REQUEUED_ACTIONS = {Action.REQUEUE.value, Action.SLURM_REQUEUES.value}
_HISTORY_STATES = {
    Reason.COMPLETED.value: JobState.COMPLETED,
    Reason.CANCELLED.value: JobState.CANCELLED,
}


def history_state(action: str | None, reason: str | None) -> str | None:
    """The state history.json gives a run that has ended: the job's, when that run was
    its last; None when the run did not say."""
    if action in _REQUEUED_ACTIONS:
        return JobState.REQUEUED.value
    if action in _ENDING_ACTIONS:
        if action == Action.NONE.value:
            return _HISTORY_STATES.get(reason or "", JobState.FAILED).value
        return JobState.FAILED.value
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
    # An open run that has ended (hpclaunch.ops.unclosed): shown instead of "running".
    unclosed: str | None = None


@dataclass
class JobStatus:
    """Everything ``hpclaunch status`` prints; ``to_json`` is its ``--json``."""

    job_id: int
    state: str | None = None  # SLURM's, or derived from history.json (see state_source)
    state_source: str | None = None  # "scontrol", "sacct" or "history"
    pending_reason: str | None = None
    never_starts: str | None = None  # why a pending job can never start (ops.deadends)
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
    checkpoint_written: float | None = None  # when hpclaunch's own last checkpoint was written
    checkpoint_patterns: list[str] = field(default_factory=list)  # --checkpoint-pattern's
    found_checkpoint: str | None = None  # the job's newest match of those, or Lightning's
    found_checkpoint_written: float | None = None  # its modification time
    last_save: str | None = None  # the newest save's times (hpclaunch.jobdir.saves)
    progress: str | None = None  # the current run's step, rate and ETA (training.line)
    training: training.Training | None = None  # the same, as numbers
    restarts: list[str] = field(default_factory=list)  # why the latest run restarted in place
    lost_work: list[lost_work.RunLoss] = field(default_factory=list)  # what runs repeated
    hangs: list[str] = field(default_factory=list)  # each hang: the rank it began with
    root_cause: str | None = None  # the latest run's root-cause block, if it failed
    verdict: str | None = None  # why the latest run ended, where no node is to blame
    job_dir: str | None = None
    batch_log: str | None = None
    runs: list[RunSummary] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unreadable: str | None = None  # why the job folder could not be read at all
    slurm_forgot: bool = False  # scontrol: "Invalid job id", and no sacct answer
    slurm_unreachable: bool = False  # SLURM's commands are missing, or did not answer
    goodput: goodput.Split | None = None  # the wall time's split (hpclaunch.record.goodput)
    # What the goodput was cut from (``hpclaunch report`` draws it); not in --json.
    timeline: Timeline | None = field(default=None, repr=False, compare=False)

    @property
    def job_state(self) -> JobState | None:
        """``state`` as a JobState; None when unknown (or one a later SLURM added)."""
        return JobState.parse(self.state)

    @property
    def ended(self) -> bool:
        return is_final(self.state)

    @property
    def found_is_last(self) -> bool:
        """Whether the checkpoint found by pattern is the last one: newer than hpclaunch's
        own, or hpclaunch has none."""
        if self.found_checkpoint_written is None:
            return False
        own = self.checkpoint_written
        return self.checkpoint_path is None or own is None or self.found_checkpoint_written > own

    @property
    def last_checkpoint(self) -> str | None:
        """The path the report names as the last checkpoint; None when there is none."""
        return self.found_checkpoint if self.found_is_last else self.checkpoint_path

    def to_json(self) -> dict[str, Any]:
        data = {
            key: value
            for key, value in asdict(replace(self, timeline=None)).items()
            if key != "timeline"
        }
        data["lost_work"] = [loss.to_json() for loss in self.lost_work]
        data["ended"] = self.ended
        data["last_checkpoint"] = self.last_checkpoint
        return data


def gather(
    job_id: int,
    slurm: Slurm | None,
    env: Mapping[str, str],
    job_dir: Path | None = None,
    now: float | None = None,
) -> JobStatus:
    """The job's status. ``job_dir`` overrides where the job folder is looked for;
    ``slurm`` None: do not ask SLURM (it is known to be unreachable)."""
    now = time.time() if now is None else now
    status = JobStatus(job_id)
    slurm_record = None
    if slurm is None:
        status.slurm_unreachable = True
    else:
        slurm_record = _from_slurm(job_id, slurm, status)
    entry = registry.find(env, job_id)
    folder = job_dir or locate(job_id, entry, slurm_record)
    record = None
    if folder is None:
        status.notes.append(
            f"job {job_id}'s folder is unknown (not in {registry.path(env)}, and SLURM "
            "does not say where its log is); pass --job-dir LOG_DIR/JOBID"
        )
    elif (unreadable := _unreadable(folder)) is not None:
        status.unreadable = unreadable
        status.notes.append(unreadable)
    elif not folder.is_dir():
        status.notes.append(f"job folder {folder} does not exist (or is not shared here)")
    else:
        status.job_dir = str(folder)
        record = JobRecord.read(folder, job_id)
        _from_history(record, status)
    if status.name is None and entry is not None:
        status.name = entry.name
    if status.state is None and status.slurm_forgot and status.runs:
        last = status.runs[-1]
        if last.ended is not None:
            status.state = history_state(last.action, last.reason)
            status.state_source = "history" if status.state else None
        if status.state in (None, JobState.REQUEUED.value):
            status.state, status.state_source = JobState.ENDED.value, "history"
            status.notes.append(
                "SLURM no longer knows the job and its last run did not record how it "
                "ended (cancelled while pending, or its batch node was lost)"
            )
    if record is not None:
        submitted = entry.submitted if entry is not None else None
        _from_record(record, status, submitted, now)
    if status.batch_log is None and status.job_dir is not None:
        status.batch_log = _batch_log(Path(status.job_dir).parent, job_id, status.name)
    _unclosed(status)
    return status


def _unclosed(status: JobStatus) -> None:
    """The runs the history leaves open that have ended, as far as SLURM's state (not a
    state the history gave) and the batch log tell (hpclaunch.ops.unclosed)."""
    if not any(run.reason is None for run in status.runs):
        return
    from_slurm = status.state_source in (Source.SCONTROL.value, Source.SACCT.value)
    state = status.job_state if from_slurm else None
    last = status.runs[-1]
    ended = last.reason is None and state is not None and state.final
    error = unclosed.said_unwritten(status.batch_log) if ended else None
    found = unclosed.texts([(r.requeue, r.reason) for r in status.runs], state, error)
    status.runs = [replace(run, unclosed=found.get(run.requeue)) for run in status.runs]
    if ended and state is not None and status.job_dir is not None:
        history = JobFolder(Path(status.job_dir)).history
        status.notes.append(unclosed.note(last.requeue, state, error, history))


class JobNotFound(HpclaunchError):
    """Neither SLURM nor the job folder knows the job."""


def find(
    job_id: int, slurm: Slurm | None, env: Mapping[str, str], job_dir: Path | None = None
) -> JobStatus:
    """The status of a job that SLURM or its folder knows. Raises JobNotFound (exit
    code SLURM's when SLURM could not be asked) naming what was tried."""
    status = gather(job_id, slurm, env, job_dir)
    if status.state is None and status.job_dir is None:
        error = JobNotFound(f"job {job_id} (from JOBID) is unknown: " + "; ".join(status.notes))
        if status.slurm_unreachable:  # not unknown: SLURM could not be asked
            error.exit_code = ExitCode.SLURM
        raise error
    return status


def _unreadable(folder: Path) -> str | None:
    """Why the job folder ``folder`` cannot even be looked at (a name too long, no
    permission on the way to it); None when it can (it may not exist)."""
    try:
        folder.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return f"job folder {_short(str(folder))} cannot be read: {exc.strerror or exc}"
    return None


def _short(path: str) -> str:
    """``path``, its middle cut out when it is long (a log line, a table cell)."""
    return path if len(path) <= 120 else f"{path[:60]}...{path[-40:]} ({len(path)} characters)"


def _batch_log(log_dir: Path, job_id: int, name: str | None) -> str | None:
    """``LOG_DIR/NAME-JOBID.out``, the rendered script's --output; a name too long for a
    file name (before hpclaunch refused one at submit) is looked for by the job id."""
    try:
        if name is not None and batch_log(log_dir, name, job_id).exists():
            return str(batch_log(log_dir, name, job_id))
        found = sorted(log_dir.glob(batch_log(Path(), "*", job_id).name))
    except OSError:
        return None
    return str(found[0]) if found else None


def locate(job_id: int, entry: registry.Entry | None, record: SlurmRecord | None) -> Path | None:
    """The job folder: the job list's entry, else the folder of SLURM's ``StdOut``
    (the rendered script writes the batch log next to the job folders)."""
    if entry is not None:
        return Path(entry.job_dir)
    out = (record.stdout if record is not None else None) or ""
    if out.startswith("/"):
        return JobFolder.of(Path(out).parent, job_id).root
    return None


def _from_slurm(job_id: int, slurm: Slurm, status: JobStatus) -> SlurmRecord | None:
    """What SLURM says, into ``status``; the record, None when there is none."""
    answer = slurm.lookup(job_id)
    status.slurm_forgot, status.slurm_unreachable = answer.forgotten, answer.unreachable
    record = answer.record
    if answer.not_on_path:
        status.notes.append("SLURM's commands are not on PATH here; showing the job folder only")
    elif record is None and answer.sacct_error is not None:
        status.notes.append(f"scontrol: {answer.scontrol_error}; sacct: {answer.sacct_error}")
    elif record is None:
        status.notes.append(f"neither scontrol nor sacct knows job {job_id}")
    if record is None:
        return None
    status.state, status.state_source = record.state, record.source.value
    status.nodes = _hosts(record.nodes)
    status.exit_code = record.exit_code
    if record.source is Source.SCONTROL:
        status.name = record.name
        if record.job_state is JobState.PENDING:
            status.pending_reason = record.reason
            status.never_starts = deadends.never_starts(job_id, record.reason, slurm)
        status.requeues = record.restarts
        out = record.stdout or ""
        if out.startswith("/") and Path(out).exists():
            status.batch_log = out
    return record


def _hosts(hostlist: str) -> list[str]:
    if not hostlist or hostlist in ("(null)", "None assigned"):
        return []
    try:
        return expand(hostlist)
    except HostlistError:
        return [hostlist]


def _from_history(record: JobRecord, status: JobStatus) -> None:
    """The runs, the nodes kept out and the verdict, from the history in ``record``."""
    history = record.history
    if record.history_error is not None:
        status.notes.append(record.history_error)
    elif not history.runs:
        status.notes.append(f"no history.json in {record.root} yet (the job has not started)")
    if not history.runs:
        return
    status.max_requeues = history.max_requeues
    if status.requeues is None:
        status.requeues = history.requeues
    for run in history.runs:
        status.runs.append(
            RunSummary(
                run.requeue_count, _hosts(run.nodes), run.started, run.ended, run.reason, run.action
            )
        )
        why = run.reason or "unknown"
        if run.error:
            why += f": {run.error}"
        status.excluded += [Exclusion(node, why) for node in run.excluded]
    status.verdict = history.runs[-1].verdict


def _from_record(record: JobRecord, status: JobStatus, submitted: float | None, now: float) -> None:
    """What the job folder says beyond the history: attempts, checkpoints, saves, progress,
    restarts, lost work, hangs, goodput, the root cause."""
    status.notes += signals.notes(
        record.runs[r.requeue] for r in status.runs if r.requeue in record.runs
    )
    status.notes += record.notes
    status.attempts_total = len(record.attempt_logs)
    if record.attempt_logs:
        latest = record.attempt_logs[-1].requeue
        status.attempts = len(
            {(a.step, a.attempt) for a in record.attempt_logs if a.requeue == latest}
        )
    status.checkpoint_dir = str(record.checkpoint_dir)
    status.checkpoint_patterns = list(record.history.checkpoint_patterns)
    committed = record.checkpoints.committed
    if committed:
        status.checkpoint_step, status.checkpoint_path = committed[-1].step, str(committed[-1].path)
        status.checkpoint_written = committed[-1].written
    saved = checkpoints.known(record)
    own = [s for s in saved if s.kind in (Kind.PATTERN, Kind.LIGHTNING)]
    if own:
        status.found_checkpoint = (
            own[-1].label
            if own[-1].kind is Kind.PATTERN
            else str(record.checkpoint_dir / own[-1].label)
        )
        status.found_checkpoint_written = own[-1].time
    attempts = of_job(record)
    _progress(record, status, attempts, now)
    _lost_work(record, status, attempts, saved)
    _saves(record, status)
    status.root_cause = root_cause(record, status.runs)
    if status.runs:
        running = status.job_state is JobState.RUNNING
        status.timeline = goodput.of_record(record, submitted, now, status.ended, running)
        status.goodput = status.timeline.split if status.timeline else None


def _current_run(record: JobRecord, status: JobStatus) -> int | None:
    """The run the job is on now: SLURM's requeue count, or the history's latest run
    when SLURM does not say (its requeue count comes first after a requeue)."""
    latest = max((r.requeue for r in status.runs), default=None)
    if status.requeues is not None and status.state_source in ("scontrol", "sacct"):
        return max(status.requeues, latest or 0)
    return latest


def _progress(
    record: JobRecord, status: JobStatus, attempts: Mapping[int, list[Attempt]], now: float
) -> None:
    """The current run's progress and restarts, and every hang."""
    status.hangs = [
        hangs.describe(hung)
        for hung in hangs.first_hung([r for run in record.runs.values() for r in run.hangs])
    ]
    current = _current_run(record, status)
    if current is None:
        return
    run = record.run(current)
    if status.job_state is JobState.RUNNING:  # once the run ends, its history says why
        ended = {end.node for end in run.ends}
        status.notes += [
            f"run {current}: {silent_agents.describe(s)}" for s in run.silent if s.node not in ended
        ]
    on_nodes = status.nodes if status.job_state is JobState.RUNNING else []
    status.training = training.of_run(run, attempts.get(current, []), now, on_nodes)
    if status.training is not None and status.job_state not in (JobState.RUNNING, None):
        status.training = replace(status.training, eta_s=None)  # not stepping any more
    status.progress = training.line(status.training, now) if status.training else None
    status.restarts = training.restarts(run, record.attempt_logs)


def _lost_work(
    record: JobRecord,
    status: JobStatus,
    attempts: Mapping[int, list[Attempt]],
    saved: Sequence[Saved],
) -> None:
    """What each run that another one followed (or that was requeued) did twice."""
    told = []
    for index, run in enumerate(status.runs):
        after = status.runs[index + 1] if index + 1 < len(status.runs) else None
        if after is None and run.action not in _REQUEUED_ACTIONS:
            continue
        ended = run.ended if run.ended is not None or after is None else after.started
        told.append((run.requeue, ended, [r.requeue for r in status.runs[index + 1 :]]))
    status.lost_work = lost_work.of_runs(told, attempts, saved, status.ended)
    done = status.training.step or status.training.counted if status.training else 0
    warning = lost_work.never_saved(saved, attempts, done)
    if warning:
        status.notes.append(warning)


def _saves(record: JobRecord, status: JobStatus) -> None:
    """The newest save's times, a warning when saves outgrow the signal lead, and the
    checkpoints set aside as damaged."""
    if record.saves:
        status.last_save = record.saves[-1].describe()
    slowest = saves.slowest(record.saves)
    lead = record.history.signal_lead_s
    warning = checkpoints.lead_warning(slowest, lead) if slowest and lead else None
    if warning:
        status.notes.append(warning)
    named = set()
    for aside in record.set_aside:
        status.notes.append(aside.describe())
        named.add(Path(aside.renamed_to).name)
    # Set aside by an hpclaunch that noted no reason, or by hand.
    unnamed = [name for name in record.checkpoints.damaged if name not in named]
    if unnamed:
        status.notes.append(
            f"set aside as damaged (failed to load; the previous checkpoint was used): "
            f"{', '.join(unnamed)} in {record.checkpoint_dir}"
        )


def root_cause(record: JobRecord, runs: Sequence[RunSummary] = ()) -> str | None:
    """The root-cause block of the latest run that has one (of the latest of ``runs``
    only, when given): the culprit's, as the supervisor printed it (the first bad
    node, else the earliest error of its own; none for a hang)."""
    latest = max((r.requeue for r in runs), default=None)
    for requeue in sorted(record.runs, reverse=True):
        run = record.runs[requeue]
        if not run.failures and not run.root_causes:
            continue
        if latest is not None and requeue != latest:
            return None  # an earlier run's failure is not why the job is where it is
        if not run.root_causes:
            continue
        nodes = next((r.nodes for r in runs if r.requeue == requeue), [])
        shared = failures.shared_folders(record.root, record.checkpoint_dir)
        finding = failures.classify(run.failures, nodes, shared)
        if finding.verdict is failures.Verdict.HANG:
            return None  # every block is a waiting rank's; the verdict says it
        block = run.block(failures.culprit(run.failures, finding))
        if block is not None:
            return block.rstrip()
    return None


def exit_status(status: JobStatus) -> int:
    """The exit status that mirrors the job's: 0 when it completed, its own exit
    status when it has one, else 1."""
    if status.job_state is JobState.COMPLETED:
        return 0
    code = (status.exit_code or "").partition(":")[0]
    return int(code) if code.isdigit() and int(code) != 0 else 1
