"""``hpclaunch-c10d``: torch's c10d dynamic rendezvous with node ranks in SLURM's order.

torch's dynamic rendezvous numbers nodes by sorting their descriptors, whose
first field is the host name (so ``n10`` comes before ``n2``, and the node that
hosts the store need not be rank 0). This backend gives each node a descriptor
that sorts by the node rank hpclaunch derived from SLURM, and is otherwise
torch's own handler, paced by ``hpclaunch.rendezvous.delays``. Written against torch
2.13's dynamic_rendezvous module, whose ``next_rendezvous`` it owns (see _join).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.events.api import NodeState
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousParameters,
    RendezvousTimeoutError,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic
from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

from hpclaunch.rendezvous import delays
from hpclaunch.rendezvous.delays import PacedExecutor, Pacing

log = logging.getLogger(__name__)

NAME = "hpclaunch-c10d"
# What tells torch (and the workers) that the workers get a store of their own.
SEPARATE_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


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


class RankedExecutor(PacedExecutor):
    """The paced executor, completing a round only on a multiple of ``node_multiple``
    nodes: the highest-ranked surplus go to the wait list."""

    def __init__(
        self, node: Any, state_holder: Any, settings: Any, pacing: Pacing, node_multiple: int
    ) -> None:
        super().__init__(node, state_holder, settings, pacing)
        self.node_multiple = node_multiple

    def _mark_rendezvous_complete(self) -> None:
        state = self._state
        surplus = len(state.participants) % self.node_multiple
        if surplus:
            for node in sorted(state.participants)[-surplus:]:
                del state.participants[node]
                state.wait_list.add(node)
        super()._mark_rendezvous_complete()


class RankedHandler(dynamic.DynamicRendezvousHandler):
    """torch's handler, paced with the job, saying which round it joined (``attempt``),
    and from the second round on giving the workers a store of their own.

    The round is the job-wide attempt: every node that takes part in a round starts
    its workers in it, whereas torch's restart count is per agent. The agent reads it
    from its handler and tells the workers (HPCLAUNCH_ATTEMPT).

    torch 2.13 shares the agent's store with the workers by default. That is fast,
    but after a restart the new workers sometimes read the previous attempt's
    addresses from it (hangs, wasted restarts). The first round keeps the shared
    store (it saves the workers a store start and connection retries); every later
    round gives them their own (``use_agent_store`` False), on every node alike, as
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 would.
    """

    def __init__(
        self,
        node: Any,
        settings: Any,
        backend_name: str,
        store: Any,
        state_holder: Any,
        pacing: Pacing,
        node_multiple: int = 1,
    ) -> None:
        super().__init__(node, settings, backend_name, store, state_holder)
        self._pacing = pacing
        self._node_multiple = node_multiple
        self._op_executor = RankedExecutor(node, state_holder, settings, pacing, node_multiple)
        self._rounds_joined = 0
        self._attempt: int | None = None

    @property
    def attempt(self) -> int | None:
        """The round this node last joined (the job-wide attempt); None before the first."""
        return self._attempt

    @property
    def use_agent_store(self) -> bool:
        # torch's answer reads the user's TORCH_DISABLE_SHARE_RDZV_TCP_STORE.
        return self._rounds_joined <= 1 and bool(super().use_agent_store)

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
            info = self._join()
        finally:
            if cache is not None:
                holder._cache_duration = cache  # type: ignore[attr-defined]
        self._attempt = self._state_holder.state.round
        return info

    def _join(self) -> RendezvousInfo:
        """torch 2.13's DynamicRendezvousHandler.next_rendezvous, owned: its first-join
        jitter is paced, and the store is shared by ``use_agent_store`` (torch reads
        the agent's environment for that)."""
        message = (
            f"The node '{self._this_node}' attempts to join the next round of the rendezvous "
            f"'{self._settings.run_id}'."
        )
        self._record(message=message)
        log.info(message)
        try:
            self._stop_heartbeats()
            if self._state_holder.state.round == 0:
                self._pacing.jitter()  # skews the nodes' first joins, sparing the store
            deadline = self._get_deadline(self._settings.timeout.join)
            self._op_executor.run(dynamic._RendezvousExitOp(), deadline)
            self._op_executor.run(dynamic._RendezvousJoinOp(), deadline, self._get_deadline)
            self._start_heartbeats()
            rank, world_size = self._get_world()
            store = self._get_store()
        except Exception as e:
            self._record(message=f"{type(e).__name__}: {e}", node_state=NodeState.FAILED)
            raise
        message = (
            f"The node '{self._this_node}' has joined round {self._state_holder.state.round} "
            f"of the rendezvous '{self._settings.run_id}' as rank {rank} in a world of size "
            f"{world_size}."
        )
        self._record(message=message, rank=rank)
        log.info(message)
        addr = self._this_node.addr
        if not self.use_agent_store:
            return RendezvousInfo(
                store, rank, world_size, RendezvousStoreInfo.build(rank, store, local_addr=addr)
            )
        # The workers share the agents' store: rank 0 serves it from a server of its
        # own, made once (or when this node became rank 0 since).
        if self._bootstrap_store_info is None or (
            rank == 0 and self._shared_tcp_store_server is None
        ):
            port = 0
            if rank == 0:
                self._shared_tcp_store_server = self._create_tcp_store_server(addr, 0)
                port = self._shared_tcp_store_server.port
            self._bootstrap_store_info = RendezvousStoreInfo.build(
                rank, store, local_addr=addr, server_port=port
            )
        return RendezvousInfo(store, rank, world_size, self._bootstrap_store_info)


def _key_of(other: Any) -> tuple[int, str, int, int]:
    if not isinstance(other, RankedNodeDesc):
        raise TypeError(f"cannot order a RankedNodeDesc against {type(other).__name__}")
    return other._key()


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's c10d handler, with this node's descriptor ranked (config ``node_rank``)
    and its delays scaled with the job. Raises ValueError without ``node_rank``."""
    node_rank = params.get_as_int("node_rank")
    if node_rank is None:
        raise ValueError("the hpclaunch-c10d rendezvous needs the node_rank config")
    backend, store = create_backend(params)
    stock = dynamic.create_handler(store, backend, params)
    node = stock._this_node
    ranked = RankedNodeDesc(node.addr, node.pid, node.local_id, node_rank)
    handler = RankedHandler(
        ranked,
        stock._settings,
        NAME,
        store,
        stock._state_holder,
        Pacing.for_job(params.max_nodes),
        node_multiple(params),
    )
    scale_cache(stock._state_holder, params.max_nodes)
    return handler


def node_multiple(params: RendezvousParameters) -> int:
    """The ``node_multiple`` config (1 when not given)."""
    return params.get_as_int("node_multiple", 1) or 1


def scale_cache(holder: Any, max_nodes: int) -> None:
    """Scale the state holder's cache like the delays. Between rounds the agent asks
    every 0.1 s whether a node waits for a new one (a node whose worker failed); from
    torch's one-second cache the other nodes would see it up to a second late, and each
    restart would wait for that."""
    cache = getattr(holder, "_cache_duration", None)
    if isinstance(cache, int | float):
        holder._cache_duration = cache * delays.delay_factor(max_nodes)


def register() -> None:
    """Make ``hpclaunch-c10d`` known to torch's registry (idempotent)."""
    rendezvous_handler_registry.register(NAME, create_handler)
