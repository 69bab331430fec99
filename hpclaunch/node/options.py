"""The agent's settings and its launch plan, pure: what ``hpclaunch agent`` was
asked for, the worker command, and torch's LaunchConfig arguments for this node.
No torch, no I/O."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpclaunch.job.spec import DEFAULT_GRACE_PERIOD_S, EntryKind, Rendezvous, WorkerStart
from hpclaunch.job.values import NodeRange
from hpclaunch.rendezvous.etcd.access import EtcdFlags
from hpclaunch.slurm.env import ContextError, NodeContext, RankOrder

# SLURM's time-limit warning and the preemption signals reach the agent; torch's agent
# handles only the first four by default and dies of the others, orphaning its workers.
HANDLED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
# What the agent puts before each line it copies from a worker's output (--tee).
LINE_PREFIX = "[rank${rank}] "
# etcd rendezvous: once MIN nodes are in, how long to wait for the rest (torch: 30 s);
# heartbeats every ETCD_HEARTBEAT_S, a node missing ETCD_MISSED_HEARTBEATS of them is dead.
ETCD_LAST_CALL_S = 3
ETCD_HEARTBEAT_S = 2
ETCD_MISSED_HEARTBEATS = 3
# torch's own sleep between looks at the workers; the real wait is event-driven.
MONITOR_SLEEP_S = 0.001


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
    job_dir: Path | None = None  # None: HPCLAUNCH_JOB_DIR, else LOG_DIR/JOBID
    tee: bool = True
    grace_period_s: int = DEFAULT_GRACE_PERIOD_S
    etcd: EtcdFlags = dataclasses.field(default_factory=EtcdFlags)
    node_multiple: int = 1
    worker_start: WorkerStart = WorkerStart.WARM
    supervised: bool = False  # the supervisor prints the root-cause block, not this agent


def node_range(ctx: NodeContext, opts: AgentOptions) -> tuple[int, int]:
    """(min, max) nodes for the rendezvous. Raises ContextError when the step does not fit."""
    if opts.nnodes is None:
        low = ctx.nnodes
    else:
        low = opts.nnodes.min
        if not low <= ctx.nnodes <= opts.nnodes.max:
            raise ContextError(
                f"the step has {ctx.nnodes} nodes but --nnodes is {opts.nnodes}; "
                "run one agent per node of the allocation"
            )
    # SLURM has already fixed how many nodes this step has: waiting for MAX would cost
    # torch's last-call time (30 s) for nodes that cannot come.
    high = ctx.nnodes
    if opts.node_multiple > 1:
        # torch puts the nodes beyond the largest multiple in its redundancy list: spares.
        fit = NodeRange(low, high).multiples(opts.node_multiple)
        if fit is None:
            raise ContextError(
                f"the step has {ctx.nnodes} nodes (at least {low} wanted): no count from "
                f"{low} to {high} is a multiple of --node-multiple {opts.node_multiple}"
            )
        low, high = fit
    return low, high


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


def starts_warm(opts: AgentOptions) -> bool:
    """Whether the workers are forked from the zygote (python scripts and modules)."""
    return opts.worker_start is WorkerStart.WARM and opts.entry_kind is not EntryKind.EXECUTABLE


def launched_as(
    opts: AgentOptions, agent_pid: int, setpriv: str | None
) -> tuple[str, tuple[str, ...]]:
    """The (entrypoint, args) pair torch's elastic_launch is given for the workers: the
    python command line itself when the zygote starts them (they die with it), else
    the command guarded to die with the agent."""
    command = worker_command(opts)
    if starts_warm(opts):
        return command[0], command[1:]
    return guarded(command, agent_pid, setpriv)


def launch_settings(
    ctx: NodeContext, opts: AgentOptions, master_addr: str, local_addr: str
) -> dict[str, Any]:
    """The keyword arguments of torch's LaunchConfig for this node (pure)."""
    low, high = node_range(ctx, opts)
    endpoint = f"{master_addr}:{ctx.master_port}"
    configs: dict[str, Any]
    if opts.rdzv is Rendezvous.STATIC:
        if opts.node_multiple > 1:
            raise ContextError("--node-multiple needs --rdzv c10d or etcd, not static")
        if low != high:
            raise ContextError(f"static rendezvous needs a fixed node count, not {opts.nnodes}")
        backend, configs = "static", {"rank": ctx.node_rank}
    elif opts.rdzv is Rendezvous.ETCD:
        if not opts.etcd.endpoints:
            raise ContextError("--rdzv etcd needs --etcd-endpoint HOST:PORT or --etcd-sidecar")
        backend, endpoint = "hpclaunch-etcd", ",".join(opts.etcd.endpoints)
        configs = {
            "node_rank": ctx.node_rank, "last_call_timeout": ETCD_LAST_CALL_S,
            "keep_alive_interval": ETCD_HEARTBEAT_S,
            "keep_alive_max_attempt": ETCD_MISSED_HEARTBEATS, **opts.etcd.rdzv_configs(),
        }  # fmt: skip
    else:
        # The first node hosts the store and, by its descriptor's order, is rank 0.
        backend, configs = (
            "hpclaunch-c10d",
            {"node_rank": ctx.node_rank, "is_host": ctx.node_rank == 0},
        )
    if opts.node_multiple > 1:
        configs["node_multiple"] = opts.node_multiple
    return {
        "min_nodes": low,
        "max_nodes": high,
        "nproc_per_node": ctx.nproc_per_node,
        "run_id": f"hpclaunch-{ctx.job_id}-{ctx.restart_count}",
        "rdzv_endpoint": endpoint,
        "rdzv_backend": backend,
        "rdzv_configs": configs,
        "max_restarts": opts.max_restarts,
        # torch sleeps this long between looks at the workers; RecordingAgent waits
        # instead for a worker's exit, up to monitor_interval_s (hpclaunch's interval).
        "monitor_interval": MONITOR_SLEEP_S,
        "start_method": "spawn",
        "local_addr": local_addr,
        "signals_to_handle": HANDLED_SIGNALS,
        "shutdown_timeout": opts.grace_period_s,
        "log_line_prefix_template": LINE_PREFIX if opts.tee else None,
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
