"""Waiting out an etcd outage: the requests of one connection retry, with backoff, while
etcd is unreachable, up to the job's outage timeout (``--etcd-outage-timeout``).

The rendezvous state is needed again only at the next membership change, so a
restart of etcd, a leader election or a short network cut need not end a job
whose training goes on meanwhile. Only unavailability is retried (refused or
reset connections, timeouts, etcd's 5xx answers and leader elections); a refusal
(authentication, permission, a bad request) is raised at once.

Pure: no torch, no HTTP; the clock and the sleep are parameters.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TypeVar

from hpclaunch.errors import EtcdError

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_OUTAGE_TIMEOUT_S = 120.0
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 2.0
# What etcd says while it has no leader, or is electing one (the gateway's 503/500 body).
_UNAVAILABLE_MARKERS = (
    "leader changed",
    "no leader",
    "request timed out",
    "too many requests",
    "server is stopping",
    "not capable",
)


class EtcdUnavailable(EtcdError):
    """etcd did not answer, or answered that it cannot serve now: worth a retry."""


def unavailable(detail: str) -> bool:
    """Whether etcd's error message says it is unavailable for now (not a refusal)."""
    low = detail.lower()
    return any(marker in low for marker in _UNAVAILABLE_MARKERS)


class Outage:
    """Shared by every request to one etcd endpoint (all threads): when etcd went
    away, logged once when it goes and once when it is back.

    ``call`` runs a request, retrying it on EtcdUnavailable with doubling delays
    until etcd has been unreachable for ``timeout_s`` (counted from the outage's
    first failed request, whichever thread made it); then it raises EtcdError
    saying so."""

    def __init__(
        self,
        endpoint: str,
        timeout_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._lock = threading.Lock()
        self._down_since: float | None = None
        # Wall-clock time (epoch seconds) etcd last came back after an outage, or None.
        self.recovered_at: float | None = None

    def call(self, request: Callable[[], T]) -> T:
        delay = FIRST_DELAY_S
        while True:
            try:
                result = request()
            except EtcdUnavailable as exc:
                down_for = self._failed(exc)
                left = self.timeout_s - down_for
                if left <= 0:
                    raise EtcdError(
                        f"etcd at {self.endpoint} was unreachable for {down_for:.0f} s, longer "
                        f"than --etcd-outage-timeout {self.timeout_s:g} ({self._detail(exc)}); "
                        "check etcd there, or give a longer --etcd-outage-timeout"
                    ) from None
                self._sleep(min(delay, left))
                delay = min(delay * 2, MAX_DELAY_S)
                continue
            self._answered()
            return result

    def _failed(self, exc: EtcdError) -> float:
        """Note a failed request; return for how long etcd has been unreachable."""
        now = self._clock()
        with self._lock:
            if self._down_since is None:
                self._down_since = now
                log.warning(
                    "etcd at %s is unreachable (%s); waiting up to %g s for it to come back "
                    "(--etcd-outage-timeout)",
                    self.endpoint,
                    self._detail(exc),
                    self.timeout_s,
                )
            return now - self._down_since

    def _detail(self, exc: EtcdError) -> str:
        """The error without the endpoint the line names already."""
        return str(exc).removeprefix(f"etcd at {self.endpoint}: ")

    def _answered(self) -> None:
        if self._down_since is None:  # the usual case: no lock taken
            return
        with self._lock:
            if self._down_since is None:
                return
            down_for = self._clock() - self._down_since
            self._down_since = None
            self.recovered_at = self._wall()
        log.warning("etcd at %s is back after %.1f s", self.endpoint, down_for)


def forgive_heartbeats(state: bytes, recovered_at: float) -> bytes:
    """torch's pickled rendezvous state (``_RendezvousState``) with every heartbeat older than
    ``recovered_at`` (epoch seconds: when etcd came back after an outage) moved up
    to it. No node could write a heartbeat while etcd was down; without this the
    first node to read the state after a long outage would declare every other
    node dead and end the round. A node that died in the outage still misses its
    heartbeats after it and is dropped as usual, from ``recovered_at`` on."""
    decoded = pickle.loads(state)
    since = datetime.fromtimestamp(recovered_at, timezone.utc)
    beats = decoded.last_heartbeats
    stale = [node for node, beat in beats.items() if beat < since]
    if not stale:
        return state
    for node in stale:
        beats[node] = since
    return pickle.dumps(decoded)


def history_restarted(revision: int, known: int) -> bool:
    """Whether etcd's store revision went back (``revision`` read now, below ``known``,
    the newest this node saw): etcd lost its data and counts from 1 again."""
    return revision < known


def rebuilt_line(state: bytes, *, wrote: bool) -> str:
    """The line an agent logs when etcd lost the rendezvous state (torch's pickled
    ``_RendezvousState``) and it was written back, by this node or another."""
    decoded = pickle.loads(state)
    who = "this node wrote back the state it held" if wrote else "another node wrote back its state"
    return (
        f"etcd lost the rendezvous state (its data wiped, or a new etcd at its address); "
        f"{who}: round {decoded.round}, {len(decoded.participants)} nodes; "
        "running workers go on"
    )
