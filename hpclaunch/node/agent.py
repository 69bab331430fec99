"""``hpclaunch agent``: one per node; SLURM's environment → torch's elastic agent.

``NodeContext`` (pure) → ``launch_settings`` (pure) → torch's ``LaunchConfig`` →
``elastic_launch``, which spawns and supervises the workers. torch is imported
only by ``launch``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpclaunch.errors import SlurmError
from hpclaunch.job.spec import DEFAULT_GRACE_PERIOD_S, EntryKind, Rendezvous, WorkerStart
from hpclaunch.job.values import NodeRange
from hpclaunch.jobdir import failures, joblogs
from hpclaunch.rendezvous.etcd.access import EtcdFlags
from hpclaunch.slurm.commands import Slurm
from hpclaunch.slurm.env import ContextError, NodeContext, RankOrder, parse_topology

if TYPE_CHECKING:  # the module is imported when a zygote is forked
    from hpclaunch.node.warmstart.zygote import Zygote

log = logging.getLogger(__name__)

# SLURM's time-limit warning and the preemption signals reach the agent; torch's agent
# handles only the first four by default and dies of the others, orphaning its workers.
HANDLED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
# Set to 1 while the agent imports torch (and with it numpy's OpenBLAS): see _fork_zygote.
BLAS_THREADS_VAR = "OPENBLAS_NUM_THREADS"
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


def etcd_sidecar(
    ctx: NodeContext, opts: AgentOptions, master_addr: str, *, start: bool = True
) -> tuple[AgentOptions, Any]:
    """--etcd-sidecar: the first node starts the job's etcd server, the others wait
    for it. Returns the options with its endpoint, and the server (first node only)
    for the caller to stop. ``start=False`` (dry run) names the first candidate."""
    from hpclaunch.rendezvous.etcd import sidecar

    try:
        ip = str(socket.getaddrinfo(master_addr, None, socket.AF_INET)[0][4][0])
    except (socket.gaierror, IndexError):
        raise ContextError(
            f"the first node's address {master_addr!r} does not resolve to an IPv4 address "
            "here, which the etcd sidecar listens on; pass --master-addr IP"
        ) from None
    name = sidecar.member_name(ctx.job_id, ctx.restart_count)
    ports = sidecar.candidate_ports(ctx.job_id)
    server = None
    if not start:
        endpoint = f"{ip}:{ports[0]}"
    elif ctx.node_rank == 0:
        setpriv = shutil.which("setpriv")
        guard = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else None
        server = sidecar.Sidecar.start(opts.etcd.binary, name, ip, ports, guard)
        endpoint = server.endpoint
    else:
        endpoint = sidecar.find(ip, name, ports)
    etcd = dataclasses.replace(opts.etcd, endpoints=(endpoint,))
    return dataclasses.replace(opts, etcd=etcd), server


def job_folder(ctx: NodeContext, opts: AgentOptions, env: Mapping[str, str]) -> Path:
    """The job folder the per-rank logs go under (see hpclaunch.jobdir.joblogs)."""
    return opts.job_dir if opts.job_dir is not None else joblogs.job_dir(env, ctx.job_id)


def context(env: Mapping[str, str], opts: AgentOptions, slurm: Slurm) -> NodeContext:
    """This node's context, in the asked rank order."""
    ctx = NodeContext.from_env(
        env, nproc_per_node=opts.nproc_per_node, master_port=opts.master_port
    )
    if opts.rank_order is RankOrder.TOPOLOGY:
        ctx = ctx.ordered(RankOrder.TOPOLOGY, parse_topology(slurm.topology()))
    return ctx


def launch(
    ctx: NodeContext, opts: AgentOptions, settings: Mapping[str, Any], env: Mapping[str, str]
) -> int:
    """Run the workers through torch's elastic agent; return the exit status."""
    zygote = _fork_zygote() if starts_warm(opts) else None
    try:
        return _launch(ctx, opts, settings, env, zygote)
    finally:
        if zygote is not None:
            zygote.close()


def _fork_zygote() -> Zygote | None:
    """The zygote the workers are forked from, or None (then they start fresh)."""
    # What the zygote is for: the workers forked from it find these imported. numpy,
    # when torch finds it, loads OpenBLAS, which starts a thread per CPU at once, and a
    # process with threads cannot be forked safely: it loads with one here, and each
    # worker then sets the count its own environment gives (forked_worker).
    saved = os.environ.get(BLAS_THREADS_VAR)
    os.environ[BLAS_THREADS_VAR] = "1"
    try:
        import torch.distributed.distributed_c10d  # noqa: F401
    finally:
        if saved is None:
            del os.environ[BLAS_THREADS_VAR]
        else:
            os.environ[BLAS_THREADS_VAR] = saved

    from hpclaunch.node.warmstart.zygote import Zygote, ZygoteError

    try:
        return Zygote.fork(handled=_signals(HANDLED_SIGNALS))
    except (ZygoteError, OSError) as exc:
        log.warning("workers start fresh (--worker-start fresh: without this warning): %s", exc)
        return None


