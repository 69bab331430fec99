"""Stops the supervisor did not see: a signal sent to the job's steps only.

``scancel --signal SIG JOBID`` (without ``--batch`` or ``--full``) signals every process
of the job's steps but not the batch script, so the supervisor gets nothing: submitit's
``job._interrupt()``, the documented way to try a job's checkpointing, sends SIGTERM and
then SIGUSR2 that way. Every agent that such a signal stops ends with 128 + its number
and notes that in the job folder (``agents/requeue-Q/node-HOST.json``, see
``hpclaunch.jobdir.agent_ends``). When the notes of every node of the step say
so, the supervisor takes the step as stopped by that signal: a warning signal (SIGUSR1,
SIGUSR2) as the time-limit warning, SIGTERM or SIGINT as a preemption. No torch.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from hpclaunch.record.job_record import read_run

log = logging.getLogger(__name__)

WARNINGS = frozenset({signal.SIGUSR1, signal.SIGUSR2})
STOPS = frozenset({signal.SIGTERM, signal.SIGINT})


class Step(Protocol):
    """What the supervisor saw of the step (hpclaunch.recovery.step.StepResult)."""

    @property
    def status(self) -> int: ...
    @property
    def signals(self) -> tuple[int, ...]: ...
    @property
    def died(self) -> tuple[object, ...]: ...
    @property
    def srun_signal(self) -> int | None: ...


def stopped_by(statuses: Sequence[int]) -> signal.Signals | None:
    """The signal that stopped every agent, from their exit statuses: a warning signal
    when any agent was stopped by one (it asks for a checkpoint), else the stop signal;
    None when any agent ended otherwise, or there are none. Pure."""
    found = set()
    for status in statuses:
        try:
            sig = signal.Signals(status - 128)
        except ValueError:
            return None
        if sig not in WARNINGS | STOPS:
            return None
        found.add(sig)
    if not found:
        return None
    return min(found & WARNINGS or found)


def unseen(job_dir: Path | None, requeue: int, nodes: Sequence[str], step: Step) -> int | None:
    """The signal that stopped every agent of a step the supervisor saw end quietly (no
    signal of its own, no agent killed), from the agents' notes; None otherwise."""
    if job_dir is None or not nodes or step.signals or step.died or step.srun_signal:
        return None
    notes = read_run(job_dir, requeue).ended(tuple(nodes))
    sig = stopped_by(list(notes.values())) if len(notes) == len(nodes) else None
    if sig is not None:
        taken = "the time-limit warning" if sig in WARNINGS else "a preemption"
        log.warning(
            "supervisor: every agent was stopped by %s, sent to the job's steps only "
            "(scancel --signal, submitit's _interrupt()); taken as %s",
            sig.name,
            taken,
        )
    return None if sig is None else int(sig)


def stopped_status(
    first_signal: int | None, status: int, ended: Mapping[str, int], nodes: Sequence[str]
) -> int | None:
    """The status to take for a step that ended with 0 after the supervisor got a
    signal and passed it on (scancel, the time-limit warning, a preemption): 128 + that
    signal, unless every node's agent noted 0 in ``ended`` (node -> its exit status),
    which only a training that finished does. None when the step's status stands. Pure.

    srun's 0 proves nothing then: once the step's tasks got SLURM's SIGTERM, srun waits
    KillWait seconds for them and, past that, says "Timed out waiting for job step to
    complete" and exits 0 (SLURM 22.05), while the agents were stopped mid-training."""
    if first_signal is None or status != 0 or first_signal not in WARNINGS | STOPS:
        return None
    if nodes and all(ended.get(node) == 0 for node in nodes):
        return None
    return 128 + first_signal


def not_completed(
    job_dir: Path | None, requeue: int, nodes: Sequence[str], step: Step
) -> int | None:
    """``stopped_status`` from the agents' notes of run ``requeue``, said in the log."""
    first = step.signals[0] if step.signals else None
    if first is None or step.status != 0:
        return None
    ended = read_run(job_dir, requeue).ended(tuple(nodes)) if job_dir is not None else {}
    taken = stopped_status(first, step.status, ended, nodes)
    if taken is not None:
        log.warning(
            "supervisor: the step ended with status 0 after %s, but the agents' end notes "
            "do not say that every agent finished its training (%s): the step is taken as "
            "stopped by %s, not completed",
            signal.Signals(first).name,
            _noted(ended, nodes),
            signal.Signals(first).name,
        )
    return taken


def _noted(ended: Mapping[str, int], nodes: Sequence[str]) -> str:
    """What the end notes say, and which are missing: a missing note is not known to
    mean a stopped agent (SLURM may have killed it first, or the job folder refused the
    note: full or read-only), hence only 'taken as stopped'. Pure."""
    noted = "; ".join(f"{node} {ended[node]}" for node in nodes if node in ended)
    missing = [node for node in nodes if node not in ended]
    why = "never written, or the job folder could not take it"
    if not noted:
        return f"no agent's end note was found: {why}"
    if not missing:
        return f"exit statuses noted: {noted}"
    return f"exit statuses noted: {noted}; none from {', '.join(missing)}: {why}"
