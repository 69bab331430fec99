"""Runs whose workers died of a stop signal they do not catch (the agents' end notes,
hpclaunch.jobdir.agent_ends): such a worker saved nothing on the time-limit warning, so
``hpclaunch status`` says so, next to the batch log's line. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from hpclaunch.record.job_record import RunRecord


def uncaught(run: RunRecord) -> dict[str, str]:
    """node -> the stop signal that killed its workers in ``run``."""
    return {end.node: end.uncaught for end in run.ends if end.uncaught is not None}


def notes(runs: Iterable[RunRecord]) -> list[str]:
    """A line for each run in which workers died of a stop signal they do not catch."""
    out = []
    for run in runs:
        found = uncaught(run)
        for sig in sorted(set(found.values())):
            nodes = ",".join(node for node, seen in found.items() if seen == sig)
            out.append(
                f"run {run.requeue}: the workers on {nodes} were killed by {sig}, which they "
                "do not catch, so they saved nothing on it; catch it "
                "(hpclaunch.checkpoint.Preemption, or for Lightning "
                "hpclaunch.frameworks.lightning.StopCheckpoint)"
            )
    return out
