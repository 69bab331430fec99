"""Pending jobs that can never start.

SLURM keeps such a job PENDING for ever, with a reason (``PartitionNodeLimit`` for
``--nodes 8`` on a 4-node partition), unless the partition's limits are set with
``EnforcePartLimits`` (then sbatch refuses it at once). Which reasons are final:

- never: the job asks for more than its partition has or allows
  (``PartitionNodeLimit`` beyond the partition's node count or MaxNodes/MinNodes,
  ``PartitionTimeLimit``), a dependency that can no longer hold
  (``DependencyNeverSatisfied``), features no node has (``BadConstraints``), an
  account or QOS that is not valid, or a per-job limit of its QOS or association;
  only an administrator's change of the limits would let it start.
- maybe later, hence not reported here: ``Resources``, ``Priority``, ``Dependency``,
  ``ReqNodeNotAvail`` and a ``PartitionNodeLimit`` within the partition's size (its
  nodes are down or drained: they may come back), ``PartitionDown``/``Inactive``,
  held jobs, and group limits (``QOSGrp...``), which free up as other jobs end.

``explain`` is pure (the fields of ``scontrol show job`` and ``show partition``);
``never_starts`` asks SLURM for them.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpclaunch.errors import ExitCode, HpclaunchError, SlurmError
from hpclaunch.slurm.commands import Slurm

_PER_JOB_LIMITS = (
    "QOSMaxNodePerJobLimit",
    "QOSMaxWallDurationPerJobLimit",
    "QOSMaxCpuPerJobLimit",
    "QOSMaxGRESPerJob",
    "AssocMaxNodesPerJobLimit",
    "AssocMaxWallDurationPerJobLimit",
    "AssocMaxCpuPerJobLimit",
)
# The reasons that may be final, and whether SLURM's partition record is needed to tell.
NEVER_REASONS = (
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "DependencyNeverSatisfied",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    *_PER_JOB_LIMITS,
)


class NeverStarts(HpclaunchError):
    """A pending job that can never start; the message says why and what to do."""

    exit_code = ExitCode.FAILURE


def _count(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _node_limit(job: Mapping[str, str], part: Mapping[str, str]) -> str | None:
    low, _, high = job.get("NumNodes", "").partition("-")
    wanted, most = _count(low), _count(high or low)
    name = job.get("Partition", "?")
    total, maximum = _count(part.get("TotalNodes")), _count(part.get("MaxNodes"))
    minimum = _count(part.get("MinNodes"))
    if wanted is None:
        return None
    if total is not None and wanted > total:
        return f"it asks for {wanted} nodes and partition {name} has {total} (TotalNodes)"
    if maximum is not None and wanted > maximum:
        return (
            f"it asks for {wanted} nodes and partition {name} allows {maximum} per job (MaxNodes)"
        )
    if minimum and most is not None and most < minimum:
        return f"it asks for {most} nodes and partition {name} needs {minimum} per job (MinNodes)"
    return None  # within the limits: some of the partition's nodes are down or drained


def explain(reason: str | None, job: Mapping[str, str], part: Mapping[str, str]) -> str | None:
    """Why a job pending for ``reason`` can never start, with the limit and the fix;
    None when it may start later. ``job`` and ``part``: ``scontrol show job`` and
    ``show partition`` as KEY=VALUE pairs (``part`` may be empty)."""
    name = job.get("Partition", "?")
    if reason == "PartitionNodeLimit":
        why = _node_limit(job, part)
        return f"{why}; submit again with --nodes within it" if why else None
    if reason == "PartitionTimeLimit":
        limit = part.get("MaxTime", "?")
        return (
            f"its time limit {job.get('TimeLimit', '?')} is over partition {name}'s "
            f"{limit} (MaxTime); submit again with --time {limit} or less"
        )
    if reason == "DependencyNeverSatisfied":
        return (
            f"its dependency {job.get('Dependency', '?')} can never hold (a job it waits "
            "for ended the wrong way)"
        )
    if reason == "BadConstraints":
        return (
            f"no node of partition {name} has the features it asks for "
            f"({job.get('Features', '?')}); check --constraint"
        )
    if reason in ("InvalidAccount", "InvalidQOS"):
        what = "account" if reason == "InvalidAccount" else "QOS"
        value = job.get("Account" if what == "account" else "QOS", "?")
        return f"its {what} {value} is not valid here (sacctmgr show assoc lists yours)"
    if reason in _PER_JOB_LIMITS:
        return f"it is over a per-job limit of its QOS or association ({reason})"
    return None


def never_starts(job_id: int, reason: str | None, slurm: Slurm) -> str | None:
    """``explain`` for a job SLURM keeps pending for ``reason``, with the fields asked of
    SLURM; None when it may start later or SLURM cannot be asked. Raises nothing."""
    if reason not in NEVER_REASONS:
        return None
    try:
        job = slurm.job_fields(job_id)
        part = {}
        if reason in ("PartitionNodeLimit", "PartitionTimeLimit") and "Partition" in job:
            if "," in job["Partition"]:
                return None  # several partitions: one of those not checked may take it
            part = slurm.partition_fields(job["Partition"])
    except SlurmError:
        return None
    return explain(reason, job, part)


def error(job_id: int, why: str) -> NeverStarts:
    """The error a follower stops with."""
    return NeverStarts(
        f"job {job_id} can never start: {why}. It stays PENDING until cancelled: "
        f"`hpclaunch cancel {job_id}`"
    )
