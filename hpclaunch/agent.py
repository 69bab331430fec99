"""``hpclaunch agent``: one per node; SLURM's environment → torch's elastic agent.

``NodeContext`` (pure) → ``launch_settings`` (pure) → torch's ``LaunchConfig`` →
``elastic_launch``, which spawns and supervises the workers. torch is imported
only by ``launch``.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpclaunch.context import ContextError, NodeContext, RankOrder, parse_topology
from hpclaunch.errors import SlurmError
from hpclaunch.slurm import Slurm
from hpclaunch.spec import EntryKind, Rendezvous
from hpclaunch.values import NodeRange

log = logging.getLogger(__name__)

# SLURM's time-limit warning and the preemption signals reach the agent; torch's agent
# handles only the first four by default and dies of the others, orphaning its workers.
HANDLED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"


@dataclass(frozen=True)
class AgentOptions:
    """What ``hpclaunch agent`` was asked for."""

    entrypoint: str
    args: tuple[str, ...] = ()
    entry_kind: EntryKind = EntryKind.SCRIPT
    nnodes: NodeRange | None = None  # None: the step's node count
    nproc_per_node: int | None = None
    rdzv: Rendezvous = Rendezvous.C10D
    max_restarts: int = 3
    master_addr: str | None = None
    master_port: int | None = None
    rank_order: RankOrder = RankOrder.SLURM
    monitor_interval_s: float = 0.1


def node_range(ctx: NodeContext, opts: AgentOptions) -> tuple[int, int]:
    """(min, max) nodes for the rendezvous. Raises ContextError when the step does not fit."""
    if opts.nnodes is None:
        return ctx.nnodes, ctx.nnodes
    low, high = opts.nnodes.min, opts.nnodes.max
    if not low <= ctx.nnodes <= high:
        raise ContextError(
            f"the step has {ctx.nnodes} nodes but --nnodes is {opts.nnodes}; "
            "run one agent per node of the allocation"
        )
    # SLURM has already fixed how many nodes this step has: waiting for MAX would cost
    # torch's last-call time (30 s) for nodes that cannot come.
    return low, ctx.nnodes


def worker_command(opts: AgentOptions) -> tuple[str, ...]:
    """What each worker runs: python -u SCRIPT, python -u -m MODULE, or the executable."""
    if opts.entry_kind is EntryKind.MODULE:
        return (sys.executable, "-u", "-m", opts.entrypoint, *opts.args)
    if opts.entry_kind is EntryKind.EXECUTABLE:
        return (opts.entrypoint, *opts.args)
    return (sys.executable, "-u", opts.entrypoint, *opts.args)


def guarded(
    command: tuple[str, ...], agent_pid: int, setpriv: str | None
) -> tuple[str, tuple[str, ...]]:
    """``command`` set up to die with the agent (PR_SET_PDEATHSIG=SIGKILL), as the
    (entrypoint, args) pair torch's elastic_launch takes: through util-linux's
    ``setpriv`` where there is one (no interpreter start), else worker_guard.py."""
    if setpriv is not None:
        return setpriv, ("--pdeathsig", "KILL", "--", *command)
    guard = str(Path(__file__).with_name("worker_guard.py"))
    return sys.executable, (guard, str(agent_pid), *command)


def launch_settings(
    ctx: NodeContext, opts: AgentOptions, master_addr: str, local_addr: str
) -> dict[str, Any]:
    """The keyword arguments of torch's LaunchConfig for this node (pure)."""
    if opts.rdzv is Rendezvous.ETCD:
        raise ContextError("--rdzv etcd is not available in this version; use c10d or static")
    low, high = node_range(ctx, opts)
    if opts.rdzv is Rendezvous.STATIC:
        if low != high:
            raise ContextError(f"static rendezvous needs a fixed node count, not {opts.nnodes}")
        backend, configs = "static", {"rank": ctx.node_rank}
    else:
        # The first node hosts the store and, by its descriptor's order, is rank 0.
        backend, configs = (
            "hpclaunch-c10d",
            {"node_rank": ctx.node_rank, "is_host": ctx.node_rank == 0},
        )
    return {
        "min_nodes": low,
        "max_nodes": high,
        "nproc_per_node": ctx.nproc_per_node,
        "run_id": f"hpclaunch-{ctx.job_id}-{ctx.restart_count}",
        "rdzv_endpoint": f"{master_addr}:{ctx.master_port}",
        "rdzv_backend": backend,
        "rdzv_configs": configs,
        "max_restarts": opts.max_restarts,
        "monitor_interval": opts.monitor_interval_s,
        "start_method": "spawn",
        "local_addr": local_addr,
        "signals_to_handle": HANDLED_SIGNALS,
    }


def worker_env(ctx: NodeContext, rdzv: Rendezvous) -> dict[str, str]:
    """hpclaunch's part of the worker environment (torch adds torchrun's variables)."""
    env = {
        "HPCLAUNCH_JOB_ID": str(ctx.job_id),
        "HPCLAUNCH_REQUEUE_COUNT": str(ctx.restart_count),
        "HPCLAUNCH_NODE_RANK": str(ctx.node_rank),
    }
    if rdzv is Rendezvous.STATIC:
        # torch 2.13's shared agent store makes restarted workers read the previous
        # attempt's addresses now and then; hpclaunch-c10d switches per round itself.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def reachable_addr(host: str, slurm: Slurm) -> str:
    """``host`` if its name resolves here, else its NodeAddr from scontrol."""
    try:
        socket.getaddrinfo(host, None)
        return host
    except socket.gaierror:
        pass
    try:
        return slurm.node_addr(host)
    except SlurmError as exc:
        raise ContextError(
            f"node name {host!r} does not resolve here and scontrol could not give its "
            f"address ({exc}); pass --master-addr"
        ) from None


def context(env: Mapping[str, str], opts: AgentOptions, slurm: Slurm) -> NodeContext:
    """This node's context, in the asked rank order."""
    ctx = NodeContext.from_env(
        env, nproc_per_node=opts.nproc_per_node, master_port=opts.master_port
    )
    if opts.rank_order is RankOrder.TOPOLOGY:
        ctx = ctx.ordered(RankOrder.TOPOLOGY, parse_topology(slurm.topology()))
    return ctx


def launch(ctx: NodeContext, opts: AgentOptions, settings: Mapping[str, Any]) -> int:
    """Run the workers through torch's elastic agent; return the exit status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from hpclaunch.rendezvous import ranked_c10d

    ranked_c10d.register()
    # The agent's own environment is what torch hands to the workers and what it
    # reads its store setting from: this process is ours, and ends with the job step.
    os.environ.update(worker_env(ctx, opts.rdzv))
    command, args = guarded(worker_command(opts), os.getpid(), shutil.which("setpriv"))
    log.info(
        "job %d node %d/%d: %d workers, rendezvous %s at %s",
        ctx.job_id, ctx.node_rank, ctx.nnodes, ctx.nproc_per_node,
        settings["rdzv_backend"], settings["rdzv_endpoint"],
    )  # fmt: skip
    try:
        elastic_launch(LaunchConfig(**settings), command)(*args)
    except ChildFailedError as exc:
        print(exc.format_msg(), file=sys.stderr)  # type: ignore[no-untyped-call]
        return 1
    except SignalException as exc:
        log.info("job %d node %d: stopped by %s", ctx.job_id, ctx.node_rank, exc.sigval.name)
        return 128 + int(exc.sigval)
    return 0
