"""The batch-step supervisor: runs the ``srun`` step, passes SLURM's signals on, and
requeues the job after a time-limit warning.

SLURM sends the time-limit warning (``--signal=B:USR1@LEAD``) to the batch
shell only, and preemption's SIGTERM to the batch shell and the tasks. The
rendered script ``exec``s this supervisor, so it *is* the batch shell: it
forwards each of these signals to the step (srun passes them to every task),
waits for the step to end (the workers checkpoint and exit), and then acts as
``hpclaunch.recovery.policy.decide`` says.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from hpclaunch.contract.supervisor import (
    DEFAULT_MAX_FAILURE_REQUEUES,
    DEFAULT_SLURM_PATIENCE_S,
    DEFAULT_SUPERVISOR_GRACE_S,
    DEFAULT_WATCH_TIMEOUT_S,
)
from hpclaunch.contract.worker_env import CHECKPOINT_DIR as CHECKPOINT_DIR_VAR
from hpclaunch.errors import ExitCode, HpclaunchError, SlurmError
from hpclaunch.jobdir import failures, hangs, history_store, modes, saves
from hpclaunch.jobdir.found_checkpoints import absolute, submit_dir
from hpclaunch.jobdir.history import History, HistoryError, Run, finish
from hpclaunch.jobdir.layout import JobFolder, batch_log
from hpclaunch.jobdir.unwritten import Unwritten
from hpclaunch.record import checkpoints, lost_work
from hpclaunch.record.attempts import of_job
from hpclaunch.record.job_record import JobRecord, read_run
from hpclaunch.recovery import policy as requeue
from hpclaunch.recovery import stepdeath, stops, verdicts, watch
from hpclaunch.recovery.deputy import deputy_status, stood_down
from hpclaunch.recovery.job_commands import (
    keep_lost_out,
    requeue_job,
    slurm_restarts,
    slurm_standing,
)
from hpclaunch.recovery.step import StepResult, forwarding, run_step
from hpclaunch.slurm.commands import Slurm
from hpclaunch.slurm.env import job_nodes
from hpclaunch.slurm.retry import Patience, describe

log = logging.getLogger(__name__)

# What a history that cannot be written means: nothing for the job itself.
UNRECORDED = (
    "the job goes on and ends as its step does (SLURM's state says how); `hpclaunch "
    "status` compares the history with SLURM's state"
)


def supervise(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    slurm: Slurm,
    job_dir: Path | None,
    max_requeues: int,
    grace_s: float = DEFAULT_SUPERVISOR_GRACE_S,
    max_failure_requeues: int = DEFAULT_MAX_FAILURE_REQUEUES,
    adopt_checkpoints: bool = False,
    slurm_patience_s: float = DEFAULT_SLURM_PATIENCE_S,
    checkpoint_patterns: Sequence[str] = (),
    watch_timeout_s: float = DEFAULT_WATCH_TIMEOUT_S,
) -> int:
    """The batch step: take the checkpoint folder, run the step, then requeue, give up
    or end as the policy says. SLURM's commands are tried again while its controller is
    away: after a signal for ``grace_s`` (the signal lead: until the time limit), else
    for ``slurm_patience_s``. ``checkpoint_patterns`` go into the history, relative
    ones from SLURM_SUBMIT_DIR. A stopped srun or a silent agent is acted on after
    ``watch_timeout_s`` (hpclaunch.recovery.watch). Returns the supervisor's exit status. Raises
    StepNotFound, HistoryError, HpclaunchError (HPCLAUNCH_SHARE_WITH_GROUP is neither
    yes nor no)."""
    if job_dir is not None and job_dir.is_dir():  # made by the script's mkdir -p
        modes.restrict(job_dir, modes.folder_mode(env))
        # SLURM made the batch log beside it with the job's umask, in a log folder
        # that may be the user's own and open to others.
        log_file = batch_log(job_dir.parent, env.get("SLURM_JOB_NAME", ""), env["SLURM_JOB_ID"])
        if log_file.is_file():
            modes.restrict(log_file, modes.file_mode(env))
    with forwarding() as forwarder:
        run = Supervisor(
            env,
            slurm,
            job_dir,
            max_requeues,
            max_failure_requeues,
            Patience(grace_s, slurm_patience_s),
            watch_timeout_s,
        )
        if run.history is not None:
            run.history.checkpoint_patterns = absolute(checkpoint_patterns, submit_dir(env))
        refused = run.claim_checkpoints(adopt_checkpoints)
        if refused is not None:
            return refused
        run.check_saves(signal_lead_s=grace_s)
        gave_up = run.before_step()
        if gave_up is not None:
            return gave_up
        watching = run.step_watch()
        try:
            result = run_step(
                argv, forwarder, grace_s, run.on_first_signal, run.noise_log(), watching
            )
            return run.after_step(result)
        finally:
            if watching is not None:
                watching.decided()


class Supervisor:
    """One run of the job in the batch step: before the step (the history, the budget),
    on the first signal (a requeue by SLURM is recorded at once), and after the step
    (the failure records, the policy's decision, and acting on it)."""

    def __init__(
        self,
        env: Mapping[str, str],
        slurm: Slurm,
        job_dir: Path | None,
        max_requeues: int,
        max_failure_requeues: int,
        patience: Patience | None = None,
        watch_timeout_s: float = DEFAULT_WATCH_TIMEOUT_S,
    ) -> None:
        self.env, self.slurm, self.job_dir = env, slurm, job_dir
        # How long SLURM's controller is waited for (a window from the first signal).
        self.patience = patience or Patience(DEFAULT_SUPERVISOR_GRACE_S, DEFAULT_SLURM_PATIENCE_S)
        self.max_requeues, self.max_failure_requeues = max_requeues, max_failure_requeues
        self.job_id = int(env["SLURM_JOB_ID"])
        self.requeue_count = int(env.get("SLURM_RESTART_COUNT") or 0)
        self.history: History | None = None
        if job_dir is not None:
            self.history = history_store.load_or_set_aside(job_dir, self.job_id, max_requeues)
        self.run = self.history.start(env, self.requeue_count) if self.history else None
        self.finding: failures.Finding | None = None
        self.verdict: str | None = None  # the message for a person, when no node is to blame
        self._lost: tuple[str, ...] | None = None  # kept out after SLURM's requeue, once
        self.died: str | None = None  # which agent (or srun) was killed by a signal
        self.stalled: str | None = None  # why the watch ended the step (hpclaunch.recovery.watch)
        self.watch_timeout_s = watch_timeout_s  # hpclaunch.recovery.watch
        # The history and notes are bookkeeping: a write that fails is said once, and
        # never decides how the job ends.
        self.unwritten = Unwritten(log, "supervisor: ")
        self._bad_history = False  # a history on disk that is not one was said

    def check_saves(self, signal_lead_s: float) -> None:
        """Note the signal lead in the history, and warn when the earlier runs' saves
        took longer than the workers get after the time-limit warning."""
        if self.history is None or self.job_dir is None:
            return
        self.history.signal_lead_s = signal_lead_s
        slowest = saves.slowest(saves.read(JobFolder(self.job_dir).saves))
        warning = checkpoints.lead_warning(slowest, signal_lead_s) if slowest else None
        if warning:
            log.warning("supervisor: %s", warning)

    def claim_checkpoints(self, adopt: bool) -> int | None:
        """Take HPCLAUNCH_CHECKPOINT_DIR for this job before any step: None when it is
        the job's now; else the exit status, with why logged and recorded."""
        from hpclaunch.checkpoint import claim

        folder = self.env.get(CHECKPOINT_DIR_VAR)
        try:
            said = folder and claim.take(
                Path(folder), claim.slurm_job(self.env), adopt=adopt, slurm=self.slurm
            )
        except HpclaunchError as exc:
            log.error("supervisor: %s", exc)
            reason = requeue.Reason.FOLDER_REFUSED
            refused = requeue.Decision(requeue.Action.NONE, reason, int(exc.exit_code))
            if self.history is not None and self.run is not None and self.job_dir is not None:
                # The folder is not this job's: `hpclaunch status` shows why, not its contents.
                finish(self.run, None, None, refused, str(exc), verdict=str(exc))
                self._save()
            return refused.exit_status
        if said:
            log.info("supervisor: %s", said)
        if folder and self.history is not None:
            self.history.checkpoint_dir = folder
        return None

    def noise_log(self) -> Path | None:
        """Where this run's known-harmless torch lines go (hpclaunch.recovery.noise);
        None without a job folder: they are then copied to the batch log as they are."""
        if self.job_dir is None:
            return None
        return JobFolder(self.job_dir).logs / f"requeue-{self.requeue_count}" / "torch-noise.log"

    def step_watch(self) -> watch.StepWatch | None:
        """The watch of srun and the agents, and the heartbeat the agents watch; None
        without a job folder (the agents' notes are there)."""
        if self.job_dir is None:
            return None
        return watch.StepWatch(
            self.job_dir,
            self.requeue_count,
            tuple(job_nodes(self.env)),
            self.watch_timeout_s,
            deciding_s=watch.deciding_s(
                self.watch_timeout_s, self.patience.signal_lead_s, self.patience.after_failure_s
            ),
        )

    def before_step(self) -> int | None:
        """The exit status when the requeue budget is already spent, else None (the
        history now records this run)."""
        if requeue.over_budget(self.requeue_count, self.max_requeues):
            decision = requeue.gave_up()
            log.error(
                "supervisor: the job was requeued %d times, more than --max-requeues %d; giving up",
                self.requeue_count,
                self.max_requeues,
            )
            self._record(None, None, decision)
            return decision.exit_status
        self._save()
        if self.history is not None and len(self.history.runs) > 1:
            before = self.history.runs[-2]
            if before.action != requeue.Action.REQUEUE.value:  # that run's supervisor did not
                self._say_lost_work(self.history.runs[:-1])  # live to say it, or SLURM requeued
        return None

    def on_first_signal(self, first_signal: int) -> None:
        """SLURM kills this process KillWait seconds after its SIGTERM, maybe before the
        step has ended: a requeue by SLURM is recorded at once."""
        self.patience.signalled()
        if self.job_dir and stood_down(self.job_dir, self.requeue_count):
            return  # this host was lost from the job: an agent has its run (and history)
        if first_signal not in requeue.STOP_SIGNALS:
            return
        standing = slurm_standing(self.slurm, self.job_id, self.patience.window())
        if standing is None:
            return
        if standing.restarts is not None and standing.restarts > self.requeue_count:
            self._record(None, first_signal, self._by_slurm())
        elif standing.restarts == self.requeue_count:
            # SLURM's SIGTERM without a requeue (scancel, a time limit without warning,
            # a preemption that cancels) ends the job, as after_step would decide; SLURM
            # kills this process KillWait seconds from now, which can be before srun has
            # returned (agents stuck in a save), so the end is recorded now. A supervisor
            # that lives to see the step end records what it then decides.
            log.info(
                "supervisor: %s without a requeue (SLURM's Restarts is still %d): recorded "
                "as cancelled now, since SLURM may kill this process before the step ends",
                signal.Signals(first_signal).name,
                standing.restarts,
            )
            decision = requeue.Decision(
                requeue.Action.NONE, requeue.Reason.CANCELLED, 128 + first_signal
            )
            self._record(None, first_signal, decision)

    def after_step(self, result: StepResult) -> int:
        """Decide what follows the step, act on it, record it; the exit status."""
        if self.job_dir and stood_down(self.job_dir, self.requeue_count):
            return deputy_status(self.job_dir, self.job_id, self.requeue_count, result.status)
        if self.history is not None and len(self.history.runs) > 1:
            # Where this run resumed is known now: what the run before it really lost.
            self._say_lost_work(self.history.runs[:-1], resumed=True)
        if result.stall is not None:
            result = self._stalled(result, result.stall)
        unseen = stops.unseen(self.job_dir, self.requeue_count, job_nodes(self.env), result)
        if unseen is not None:  # every agent was stopped by a signal sent to the steps only
            result = replace(result, signals=(unseen,))
        stopped = stops.not_completed(self.job_dir, self.requeue_count, job_nodes(self.env), result)
        if stopped is not None:  # srun said 0, but the signal stopped the training
            result = replace(result, status=stopped)
        if result.signals:
            self.patience.signalled()
        restarts = (
            slurm_restarts(self.slurm, self.job_id, self.patience.window())
            if result.signals
            else None
        )
        if result.status != 0 and not result.signals and self.job_dir is not None:
            self._examine(self.job_dir)
        self._note_deaths(result)
        history = self.history
        decision = requeue.decide(
            requeue.Situation(
                result.status,
                result.first_signal,
                self.requeue_count,
                restarts,
                self.max_requeues,
                self.finding,
                history.failure_requeues if history else 0,
                self.max_failure_requeues,
                history.exclusion_errors if history else (),
                self.job_dir is not None and JobFolder(self.job_dir).cancelled.exists(),
                tuple(d.node for d in result.died),
                result.srun_signal is not None,
                unseen is not None,
                result.stall.nodes if result.stall and not result.stall.finished else (),
                result.stall is not None
                and result.stall.kind is watch.StallKind.SRUN
                and not result.stall.finished,
            )
        )
        if self.verdict is not None and verdicts.stands(self.finding, decision.reason):
            log.error("supervisor: %s", self.verdict)
        if self.job_dir and stood_down(self.job_dir, self.requeue_count):
            # An agent's deputy took the run while this supervisor decided (it took
            # longer than the bound its beat named): one of them acts, not both.
            return deputy_status(self.job_dir, self.job_id, self.requeue_count, result.status)
        decision = self._act(decision)
        self._record(result.status, result.first_signal, decision)
        return decision.exit_status

    def _stalled(self, result: StepResult, stall: watch.Stall) -> StepResult:
        """The step as the watch ended it: srun's SIGKILL is the supervisor's own doing;
        when every agent had noted its end, the step ended as they say."""
        if stall.kind is watch.StallKind.AGENT and stall.others:
            try:
                found = watch.finished_without_lost(stall, self.slurm.node_states())
            except SlurmError as exc:
                log.warning("supervisor: could not ask SLURM whether a node is lost: %s", exc)
                found = None
            if found is not None:
                log.info("supervisor: %s", found.message)
                stall = found
        self.stalled = stall.message
        if stall.statuses is not None:
            failed = [status for status in stall.statuses.values() if status != 0]
            log.info(
                "supervisor: the agents noted their ends (%s): the step ends as they say",
                ", ".join(f"{node} {status}" for node, status in sorted(stall.statuses.items())),
            )
            return replace(result, status=failed[0] if failed else 0, died=(), srun_signal=None)
        return replace(result, died=(), srun_signal=None)

    def _note_deaths(self, result: StepResult) -> None:
        """Say which agent (or srun) a signal killed, where the supervisor sent none."""
        if not result.signals and (result.died or result.srun_signal is not None):
            self.died = stepdeath.describe(result.died, result.srun_signal)
            log.error("supervisor: %s", self.died)

    def _examine(self, job_dir: Path) -> None:
        """Read the failure records (and test the shared folders) of a step that failed
        by itself: print the root cause, and the verdict where no node is to blame."""
        run = read_run(job_dir, self.requeue_count)
        records = list(run.failures)
        shared = verdicts.shared(self.env, job_dir)
        self.finding = verdicts.examine(records, job_nodes(self.env), shared)
        self.finding = verdicts.hang_or_lost(self.finding, self.slurm, job_nodes(self.env))
        if self.finding.verdict is not failures.Verdict.HANG:  # a waiter's block misleads
            block = run.block(failures.culprit(records, self.finding))
            if block is not None:
                sys.stderr.write(block)
                sys.stderr.flush()
        found = [self.finding.verdict.value, *self.finding.nodes]
        log.info("supervisor: failure records: %s", " ".join(found))
        for hung in hangs.first_hung(run.hangs):
            log.error("supervisor: hang in %s", hangs.describe(hung))
        self.verdict = verdicts.explain(self.finding, self.job_id, job_dir, job_nodes(self.env))

    def _act(self, decision: requeue.Decision) -> requeue.Decision:
        """Carry ``decision`` out; the decision as it ended (a refused requeue fails)."""
        if decision.action is requeue.Action.REQUEUE:
            decision = self._unless_moved_on(decision)
        if decision.action is requeue.Action.REQUEUE and self.history is not None:
            self._say_lost_work(self.history.runs)
        if decision.action is requeue.Action.REQUEUE:
            log.info(
                "supervisor: %s: requeueing the job (requeue %d of at most %d)%s",
                decision.reason.value,
                self.requeue_count + 1,
                self.max_requeues,
                f" without {','.join(decision.exclude)}" if decision.exclude else "",
            )
            before = self.history.excluded_nodes if self.history else []
            excluded = list(dict.fromkeys([*before, *decision.exclude]))
            try:
                requeue_job(
                    self.slurm, self.job_id, excluded, self.patience.window(), self.requeue_count
                )
            except SlurmError as exc:
                log.error("supervisor: the job ends without a requeue: %s", describe(exc))
                return requeue.Decision(
                    requeue.Action.REQUEUE_FAILED, decision.reason, int(ExitCode.SLURM)
                )
        elif decision.action is requeue.Action.GIVE_UP:
            log.error(
                "supervisor: %s, but the job has been requeued %d times "
                "(--max-requeues %d); giving up",
                decision.reason.value,
                self.requeue_count,
                self.max_requeues,
            )
        elif decision.action is requeue.Action.SLURM_REQUEUES:
            decision = self._by_slurm()
            log.info(
                "supervisor: SLURM is requeueing the job (preemption, scontrol requeue or "
                "a lost node); the next run resumes from the latest checkpoint"
            )
        else:  # "job completed", or why it ends: "the job ends: shared folder not writable"
            what = decision.reason.value
            log.info(
                "supervisor: %s",
                "job completed" if what == "completed" else f"the job ends: {what}",
            )
        return decision

    def _say_lost_work(self, runs: Sequence[Run], *, resumed: bool = False) -> None:
        """What the run after the last of ``runs`` repeats, from the job record
        (hpclaunch.record.lost_work): what its last checkpoint holds, or that it is not
        known yet; with ``resumed`` (this run has ended), what this run showed of where it
        resumed, once it is known."""
        if self.job_dir is None or self.history is None or not runs:
            return
        try:
            record = JobRecord.read(self.job_dir, self.job_id)
        except (OSError, HpclaunchError) as exc:  # a view of the work, worth less than the end
            log.debug("supervisor: cannot tell the lost work: %s", exc)
            return
        last = runs[-1]
        after = [self.run.requeue_count] if resumed and self.run is not None else []
        attempts, saved = of_job(record), checkpoints.known(record)
        told = [(last.requeue_count, last.ended, after)]
        for loss in lost_work.of_runs(told, attempts, saved, False):
            if resumed and (not loss.final or loss.steps is None):
                # This run showed nothing more than the line at its start said (and a run
                # whose own count is unknown was said the same way then).
                continue
            log.warning("supervisor: lost work: %s", loss.text)
        done = max((a.last_step or 0 for a in attempts.get(last.requeue_count, [])), default=0)
        warning = lost_work.never_saved(saved, attempts, done)
        if warning and not resumed and len(runs) == 1:
            log.warning("supervisor: warning: %s", warning)

    def _by_slurm(self) -> requeue.Decision:
        if self._lost is None:
            before = self.history.excluded_nodes if self.history else []
            self._lost = keep_lost_out(
                self.slurm, self.job_id, job_nodes(self.env), before, self.patience.window()
            )
        return requeue.Decision(
            requeue.Action.SLURM_REQUEUES, requeue.Reason.REQUEUED_BY_SLURM, 0, self._lost
        )

    def _record(self, status: int | None, first_signal: int | None, d: requeue.Decision) -> None:
        if self.history is None or self.run is None or self.job_dir is None:
            return
        error = self.finding.message if self.finding is not None and self.finding.message else None
        if d.action is requeue.Action.SLURM_REQUEUES and d.exclude:
            error = f"node lost ({', '.join(d.exclude)} down or not responding)"
        if d.reason is requeue.Reason.AGENT_DIED:
            error = self.died
        if d.reason in (requeue.Reason.AGENT_SILENT, requeue.Reason.SRUN_STUCK):
            error = self.stalled
        verdict = self.verdict if d.reason in verdicts.REASONS else None
        finish(self.run, status, first_signal, d, error, verdict)
        self._save()

    def _save(self) -> None:
        """Write this run's entry, unless a newer run has started (history_store). A
        history that cannot be written is said once and changes nothing else."""
        if self.history is None or self.run is None or self.job_dir is None:
            return
        try:
            history_store.save_run(self.job_dir, self.history, self.run)
        except OSError as exc:
            history = JobFolder(self.job_dir).history
            self.unwritten.say("the job's history", history, exc, UNRECORDED)
        except HistoryError as exc:
            if not self._bad_history:
                log.error("supervisor: %s; %s", exc, UNRECORDED)
            self._bad_history = True

    def _unless_moved_on(self, decision: requeue.Decision) -> requeue.Decision:
        """``decision`` (a requeue), or none when the job has moved on without this run: a
        newer run is in the history, or SLURM requeued it since (Restarts, asked here
        unless the signal's decision already did)."""
        try:
            newer = (
                history_store.moved_on(self.job_dir, self.run)
                if self.job_dir and self.run
                else None
            )
        except (OSError, HistoryError) as exc:  # SLURM's Restarts still tells
            log.warning("supervisor: cannot read the history for a newer run: %s", exc)
            newer = None
        asked = decision.reason is requeue.Reason.TIME_LIMIT  # after_step read Restarts
        window = self.patience.window()
        restarts = None if newer or asked else slurm_restarts(self.slurm, self.job_id, window)
        if newer is None and (restarts is None or restarts <= self.requeue_count):
            return decision
        log.warning(
            "supervisor: the job has moved on (run %s has started); this run's "
            "supervisor outlived it, so it does not requeue the job",
            newer["requeue_count"] if newer else restarts,
        )
        return requeue.Decision(requeue.Action.NONE, requeue.Reason.LOST, 0)
