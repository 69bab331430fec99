"""torch's LocalElasticAgent, writing a failure record each time the worker group
fails (imports torch).

torch reports failures only when its agent gives up, and only the failures of the
last attempt; the supervisor needs every attempt's, on every node, to tell a bad
node from a bug (see hpclaunch.failures). torch's launcher builds its agent
itself, so ``install`` points the launcher at this subclass, in this process only.
Written against torch 2.13.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.launcher import api as launcher_api

log = logging.getLogger(__name__)


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


def install(on_failure: Callable[[RunResult], None]) -> None:
    """Make torch's launcher use RecordingAgent with ``on_failure`` in this process."""
    RecordingAgent.on_failure = on_failure
    setattr(launcher_api, "LocalElasticAgent", RecordingAgent)  # noqa: B010
