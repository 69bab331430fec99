"""The rendezvous backend table: for each ``--rdzv`` choice, the name torch's
registry knows its handler by, what that handler reads from torch's rendezvous
configs, the endpoint it is given, the rules it puts on the node count, and what
the workers' environment needs for it. Pure: no torch (the handlers themselves,
ranked_c10d and etcd_rdzv, are imported by the agent's launch only).

A new backend: its handler module here, and one line in ``BACKENDS``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from hpclaunch.contract.rendezvous import C10dRdzv, EtcdRdzv, Rendezvous, StaticRdzv
from hpclaunch.slurm.env import ContextError

# etcd rendezvous: once MIN nodes are in, how long to wait for the rest (torch: 30 s);
# heartbeats every ETCD_HEARTBEAT_S, a node missing ETCD_MISSED_HEARTBEATS of them is dead.
ETCD_LAST_CALL_S = 3
ETCD_HEARTBEAT_S = 2
ETCD_MISSED_HEARTBEATS = 3


@dataclass(frozen=True)
class Request:
    """What a backend's part of the launch plan is derived from, for one node."""

    node_rank: int
    first_node: str  # HOST:PORT of the first node (where a store would listen)
    min_nodes: int
    max_nodes: int
    asked_nodes: str  # --nnodes as given (or the step's count), for messages
    node_multiple: int = 1
    rdzv: Rendezvous = field(default_factory=C10dRdzv)


@dataclass(frozen=True)
class RdzvPlan:
    """A backend's part of torch's LaunchConfig for one node."""

    backend: str  # the name torch's rendezvous registry knows the handler by
    endpoint: str
    configs: Mapping[str, object]


@dataclass(frozen=True)
class Backend:
    """One row of the table: the handler's registry name, how its endpoint and
    configs are derived (raising ContextError on a request it cannot serve), and
    the variables the workers need for it."""

    name: str
    derive: Callable[[Request], tuple[str, dict[str, object]]]
    worker_env: Mapping[str, str] = field(default_factory=dict)

    def plan(self, request: Request) -> RdzvPlan:
        """This backend's part of the launch plan. Raises ContextError."""
        endpoint, configs = self.derive(request)
        if request.node_multiple > 1:
            configs["node_multiple"] = request.node_multiple
        return RdzvPlan(self.name, endpoint, configs)


def _static(req: Request) -> tuple[str, dict[str, object]]:
    if req.node_multiple > 1:
        raise ContextError("--node-multiple needs --rdzv c10d or etcd, not static")
    if req.min_nodes != req.max_nodes:
        raise ContextError(f"static rendezvous needs a fixed node count, not {req.asked_nodes}")
    return req.first_node, {"rank": req.node_rank}


def _c10d(req: Request) -> tuple[str, dict[str, object]]:
    # The first node hosts the store and, by its descriptor's order, is rank 0.
    return req.first_node, {"node_rank": req.node_rank, "is_host": req.node_rank == 0}


def _etcd(req: Request) -> tuple[str, dict[str, object]]:
    etcd = req.rdzv
    if not isinstance(etcd, EtcdRdzv) or not etcd.endpoints:  # a sidecar not yet found
        raise ContextError("--rdzv etcd needs --etcd-endpoint HOST:PORT or --etcd-sidecar")
    configs: dict[str, object] = {
        "node_rank": req.node_rank,
        "last_call_timeout": ETCD_LAST_CALL_S,
        "keep_alive_interval": ETCD_HEARTBEAT_S,
        "keep_alive_max_attempt": ETCD_MISSED_HEARTBEATS,
        **etcd.rdzv_configs(),
    }
    return ",".join(etcd.endpoints), configs


# By the name --rdzv takes (hpclaunch.contract.rendezvous.BACKENDS, the settings' table).
BACKENDS: Mapping[str, Backend] = {
    # torch 2.13's shared agent store makes restarted workers read the previous
    # attempt's addresses now and then; hpclaunch-c10d switches per round itself.
    StaticRdzv.name: Backend("static", _static, {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}),
    C10dRdzv.name: Backend("hpclaunch-c10d", _c10d),
    EtcdRdzv.name: Backend("hpclaunch-etcd", _etcd),
}
