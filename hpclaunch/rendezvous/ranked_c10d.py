"""``hpclaunch-c10d``: torch's c10d dynamic rendezvous with node ranks in SLURM's order.

torch's dynamic rendezvous numbers nodes by sorting their descriptors, whose
first field is the host name (so ``n10`` comes before ``n2``, and the node that
hosts the store need not be rank 0). This backend gives each node a descriptor
that sorts by the node rank hpclaunch derived from SLURM, and is otherwise
torch's own handler. Written against torch 2.13's dynamic_rendezvous module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousParameters,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

from hpclaunch.joblogs import ATTEMPT_VAR

NAME = "hpclaunch-c10d"
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

    def next_rendezvous(self) -> Any:
        if self._rounds_joined:
            os.environ[SEPARATE_STORE] = "1"
        self._rounds_joined += 1
        info = super().next_rendezvous()
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
    node = stock._this_node
    ranked = RankedNodeDesc(node.addr, node.pid, node.local_id, node_rank)
    return RankedHandler(ranked, stock._settings, NAME, store, stock._state_holder)


def register() -> None:
    """Make ``hpclaunch-c10d`` known to torch's registry (idempotent)."""
    rendezvous_handler_registry.register(NAME, create_handler)
