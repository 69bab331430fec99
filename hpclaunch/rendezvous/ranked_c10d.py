"""``hpclaunch-c10d``: torch's c10d dynamic rendezvous with node ranks in SLURM's order.

torch's dynamic rendezvous numbers nodes by sorting their descriptors, whose
first field is the host name (so ``n10`` comes before ``n2``, and the node that
hosts the store need not be rank 0). This backend gives each node a descriptor
that sorts by the node rank hpclaunch derived from SLURM, and is otherwise
torch's own handler. Written against torch 2.13's dynamic_rendezvous module.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousParameters,
    RendezvousTimeoutError,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic
from torch.distributed.elastic.rendezvous import utils as rdzv_utils
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

from hpclaunch.jobdir.joblogs import ATTEMPT_VAR

log = logging.getLogger(__name__)

NAME = "hpclaunch-c10d"
SEPARATE_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# torch polls the rendezvous state once a second while it waits for the other nodes,
# and delays each node's first join by up to 0.3 s, to spare the store at scale.
# hpclaunch scales both with the job: full length from NODES_AT_FULL_DELAY nodes on,
# MIN_DELAY_FACTOR of it for the smallest jobs (50 ms polls for 1 to 5 nodes).
NODES_AT_FULL_DELAY = 100
MIN_DELAY_FACTOR = 0.05


@dataclass(frozen=True, eq=True)
class RankedNodeDesc(dynamic._NodeDesc):
    """A node descriptor that sorts by node rank first."""

    node_rank: int = 0

    def _key(self) -> tuple[int, str, int, int]:
        return (self.node_rank, self.addr, self.pid, self.local_id)

    def __lt__(self, other: Any) -> bool:
        return self._key() < _key_of(other)

    def __le__(self, other: Any) -> bool:
        return self._key() <= _key_of(other)

    def __gt__(self, other: Any) -> bool:
        return self._key() > _key_of(other)

    def __ge__(self, other: Any) -> bool:
        return self._key() >= _key_of(other)


class MultipleExecutor(dynamic._DistributedRendezvousOpExecutor):
    """torch's operation executor, completing a round only on a multiple of
    ``node_multiple`` nodes: the highest-ranked surplus go to the wait list."""

    node_multiple = 1

    def _mark_rendezvous_complete(self) -> None:
        state = self._state
        surplus = len(state.participants) % self.node_multiple
        if surplus:
            for node in sorted(state.participants)[-surplus:]:
                del state.participants[node]
                state.wait_list.add(node)
        super()._mark_rendezvous_complete()


class RankedHandler(dynamic.DynamicRendezvousHandler):
    """torch's handler, telling the workers the round they start in, and from the
    second round on giving them a store of their own.

    The round is the job-wide attempt: every node that takes part in a round starts
    its workers in it, whereas torch's restart count is per agent. It goes into the
    agent's environment (as HPCLAUNCH_ATTEMPT), which torch copies to the workers.

    torch 2.13 shares the agent's store with the workers by default. That is fast,
    but after a restart the new workers sometimes read the previous attempt's
    addresses from it (hangs, wasted restarts). The first round keeps the shared
    store (it saves the workers a store start and connection retries); every later
    round sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE, which torch reads per round, on
    every node alike.
    """

    _rounds_joined = 0
    _node_multiple = 1

    def keep_multiple(self, k: int) -> None:
        """Run on a multiple of ``k`` nodes only; the other nodes stand by."""
        self._node_multiple = k
        executor = MultipleExecutor(self._this_node, self._state_holder, self._settings)
        executor.node_multiple = k
        self._op_executor = executor

    def num_nodes_waiting(self) -> int:
        """Waiting nodes worth a new round: with ``node_multiple`` K, only those that
        make a larger multiple of K together with the running ones."""
        waiting: int = super().num_nodes_waiting()
        k = self._node_multiple
        running = len(self._state_holder.state.participants)
        if k > 1 and waiting and (running + waiting) // k * k <= running:
            return 0
        return waiting

    def _standing_by(self) -> bool:
        state = self._state_holder.state
        return (
            self._node_multiple > 1 and state.complete and self._this_node not in state.participants
        )

    def next_rendezvous(self) -> Any:
        """Join the next round; a node left out of a round by ``node_multiple`` waits
        for the one that takes it (torch would time it out), and ends well when the
        job does."""
        while True:
            try:
                return self._join_round()
            except RendezvousTimeoutError:
                if not self._standing_by():
                    raise
                log.info("standing by: the job runs on a multiple of %d nodes", self._node_multiple)
            except RendezvousClosedError:
                if not self._standing_by():
                    raise
                raise RendezvousGracefulExitError(
                    "the job ended while this node stood by"
                ) from None

    def _join_round(self) -> Any:
        if self._rounds_joined:
            os.environ[SEPARATE_STORE] = "1"
        self._rounds_joined += 1
        # torch serves the state from a one-second cache between reads, so a waiting
        # node sees the last join up to a second late, whatever its poll interval.
        # While joining, read it fresh each time; afterwards (heartbeats, the agent's
        # checks for waiting nodes) the cache, scaled with the job (scale_cache),
        # spares the store again.
        holder = self._state_holder
        cache = getattr(holder, "_cache_duration", None)
        if cache is not None:
            holder._cache_duration = 0  # type: ignore[attr-defined]
        try:
            info = super().next_rendezvous()
        finally:
            if cache is not None:
                holder._cache_duration = cache  # type: ignore[attr-defined]
        os.environ[ATTEMPT_VAR] = str(self._state_holder.state.round)
        return info


def _key_of(other: Any) -> tuple[int, str, int, int]:
    if not isinstance(other, RankedNodeDesc):
        raise TypeError(f"cannot order a RankedNodeDesc against {type(other).__name__}")
    return other._key()


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's c10d handler, with this node's descriptor ranked (config ``node_rank``)."""
    node_rank = params.get_as_int("node_rank")
    if node_rank is None:
        raise ValueError("the hpclaunch-c10d rendezvous needs the node_rank config")
    backend, store = create_backend(params)
    stock = dynamic.create_handler(store, backend, params)
    scale_delays(params.max_nodes)
    node = stock._this_node
    ranked = RankedNodeDesc(node.addr, node.pid, node.local_id, node_rank)
    handler = RankedHandler(ranked, stock._settings, NAME, store, stock._state_holder)
    scale_cache(stock._state_holder, params.max_nodes)
    keep_multiple_of(handler, params)
    return handler


