"""torch's LocalElasticAgent, writing a failure record each time the worker group
fails, and stopping workers quickly when a peer node is lost (imports torch).

torch reports failures only when its agent gives up, and only the failures of the
last attempt; the supervisor needs every attempt's, on every node, to tell a bad
node from a bug (see hpclaunch.jobdir.failures). torch's launcher builds its agent
itself, so ``install`` points the launcher at this subclass, in this process only.
Written against torch 2.13.
"""

from __future__ import annotations

import logging
import os
import select
import time
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
    """Calls ``on_failure(result)`` once for every failed attempt, and looks at the
    workers as soon as one exits rather than once per interval."""

    on_failure: Callable[[RunResult], None] | None = None
    # The longest wait between two looks at the workers (torch's monitor interval is
    # set near zero: its plain sleep is replaced by the wait for an exit).
    monitor_wait_s: float = 0.1

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        self._wait_for_exit(type(self).monitor_wait_s)
        result: RunResult = super()._monitor_workers(worker_group)
        callback = type(self).on_failure
        if result.is_failed() and callback is not None:
            try:
                callback(result)
            except Exception:  # a record is worth less than the job: log and go on
                log.exception("could not write the failure record")
        return result

    def _wait_for_exit(self, timeout: float) -> None:
        """Return when a worker exits, or after ``timeout`` s: through the zygote's
        reports for warm workers, else through a pidfd per worker."""
        context = self._pcontext
        warm_wait = getattr(context, "wait_for_exit", None)
        if warm_wait is not None:
            warm_wait(timeout)
            return
        watched = self.__dict__.setdefault("_pidfds", _Pidfds())
        pids = set(context.pids().values()) if context is not None else set()
        watched.follow(context, pids)
        watched.wait(timeout)

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


def install(on_failure: Callable[[RunResult], None], monitor_wait_s: float = 0.1) -> None:
    """Make torch's launcher use RecordingAgent with ``on_failure`` in this process."""
    RecordingAgent.on_failure = on_failure
    RecordingAgent.monitor_wait_s = monitor_wait_s
    setattr(launcher_api, "LocalElasticAgent", RecordingAgent)  # noqa: B010


class _Pidfds:
    """A pidfd for each worker of the current process context, to wait on their exits."""

    def __init__(self) -> None:
        self._context: object = None
        self._fds: dict[int, int] = {}  # pid -> pidfd, or -1 once it exited

    def follow(self, context: object, pids: set[int]) -> None:
        """Watch ``pids`` of ``context``; a new context (a restart) starts afresh, so a
        pid used again by a new worker is watched again."""
        if context is not self._context:
            self.close()
            self._context = context
        for pid in set(self._fds) - pids:
            self._close(pid)
        for pid in pids - set(self._fds):
            try:
                self._fds[pid] = os.pidfd_open(pid)
            except OSError:  # gone already, or no pidfds here: the look after sees it
                self._fds[pid] = -1

    def wait(self, timeout: float) -> None:
        waiting = {fd: pid for pid, fd in self._fds.items() if fd >= 0}
        if not waiting:
            time.sleep(timeout)
            return
        poller = select.poll()  # not select.select: the agent's fds may pass 1024
        for fd in waiting:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(timeout * 1000):
            os.close(fd)  # exited: not waited for again
            self._fds[waiting[fd]] = -1

    def close(self) -> None:
        for pid in list(self._fds):
            self._close(pid)

    def _close(self, pid: int) -> None:
        fd = self._fds.pop(pid)
        if fd >= 0:
            os.close(fd)
