"""A pidfd for each worker, so that the agent wakes as soon as one exits instead of
sleeping through its monitor interval. No torch."""

from __future__ import annotations

import os
import select
import time


class Pidfds:
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
