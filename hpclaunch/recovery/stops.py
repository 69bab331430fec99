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
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from hpclaunch.record.job_record import read_run

log = logging.getLogger(__name__)

WARNINGS = frozenset({signal.SIGUSR1, signal.SIGUSR2})
STOPS = frozenset({signal.SIGTERM, signal.SIGINT})


class Step(Protocol):
    """What the supervisor saw of the step (hpclaunch.recovery.step.StepResult)."""

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
