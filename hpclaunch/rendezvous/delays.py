"""The one scaling of torch's rendezvous delays, for both hpclaunch backends (imports torch).

torch's dynamic rendezvous waits in two places, both through its module's ``_delay``:
a random jitter of up to 0.3 s before a node's first join, and a one-second sleep
each time a node polls the shared state while it waits for the others. Both spare
the store at scale and cost a small job most of its rendezvous time. hpclaunch scales
them with the job: full length from NODES_AT_FULL_DELAY nodes on, MIN_DELAY_FACTOR of
it for the smallest jobs (50 ms polls for 1 to 5 nodes).

Nothing of torch's is patched: ``PacedExecutor`` is torch's operation executor that
never hands the poll back to torch's sleep (it waits itself, then looks again), and
the jitter is taken by the handler's own ``next_rendezvous``
(``hpclaunch.rendezvous.ranked_c10d``). Written against torch 2.13's dynamic_rendezvous.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic

NODES_AT_FULL_DELAY = 100
MIN_DELAY_FACTOR = 0.05
# torch 2.13's waits, in seconds: the poll while waiting, the first join's jitter.
TORCH_POLL_S = 1.0
TORCH_JITTER_S = (0.0, 0.3)
# torch ignores a delay shorter than this (utils._delay).
SHORTEST_SLEEP_S = 0.01


def delay_factor(max_nodes: int) -> float:
    """How much of torch's rendezvous delays a job of ``max_nodes`` nodes waits."""
    return min(1.0, max(MIN_DELAY_FACTOR, max_nodes / NODES_AT_FULL_DELAY))


def _sleep(seconds: float) -> None:
    if seconds >= SHORTEST_SLEEP_S:
        time.sleep(seconds)


@dataclass(frozen=True)
class Pacing:
    """How one rendezvous handler waits: ``factor`` of torch's delays, and
    ``wait_for_change(timeout_s)`` instead of the poll's sleep where the backend can
    say when the state changed (etcd's watch; it returns at the change or the timeout)."""

    factor: float
    wait_for_change: Callable[[float], None] | None = None
    sleep: Callable[[float], None] = _sleep

    @classmethod
    def for_job(
        cls, max_nodes: int, wait_for_change: Callable[[float], None] | None = None
    ) -> Pacing:
        return cls(delay_factor(max_nodes), wait_for_change)

    def poll(self) -> None:
        """Wait before looking at the shared state again."""
        if self.wait_for_change is not None:
            self.wait_for_change(TORCH_POLL_S)
        else:
            self.sleep(TORCH_POLL_S * self.factor)

    def jitter(self) -> None:
        """The random wait before a node's first join, scaled."""
        low, high = TORCH_JITTER_S
        self.sleep(random.uniform(low * self.factor, high * self.factor))


class PacedExecutor(dynamic._DistributedRendezvousOpExecutor):
    """torch's operation executor, polling at ``pacing``'s pace.

    torch's loop sleeps a second whenever the operation answers SYNC (nothing to do
    but look again). Here the operation is wrapped so that it never answers SYNC to
    torch: the wrapper waits by ``pacing``, re-reads the state as torch's loop would,
    and asks the operation again, until it has something to do."""

    def __init__(self, node: Any, state_holder: Any, settings: Any, pacing: Pacing) -> None:
        super().__init__(node, state_holder, settings)
        self.pacing = pacing

    def run(
        self,
        state_handler: Callable[[Any, float], Any],
        deadline: float,
        update_deadline: Callable[[timedelta], float] | None = None,
    ) -> None:
        def paced(ctx: Any, deadline: float) -> Any:
            while True:
                action = state_handler(ctx, deadline)
                if action != dynamic._Action.SYNC:
                    return action
                self.pacing.poll()
                self._state_holder.sync()
                self._state = self._state_holder.state
                ctx = dynamic._RendezvousContext(self._node, self._state, self._settings)

        super().run(paced, deadline, update_deadline)
