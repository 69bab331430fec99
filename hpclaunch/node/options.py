"""The agent's settings and its launch plan, pure: what ``hpclaunch agent`` was
asked for (``AgentSettings``, the one contract between the rendered script and
the agent), the worker command, and torch's LaunchConfig arguments for this node.
No torch, no I/O."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpclaunch.errors import SpecError
from hpclaunch.job import rendezvous
from hpclaunch.job.contract import (
    Choice,
    Flag,
    Flags,
    Folder,
    Name,
    Number,
    Parsed,
    Script,
    Text,
    setting,
    to_argv,
)
from hpclaunch.job.rendezvous import Rendezvous
from hpclaunch.job.spec import (
    DEFAULT_GRACE_PERIOD_S,
    DEFAULT_MAX_RESTARTS,
    EntryKind,
    WorkerStart,
)
from hpclaunch.job.values import HANG_AUTO, NodeRange
from hpclaunch.slurm.env import ContextError, NodeContext, RankOrder

if TYPE_CHECKING:
    from hpclaunch.job.spec import JobSpec

# SLURM's time-limit warning and the preemption signals reach the agent; torch's agent
# handles only the first four by default and dies of the others, orphaning its workers.
HANDLED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
# What the agent puts before each line it copies from a worker's output (--tee).
LINE_PREFIX = "[rank${rank}] "
# torch's own sleep between looks at the workers; the real wait is event-driven.
MONITOR_SLEEP_S = 0.001

_ETCD_USER_HELP = (
    "etcd user; the password comes from --etcd-password-file or $HPCLAUNCH_ETCD_PASSWORD."
)
_ENTRY_FLAGS = Flags(
    {
        EntryKind.MODULE: (("-m", "--module"), "SCRIPT is a Python module name."),
        EntryKind.EXECUTABLE: (("--no-python",), "SCRIPT is an executable."),
    }
)


@dataclass(frozen=True)
class AgentSettings:
    """What ``hpclaunch agent`` was asked for. Each field with a row (``setting``) is
    an option of the command, generated from it, and the script passes it as its row
    says (``to_argv``); the training command (entrypoint, args) follows ``--``."""

    entrypoint: str
    args: tuple[str, ...] = ()
    nnodes: NodeRange | None = setting(
        None,
        "--nnodes",
        Parsed("nodes"),
        "N or MIN:MAX nodes. [default: the step's]",
        Script.ALWAYS,
    )
    nproc_per_node: int | None = setting(
        None,
        "--nproc-per-node",
        Number(int),
        "Workers on this node. "
        "[default: SLURM_GPUS_ON_NODE, else CUDA_VISIBLE_DEVICES' count, else 1]",
        Script.ALWAYS,
    )
    rdzv: str = setting(
        rendezvous.DEFAULT.name,
        "--rdzv",
        Name(tuple(rendezvous.BACKENDS)),
        "Rendezvous "
        "backend: static (fixed ranks from SLURM), c10d (a store on the first node) or etcd.",
        Script.ALWAYS,
    )
    max_restarts: int = setting(
        DEFAULT_MAX_RESTARTS,
        "--max-restarts",
        Number(int, min=0),
        "In-place restarts of this node's worker group.",
        Script.ALWAYS,
    )
    hang_timeout: str = setting(
        HANG_AUTO,
        "--hang-timeout",
        Parsed("hang_timeout"),
        "Seconds without training "
        "progress after which the workers count as hung (stacks saved, restart in place); "
        "auto: a multiple of the slowest step, with a floor; off.",
        Script.WHEN_SET,
    )
    grace_period_s: float = setting(
        DEFAULT_GRACE_PERIOD_S,
        "--grace-period",
        Number(float, min=0),
        "Seconds the workers get to exit after a signal is passed on, before SIGKILL.",
        Script.ALWAYS,
    )
    node_multiple: int = setting(
        1,
        "--node-multiple",
        Number(int, min=1),
        "Run on a multiple of K nodes; the nodes beyond it stand by as spares.",
    )
    etcd_endpoints: tuple[str, ...] = setting(
        (),
        "--etcd-endpoint",
        Parsed("endpoints", ",".join),
        "etcd endpoints HOST:PORT[,HOST:PORT...] for --rdzv etcd.",
    )
    etcd_sidecar: bool = setting(
        False, "--etcd-sidecar", Flag(), "The first node starts an etcd server for the job."
    )
    etcd_binary: str | None = setting(
        None, "--etcd-binary", Text(), "The etcd server for --etcd-sidecar. [default: etcd on PATH]"
    )
    etcd_cacert: str | None = setting(
        None, "--etcd-cacert", Text(), "CA certificate of the etcd server (turns on TLS)."
    )
    etcd_cert: str | None = setting(
        None, "--etcd-cert", Text(), "Client certificate for etcd (with --etcd-key)."
    )
    etcd_key: str | None = setting(None, "--etcd-key", Text(), "Client certificate key for etcd.")
    etcd_user: str | None = setting(None, "--etcd-user", Text(), _ETCD_USER_HELP)
    etcd_password_file: str | None = setting(
        None, "--etcd-password-file", Text(), "File whose first line is the etcd password."
    )
    etcd_outage_timeout: float | None = setting(
        None,
        "--etcd-outage-timeout",
        Number(float, min=0),
        "Seconds a running job waits for an unreachable etcd before it fails. [default: 120]",
    )
    master_addr: str | None = setting(
        None,
        "--master-addr",
        Text(),
        "Address of the first node. [default: its name, or its NodeAddr]",
        Script.NEVER,
    )
    master_port: int | None = setting(
        None,
        "--master-port",
        Number(int, min=1, max=65535),
        "Rendezvous port. [default: 15000 + job id % 10000]",
        Script.WHEN_SET,
    )
    rank_order: RankOrder = setting(
        RankOrder.SLURM,
        "--rank-order",
        Choice(RankOrder),
        "topology: nodes under one leaf switch get consecutive ranks.",
        Script.NEVER,
    )
    job_dir: Path | None = setting(
        None,
        "--job-dir",
        Folder(),
        "Job folder; per-rank logs go to its logs/. "
        "[default: $HPCLAUNCH_JOB_DIR, else hpclaunch-logs/JOBID]",
        Script.NEVER,
    )
    tee: bool = setting(
        True,
        "--tee",
        Flag(off="--no-tee"),
        "Also copy every rank's output to the agent's, each line prefixed [rankN].",
        Script.NEVER,
    )
    worker_start: WorkerStart = setting(
        WorkerStart.WARM,
        "--worker-start",
        Choice(WorkerStart),
        "warm: python workers are forked from a copy of the agent that has imported "
        "torch (fast launch and restart); fresh: a new interpreter each, as torchrun does.",
        Script.NEVER,
    )
    supervised: bool = setting(
        False,
        "--supervised",
        Flag(),
        "Set by the rendered script when the supervisor runs the step.",
    )
    no_kill: bool = setting(
        False,
        "--no-kill",
        Flag(),
        "Set by the rendered script for sbatch --no-kill: when "
        "the batch host is lost, a surviving agent ends or requeues the job.",
    )
    entry_kind: EntryKind = setting(EntryKind.SCRIPT, "--module", _ENTRY_FLAGS, "What SCRIPT is.")
    # How long the agent waits for a worker's exit between its other checks.
    monitor_interval_s: float = 0.1

    @classmethod
    def from_spec(cls, spec: JobSpec, *, supervised: bool = False) -> AgentSettings:
        """The settings the rendered script gives every node's agent for ``spec``;
        ``supervised``: the step runs under ``hpclaunch supervise``."""
        # The spec's rendezvous settings are read here and nowhere else in the script.
        return cls(
            entrypoint=spec.entrypoint,
            args=spec.args,
            entry_kind=spec.entry_kind,
            nnodes=spec.nodes,
            nproc_per_node=spec.effective_nproc_per_node,
            rdzv=spec.rdzv.name,
            max_restarts=spec.max_restarts,
            grace_period_s=spec.agent_grace_s,
            hang_timeout=spec.hang_timeout,
            node_multiple=spec.node_multiple,
            master_port=spec.master_port,
            supervised=supervised,
            no_kill=spec.no_kill,
            etcd_endpoints=spec.etcd_endpoints,
            etcd_sidecar=spec.etcd_sidecar,
            etcd_binary=spec.etcd_binary,
            etcd_cacert=spec.etcd_cacert,
            etcd_cert=spec.etcd_cert,
            etcd_key=spec.etcd_key,
            etcd_user=spec.etcd_user,
            etcd_password_file=spec.etcd_password_file,
            etcd_outage_timeout=spec.etcd_outage_timeout,
        )

    def to_argv(self) -> list[str]:
        """The agent's options as the rendered script writes them (before ``--``)."""
        return to_argv(self)

    @property
    def rendezvous(self) -> Rendezvous:
        """The rendezvous settings these options name, nested as JobSpec holds them; the
        options of another backend are ignored. Raises ContextError (e.g. --rdzv etcd
        with neither --etcd-endpoint nor --etcd-sidecar)."""
        flat = {
            key: getattr(self, attr)
            for key in rendezvous.SETTING_KEYS
            for attr in [{"etcd_endpoint": "etcd_endpoints"}.get(key, key)]
        }
        try:
            return rendezvous.build(self.rdzv, flat, others=True)
        except SpecError as exc:
            raise ContextError(f"--{exc.field.replace('_', '-')}: {exc.message}") from None

    @property
    def shutdown_timeout_s(self) -> int:
        """--grace-period as the whole seconds torch's shutdown timeout takes (rounded
        up, so that a grace period given stays one)."""
        return math.ceil(self.grace_period_s)