def _signals(names: str) -> list[signal.Signals]:
    return [signal.Signals[name.strip()] for name in names.split(",")]


def _launch(
    ctx: NodeContext, opts: AgentOptions, settings: Mapping[str, Any],
    env: Mapping[str, str], zygote: Zygote | None,
) -> int:  # fmt: skip
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousClosedError,
        RendezvousError,
    )
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from hpclaunch.node import recording_agent
    from hpclaunch.node.rank_logs import RankLogs
    from hpclaunch.rendezvous import etcd_rdzv, ranked_c10d

    ranked_c10d.register()
    etcd_rdzv.register()
    # The agent's own environment is what torch hands to the workers and what it
    # reads its store setting from: this process is ours, and ends with the job step.
    os.environ.update(worker_env(ctx, opts.rdzv))
    if zygote is not None:
        from hpclaunch.node.warmstart import warm

        agent_pid, setpriv = os.getpid(), shutil.which("setpriv")
        warm.install(
            zygote, lambda worker: guarded(worker, agent_pid, setpriv), opts.grace_period_s
        )
        command, args = launched_as(opts, agent_pid, None)
    else:
        command, args = guarded(worker_command(opts), os.getpid(), shutil.which("setpriv"))
    job = job_folder(ctx, opts, env)
    logs = RankLogs(job, ctx.restart_count, ctx.step_id, tee=opts.tee, node=ctx.hostname)

    def record(result: Any) -> None:
        attempt = int(os.environ.get(joblogs.ATTEMPT_VAR, "0"))
        failed = _failures(result.failures, logs.folder)
        path = failures.write(job, failures.record_of(
            ctx.hostname, ctx.node_rank, ctx.restart_count, attempt, failed))  # fmt: skip
        log.info("attempt %d failed; record in %s", attempt, path)

    recording_agent.install(record, opts.monitor_interval_s)
    log.info(
        "%d workers on %s, %d %s in all; rendezvous %s at %s; rank logs in %s",
        ctx.nproc_per_node, ctx.hostname, ctx.nnodes, "node" if ctx.nnodes == 1 else "nodes",
        settings["rdzv_backend"], settings["rdzv_endpoint"], logs.root_log_dir,
    )  # fmt: skip
    try:
        elastic_launch(LaunchConfig(**settings, logs_specs=logs), command)(*args)
    except ChildFailedError as exc:
        block = _root_cause(exc, ctx, opts, logs.folder)
        if env.get(failures.SUPERVISED_VAR) == "1":
            # The supervisor prints one block for the whole job, from the right node.
            path = failures.write_block(job, ctx.restart_count, ctx.hostname, block)
            log.error("workers failed for good; root-cause block in %s", path)
        else:
            print(block, file=sys.stderr, flush=True)
        return 1
    except RendezvousClosedError:
        log.error(
            "another node's agent closed the rendezvous and ended; its log says why "
            "(a root-cause block when its workers failed)"
        )
        return 1
    except RendezvousError as exc:
        log.error(
            "rendezvous %s at %s failed: %s",
            settings["rdzv_backend"], settings["rdzv_endpoint"], exc or type(exc).__name__,
        )  # fmt: skip
        return 1
    except SignalException as exc:
        log.info("stopped by %s", exc.sigval.name)
        return 128 + int(exc.sigval)
    return 0


def _failures(by_rank: Mapping[int, Any], folder: Path | None) -> list[joblogs.Failure]:
    """torch's ProcessFailures as joblogs.Failure; ``folder`` holds the attempt's logs."""
    return [
        joblogs.Failure(
            rank=rank, local_rank=f.local_rank, exitcode=f.exitcode, pid=f.pid,
            timestamp=f.timestamp,
            error_file=str(joblogs.rank_file(folder, rank, "json")) if folder else "",
            stderr_file=str(joblogs.rank_file(folder, rank, "err")) if folder else "",
        )
        for rank, f in by_rank.items()
    ]  # fmt: skip


def _root_cause(exc: Any, ctx: NodeContext, opts: AgentOptions, folder: Path | None) -> str:
    """hpclaunch's root-cause block from torch's ChildFailedError."""
    return joblogs.root_cause_block(
        _failures(exc.failures, folder), job_id=ctx.job_id, host=ctx.hostname,
        node_rank=ctx.node_rank, command=worker_command(opts),
    )  # fmt: skip
