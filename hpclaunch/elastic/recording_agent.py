"""torch's LocalElasticAgent, writing a failure record each time the worker group
fails, and stopping workers quickly when a peer node is lost (imports torch).

torch reports failures only when its agent gives up, and only the failures of the
last attempt; the supervisor needs every attempt's, on every node, to tell a bad
node from a bug (see hpclaunch.failures). torch's launcher builds its agent
itself, so ``install`` points the launcher at this subclass, in this process only.
Written against torch 2.13.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.launcher import api as launcher_api

log = logging.getLogger(__name__)

# Seconds between SIGTERM and SIGKILL when the workers are stopped because another
# node was lost: they are stuck in a collective with it and cannot checkpoint
# (torch waits 30 s). hpclaunch-etcd's handler says when that is the reason.
LOST_PEER_GRACE_S = 5


class RecordingAgent(LocalElasticAgent):
    """Calls ``on_failure(result)`` once for every failed attempt."""

    on_failure: Callable[[RunResult], None] | None = None

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result: RunResult = super()._monitor_workers(worker_group)
        callback = type(self).on_failure
        if result.is_failed() and callback is not None:
            try:
                callback(result)
            except Exception:  # a record is worth less than the job: log and go on
                log.exception("could not write the failure record")
        return result

    def run(self, role: str = "default") -> RunResult:
        # A node that stood by until the job ended leaves the rendezvous gracefully,
        # and torch 2.13's run() then returns None, which its launcher cannot take.
        result: RunResult | None = super().run(role)
        if result is None:
            return RunResult(state=WorkerState.SUCCEEDED)
        return result

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        take = getattr(worker_group.spec.rdzv_handler, "take_lost_peer", None)
        if take is not None and take():
            log.info("a node left the round: workers get %d s to exit", LOST_PEER_GRACE_S)
            self._shutdown(timeout=LOST_PEER_GRACE_S)
        else:
            super()._stop_workers(worker_group)


def install(on_failure: Callable[[RunResult], None]) -> None:
    """Make torch's launcher use RecordingAgent with ``on_failure`` in this process."""
    RecordingAgent.on_failure = on_failure
    setattr(launcher_api, "LocalElasticAgent", RecordingAgent)  # noqa: B010