# The name this module's users knew; the settings are the options.
AgentOptions = AgentSettings


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
    from hpclaunch.rendezvous import backends  # on the node only: sbatch needs none of it

    low, high = node_range(ctx, opts)
    request = backends.Request(
        node_rank=ctx.node_rank,
        first_node=f"{master_addr}:{ctx.master_port}",
        min_nodes=low,
        max_nodes=high,
        asked_nodes=str(opts.nnodes),
        node_multiple=opts.node_multiple,
        rdzv=opts.rendezvous,
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


def worker_env(ctx: NodeContext, rdzv: str, attempt: int | None = None) -> dict[str, str]:
    """hpclaunch's part of the worker environment for backend ``rdzv`` (a --rdzv name)
    and ``attempt`` (see hpclaunch.node.worker_env); torch adds torchrun's variables."""
    from hpclaunch.node.worker_env import build as build_worker_env
    from hpclaunch.rendezvous import backends

    return build_worker_env(
        ctx.job_id,
        ctx.restart_count,
        ctx.node_rank,
        attempt,
        backends.BACKENDS[rdzv].worker_env,
        str(local_checkpoints(ctx)),
    )


def local_checkpoints(ctx: NodeContext, base: Path | None = None) -> Path:
    """This node's folder for node-local checkpoint copies: in node memory (/dev/shm)
    where there is one, else the temporary folder; one per job, run and node (the
    sandbox's nodes share one machine). It lives as long as this node's agent, which
    is what in-place restarts need; a requeued run starts without it."""
    if base is None:
        base = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
    return base / _safe(f"hpclaunch-{ctx.job_id}-{ctx.restart_count}-{ctx.hostname}")


def stale_local_checkpoints(ctx: NodeContext, base: Path | None = None) -> list[Path]:
    """This job's node-local folders on this node from earlier runs: an agent killed
    by SLURM (after KillWait) could not remove its own."""
    current = local_checkpoints(ctx, base)
    prefix, suffix = _safe(f"hpclaunch-{ctx.job_id}-"), _safe(f"-{ctx.hostname}")
    return [
        path
        for path in current.parent.glob(f"{prefix}*{suffix}")
        if path != current and path.name[len(prefix) : -len(suffix)].isdigit()
    ]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
