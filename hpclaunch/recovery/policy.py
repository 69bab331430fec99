"""What the batch-step supervisor does when the step ends: the pure policy
(``decide``), in the words the job's history stores (``hpclaunch.jobdir.history``).

The supervisor learns why the step ended from the first signal it received and,
for SIGTERM, from SLURM: a requeue by SLURM (``scontrol requeue``, preemption in
REQUEUE mode, a lost node) raises the job's ``Restarts`` count at once, while a
user's ``scancel`` does not.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from hpclaunch.contract.supervisor import DEFAULT_MAX_FAILURE_REQUEUES
from hpclaunch.errors import ExitCode
from hpclaunch.jobdir.errortext import same_error
from hpclaunch.jobdir.failures import Finding, Verdict

# The words of a decision are those the history stores; importers of the policy get them here.
from hpclaunch.jobdir.history import Action as Action
from hpclaunch.jobdir.history import Reason as Reason

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
    died: tuple[str, ...] = ()  # the nodes whose agent srun reports killed by a signal
    srun_killed: bool = False  # srun itself died by a signal the supervisor did not send
    # Every agent was stopped by ``first_signal``, sent to the job's steps only (scancel
    # --signal, submitit's _interrupt): the job is not ending, as after SLURM's own SIGTERM.
    steps_only: bool = False
    # The supervisor's watch ended the step (hpclaunch.recovery.watch): the agents of
    # these nodes had fallen silent; srun was stuck before every agent noted its end.
    silent: tuple[str, ...] = ()
    srun_stuck: bool = False


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: Reason
    exit_status: int
    exclude: tuple[str, ...] = ()  # nodes to keep out of the next run


# Step statuses that mean "stopped by a signal" (128 + N), as the agents and srun
# report a step that ended because of the warning or SLURM's SIGTERM.
STOPPED_STATUSES = frozenset(
    128 + int(sig) for sig in (*WARNING_SIGNALS, *STOP_SIGNALS, signal.SIGKILL)
)


# Verdicts of the failure records that end the job, and the reason recorded.
_ENDING = {
    Verdict.STORAGE: Reason.STORAGE,
    Verdict.HANG: Reason.HANG,
    Verdict.BUG: Reason.BUG,
    Verdict.EARLY_EXIT: Reason.EARLY_EXIT,
}
# Verdicts that a dead agent does not override: the survivors' records show an error
# no requeue helps (a hang is the echo of the dead agent's lost ranks, so it yields).
_NOT_NODES = (Verdict.STORAGE, Verdict.BUG, Verdict.EARLY_EXIT)


def decide(s: Situation) -> Decision:
    """The policy. A job ``hpclaunch cancel`` ended is never requeued; SLURM's own
    requeues are left to SLURM; a step stopped by the
    time-limit warning leads to one requeue by the supervisor while the budget lasts;
    cancellations end the job; a step that failed by itself is requeued without its
    bad nodes, or without the nodes whose agent a signal killed (srun killed: on the
    same nodes), while both budgets last, and ends the job when the failure records show
    a bug, a shared folder that cannot be written (no node is to blame, and a requeue
    would fail the same way), a hang (no node can be named yet), or say nothing."""
    if s.cancelled:
        return Decision(Action.NONE, Reason.CANCELLED, s.status)
    if s.slurm_restarts is not None and s.slurm_restarts > s.requeue_count:
        return Decision(Action.SLURM_REQUEUES, Reason.REQUEUED_BY_SLURM, 0)
    stopped = s.first_signal is not None and s.status in STOPPED_STATUSES
    if stopped and s.first_signal in WARNING_SIGNALS:
        if s.requeue_count >= s.max_requeues:
            return Decision(Action.GIVE_UP, Reason.OVER_BUDGET, GAVE_UP_STATUS)
        return Decision(Action.REQUEUE, Reason.TIME_LIMIT, 0)
    if stopped and s.steps_only:  # a preemption's stop, without SLURM's requeue
        if s.requeue_count >= s.max_requeues:
            return Decision(Action.GIVE_UP, Reason.OVER_BUDGET, GAVE_UP_STATUS)
        return Decision(Action.REQUEUE, Reason.STEPS_STOPPED, 0)
    if stopped:
        return Decision(Action.NONE, Reason.CANCELLED, s.status)
    recorded = s.finding is not None and s.finding.verdict is not Verdict.UNKNOWN
    # A failure record says more than a silence: an agent waiting at torch's exit
    # barrier for a peer that failed is silent only because that peer failed.
    if s.silent and not recorded:  # no record can say whether its workers finished
        return _node_fault(s, Reason.AGENT_SILENT, s.silent)
    if s.srun_stuck:  # the agents had not all ended: srun's kill ended them
        return _node_fault(s, Reason.SRUN_STUCK, ())
    if s.status == 0:
        return Decision(Action.NONE, Reason.COMPLETED, 0)
    verdict = s.finding.verdict if s.finding is not None else None
    if (s.died or s.srun_killed) and s.first_signal is None and verdict not in _NOT_NODES:
        return _node_fault(s, Reason.AGENT_DIED, s.died)
    if verdict in _ENDING:
        return Decision(Action.NONE, _ENDING[verdict], s.status)
    if (
        s.finding is not None
        and s.finding.verdict is Verdict.BAD_NODES
        and same_error(s.finding.message, s.earlier_errors)
    ):
        # The error followed its rank onto other nodes: the script, not the node.
        return Decision(Action.NONE, Reason.BUG, s.status)
    if s.finding is not None and s.finding.verdict is Verdict.BAD_NODES:
        return _node_fault(s, Reason.BAD_NODES, s.finding.nodes)
    return Decision(Action.NONE, Reason.FAILED, s.status)


def _node_fault(s: Situation, reason: Reason, nodes: tuple[str, ...]) -> Decision:
    """A requeue without ``nodes`` while both budgets last, else give up."""
    spent = s.failure_requeues >= s.max_failure_requeues or s.requeue_count >= s.max_requeues
    if spent:
        return Decision(Action.GIVE_UP, reason, GAVE_UP_STATUS, nodes)
    return Decision(Action.REQUEUE, reason, 0, nodes)


def gave_up() -> Decision:
    """The decision for a run that SLURM requeued past the budget (see over_budget)."""
    return Decision(Action.GIVE_UP, Reason.OVER_BUDGET, GAVE_UP_STATUS)


def over_budget(requeue_count: int, max_requeues: int) -> bool:
    """Whether a run that SLURM requeued (which the supervisor cannot refuse) is past
    the budget: the supervisor then gives up before starting the step."""
    return requeue_count > max_requeues
