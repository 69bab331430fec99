"""The supervisor's SLURM commands on its own job: requeue it, keep nodes out of its next
run, read its Restarts count. Each is tried again while SLURM's controller is away and the
run's window (``hpclaunch.slurm.retry.Patience``) is open: a controller restart, failover
or upgrade during the time-limit warning's lead does not cost the job its requeue."""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from hpclaunch.errors import SlurmError
from hpclaunch.slurm.commands import Slurm
from hpclaunch.slurm.retry import SlurmUnreachable, Window, describe, persist

log = logging.getLogger(__name__)

# sinfo's states of a node that is gone (with "not responding", a trailing '*').
LOST = frozenset({"down", "fail", "failing"})


def requeue_job(
    slurm: Slurm, job_id: int, excluded: Sequence[str], window: Window, requeue_count: int
) -> None:
    """``scontrol requeue``, then keep ``excluded`` out of the next run, each tried
    again while SLURM's controller is away and ``window`` is open. SLURM answers a
    requeue with SIGTERM to every process of the job, these scontrol calls included:
    they inherit an ignored SIGTERM and finish. (The exclusion can only be set once the
    job is pending again; the job is requeued even where it cannot be set.) A refusal
    after an attempt whose answer was lost is no failure when the job's Restarts count
    (``requeue_count`` in this run) went up. Raises SlurmError."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        try:
            persist(lambda s: s.requeue(job_id), slurm, window, who="supervisor: ")
        except SlurmUnreachable:
            raise
        except SlurmError:
            restarts = slurm_restarts(slurm, job_id, window)
            if restarts is None or restarts <= requeue_count:
                raise
            log.info("supervisor: the job was requeued after all (Restarts %d)", restarts)
        if excluded:
            try:
                persist(
                    lambda s: s.exclude_nodes(job_id, excluded), slurm, window, who="supervisor: "
                )
            except SlurmError as exc:
                log.error(
                    "supervisor: could not keep %s out of the next run: %s",
                    ",".join(excluded),
                    describe(exc),
                )
    finally:
        signal.signal(signal.SIGTERM, previous)


def keep_lost_out(
    slurm: Slurm, job_id: int, step_nodes: Sequence[str], excluded: Sequence[str], window: Window
) -> tuple[str, ...]:
    """After SLURM requeued the job, keep the step's nodes that are down or not
    responding (a lost node: SLURM's own reason for the requeue) out of the next run,
    as bad nodes are; tried again while SLURM's controller is away and ``window`` is
    open. Returns the nodes kept out; none when SLURM cannot be asked."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # SLURM's, for the requeue
    try:
        states = persist(lambda s: s.node_states(), slurm, window, who="supervisor: ")
        down = tuple(
            node
            for node in step_nodes
            if node in states and (not states[node].responding or states[node].state in LOST)
        )
        if down:
            nodes = list(dict.fromkeys([*excluded, *down]))
            persist(lambda s: s.exclude_nodes(job_id, nodes), slurm, window, who="supervisor: ")
            log.info("supervisor: keeping %s (lost) out of the next run", ",".join(down))
        return down
    except SlurmError as exc:
        log.warning("supervisor: could not keep lost nodes out of the next run: %s", describe(exc))
        return ()
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass(frozen=True)
class Standing:
    """What SLURM says of the job: its Restarts count (None when scontrol's is not a
    number) and its JobState ("" when not said)."""

    restarts: int | None
    state: str


def slurm_standing(slurm: Slurm, job_id: int, window: Window) -> Standing | None:
    """The job's Restarts and JobState from one scontrol call, asked again while
    SLURM's controller is away and ``window`` is open; None when it cannot be had."""
    try:
        fields = persist(lambda s: s.job_fields(job_id), slurm, window, who="supervisor: ")
    except SlurmError as exc:
        log.warning("supervisor: could not read the job's Restarts: %s", describe(exc))
        return None
    try:
        restarts: int | None = int(fields.get("Restarts", ""))
    except ValueError as exc:
        log.warning("supervisor: could not read the job's Restarts from scontrol: %s", exc)
        restarts = None
    return Standing(restarts, fields.get("JobState", ""))


def slurm_restarts(slurm: Slurm, job_id: int, window: Window) -> int | None:
    """The job's Restarts count (slurm_standing); None when it cannot be had."""
    standing = slurm_standing(slurm, job_id, window)
    return standing.restarts if standing is not None else None