def keep_multiple_of(handler: RankedHandler, params: RendezvousParameters) -> None:
    """Apply the ``node_multiple`` config, if given."""
    k = params.get_as_int("node_multiple", 1) or 1
    if k > 1:
        handler.keep_multiple(k)


def delay_factor(max_nodes: int) -> float:
    """How much of torch's rendezvous delays a job of ``max_nodes`` nodes waits."""
    return min(1.0, max(MIN_DELAY_FACTOR, max_nodes / NODES_AT_FULL_DELAY))


def scale_delays(max_nodes: int) -> None:
    """Scale dynamic_rendezvous's delays (see NODES_AT_FULL_DELAY) in this process.

    The agent process runs one rendezvous handler, this one. Written against torch
    2.13, where the module calls its ``_delay`` helper for both; if that changes,
    torch's own delays stay."""
    factor = delay_factor(max_nodes)
    original = rdzv_utils._delay
    current = getattr(dynamic, "_delay", None)
    if current is not original and not hasattr(current, "hpclaunch_factor"):
        return

    def scaled(seconds: float | tuple[float, float]) -> None:
        if isinstance(seconds, tuple):
            original((seconds[0] * factor, seconds[1] * factor))
        else:
            original(seconds * factor)

    scaled.hpclaunch_factor = factor  # type: ignore[attr-defined]
    setattr(dynamic, "_delay", scaled)  # noqa: B010 (not re-exported by torch)


def scale_cache(holder: Any, max_nodes: int) -> None:
    """Scale the state holder's cache like the delays. Between rounds the agent asks
    every 0.1 s whether a node waits for a new one (a node whose worker failed); from
    torch's one-second cache the other nodes would see it up to a second late, and each
    restart would wait for that."""
    cache = getattr(holder, "_cache_duration", None)
    if isinstance(cache, int | float):
        holder._cache_duration = cache * delay_factor(max_nodes)


def register() -> None:
    """Make ``hpclaunch-c10d`` known to torch's registry (idempotent)."""
    rendezvous_handler_registry.register(NAME, create_handler)
