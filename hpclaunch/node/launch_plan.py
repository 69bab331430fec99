"""This node's launch plan, from the agent's settings (``hpclaunch.contract.agent``) and
SLURM's view of the step: the node range, the worker command, torch's LaunchConfig
arguments (``LaunchPlan``), hpclaunch's part of the worker environment and the
node-local checkpoint folder. No torch; the only I/O is finding the node-local folder."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpclaunch.contract import rendezvous
from hpclaunch.contract.agent import AgentSettings, EntryKind, WorkerStart
from hpclaunch.contract.rendezvous import Rendezvous
from hpclaunch.contract.values import NodeRange
from hpclaunch.contract.worker_env import build as build_worker_env
from hpclaunch.errors import SpecError
from hpclaunch.rendezvous import backends
from hpclaunch.slurm.env import ContextError, NodeContext

# SLURM's time-limit warning and the preemption signals reach the agent; torch's agent
# handles only the first four by default and dies of the others, orphaning its workers.
HANDLED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
# What the agent puts before each line it copies from a worker's output (--tee).
LINE_PREFIX = "[rank${rank}] "
# torch's own sleep between looks at the workers; the real wait is event-driven.
MONITOR_SLEEP_S = 0.001


def rendezvous_of(opts: AgentSettings) -> Rendezvous:
    """The rendezvous settings ``opts`` name, nested as JobSpec holds them; the options
    of another backend are ignored. Raises ContextError (e.g. --rdzv etcd with neither
    --etcd-endpoint nor --etcd-sidecar)."""
    flat = {
        key: getattr(opts, attr)
        for key in rendezvous.SETTING_KEYS
        for attr in [{"etcd_endpoint": "etcd_endpoints"}.get(key, key)]
    }
    try:
        return rendezvous.build(opts.rdzv, flat, others=True)
    except SpecError as exc:
        raise ContextError(f"--{exc.field.replace('_', '-')}: {exc.message}") from None


def node_range(ctx: NodeContext, opts: AgentSettings) -> tuple[int, int]:
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


def worker_command(opts: AgentSettings) -> tuple[str, ...]:
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
    # -S: the guard is python too; the progress boot (on PYTHONPATH) is for the worker.
    return sys.executable, ("-S", guard, str(agent_pid), *command)


def starts_warm(opts: AgentSettings) -> bool:
    """Whether the workers are forked from the zygote (python scripts and modules)."""
    return opts.worker_start is WorkerStart.WARM and opts.entry_kind is not EntryKind.EXECUTABLE


def launched_as(
    opts: AgentSettings, agent_pid: int, setpriv: str | None
) -> tuple[str, tuple[str, ...]]:
    """The (entrypoint, args) pair torch's elastic_launch is given for the workers: the
    python command line itself when the zygote starts them (they die with it), else
    the command guarded to die with the agent."""
    command = worker_command(opts)
    if starts_warm(opts):
        return command[0], command[1:]
    return guarded(command, agent_pid, setpriv)


@dataclass(frozen=True)
class LaunchPlan:
    """This node's launch, as torch's LaunchConfig takes it (field for field, in the
    order ``hpclaunch agent --dry-run`` prints them)."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    run_id: str
    rdzv_endpoint: str
    rdzv_backend: str
    rdzv_configs: Mapping[str, object]
    max_restarts: int
    # torch sleeps this long between looks at the workers; RecordingAgent waits
    # instead for a worker's exit, up to monitor_interval_s (hpclaunch's interval).
    monitor_interval: float
    start_method: str
    local_addr: str
    signals_to_handle: str
    shutdown_timeout: int
    log_line_prefix_template: str | None

    def launch_config_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of torch's LaunchConfig (all but logs_specs, which
        the agent gives), also what ``--dry-run`` prints as ``launch``. (Any: torch's
        own types, each field typed above.)"""
        kwargs = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        kwargs["rdzv_configs"] = dict(self.rdzv_configs)
        return kwargs


def launch_settings(
    ctx: NodeContext, opts: AgentSettings, master_addr: str, local_addr: str
) -> LaunchPlan:
    """This node's launch plan (pure). Raises ContextError when the step does not fit
    the settings or the rendezvous backend cannot serve them."""
    low, high = node_range(ctx, opts)
    request = backends.Request(
        node_rank=ctx.node_rank,
        first_node=f"{master_addr}:{ctx.master_port}",
        min_nodes=low,
        max_nodes=high,
        asked_nodes=str(opts.nnodes),
        node_multiple=opts.node_multiple,
        rdzv=rendezvous_of(opts),
    )
    rdzv = backends.BACKENDS[opts.rdzv].plan(request)
    return LaunchPlan(
        min_nodes=low,
        max_nodes=high,
        nproc_per_node=ctx.nproc_per_node,
        run_id=f"hpclaunch-{ctx.job_id}-{ctx.restart_count}",
        rdzv_endpoint=rdzv.endpoint,
        rdzv_backend=rdzv.backend,
        rdzv_configs=rdzv.configs,
        max_restarts=opts.max_restarts,
        monitor_interval=MONITOR_SLEEP_S,
        start_method="spawn",
        local_addr=local_addr,
        signals_to_handle=HANDLED_SIGNALS,
        shutdown_timeout=opts.shutdown_timeout_s,
        log_line_prefix_template=LINE_PREFIX if opts.tee else None,
    )


def worker_env(
    ctx: NodeContext, rdzv: str, local: Path, attempt: int | None = None
) -> dict[str, str]:
    """hpclaunch's part of the worker environment for backend ``rdzv`` (a --rdzv name),
    node-local folder ``local`` (hpclaunch.node.local_folder) and ``attempt`` (see
    hpclaunch.contract.worker_env); torch adds torchrun's variables."""
    return build_worker_env(
        ctx.job_id,
        ctx.restart_count,
        ctx.node_rank,
        attempt,
        backends.BACKENDS[rdzv].worker_env,
        str(local),
    )
