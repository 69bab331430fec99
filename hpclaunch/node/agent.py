"""``hpclaunch agent``: one per node; SLURM's environment → torch's elastic agent.

``NodeContext`` (pure) → ``launch_settings`` (pure) → torch's ``LaunchConfig`` →
``hpclaunch.node.launcher.run_agent``, whose agent spawns and supervises the workers.
torch is imported only by ``launch``.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpclaunch.contract.agent import AgentSettings, RankOrder
from hpclaunch.contract.values import TimeoutField
from hpclaunch.contract.worker_env import framework_env
from hpclaunch.errors import HpclaunchError, SlurmError
from hpclaunch.jobdir import failures, joblogs, modes, unwritten
from hpclaunch.jobdir.hangs import hang_block
from hpclaunch.jobdir.layout import AttemptFolder, JobFolder, RankFile
from hpclaunch.node import local_folder, ports
from hpclaunch.node.hangs import Bounds, HangTimeout, Watch
from hpclaunch.node.launch_plan import (
    HANDLED_SIGNALS,
    LaunchPlan,
    guarded,
    launched_as,
    starts_warm,
    worker_command,
    worker_env,
)
from hpclaunch.node.sweep import Sweeper, stop_signals_ignored
from hpclaunch.slurm.commands import Slurm
from hpclaunch.slurm.env import ContextError, NodeContext, parse_topology

if TYPE_CHECKING:  # the module is imported when a zygote is forked
    from torch.distributed.elastic.agent.server.api import RunResult

    from hpclaunch.node.rank_logs import RankLogs
    from hpclaunch.node.recording_agent import OnFailure, StartProcesses
    from hpclaunch.node.warmstart.zygote import Zygote

log = logging.getLogger(__name__)


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
    ctx: NodeContext, opts: AgentSettings, master_addr: str, *, start: bool = True
) -> tuple[AgentSettings, Any]:
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
        binary = opts.etcd_binary
        server = sidecar.Sidecar.start(binary, name, ip, ports, guard)
        endpoint = server.endpoint
    else:
        endpoint = sidecar.find(ip, name, ports)
    # Found: from here on the agent sees an etcd of its own at that endpoint.
    return dataclasses.replace(opts, etcd_endpoints=(endpoint,), etcd_sidecar=False), server


def job_folder(ctx: NodeContext, opts: AgentSettings, env: Mapping[str, str]) -> Path:
    """The job folder the per-rank logs go under: --job-dir, else the environment's
    (see hpclaunch.jobdir.layout.JobFolder.from_env)."""
    return opts.job_dir if opts.job_dir is not None else JobFolder.from_env(env, ctx.job_id).root


def check_job_folder(ctx: NodeContext, opts: AgentSettings, env: Mapping[str, str]) -> None:
    """Make the job's logs folder and write a file there, before anything starts: a
    folder this node cannot write is one line, not a traceback from torch's
    log set-up. Raises HpclaunchError."""
    logs = JobFolder(job_folder(ctx, opts, env)).logs
    probe = logs / f".write-test-{ctx.hostname}-{os.getpid()}"
    try:
        modes.make_dirs(logs.parent, modes.folder_mode(env))  # where no script made it
        logs.mkdir(exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise HpclaunchError(
            f"the job folder {logs.parent} cannot be written on {ctx.hostname}: "
            f"{exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}; give a "
            "folder every node can write, on a shared filesystem: hpclaunch sbatch "
            "--log-dir DIR (the job folder is DIR/JOBID), or --job-dir for hpclaunch agent"
        ) from None


def after_run(
    status: int, ctx: NodeContext, opts: AgentSettings, env: Mapping[str, str], slurm: Slurm
) -> int:
    """The exit status of a supervised agent whose run ended with ``status``, noted in
    the job folder for the supervisor (hpclaunch.recovery.stops); when the supervisor
    has stopped answering (or, in a --no-kill job, its batch host is lost), this agent
    may end or requeue the job in its place (hpclaunch.recovery.deputy)."""
    from hpclaunch.jobdir import agent_ends
    from hpclaunch.jobdir.agent_ends import AgentEnd
    from hpclaunch.node.stop_notes import uncaught
    from hpclaunch.node.warmstart.zygote import STEP_SIGNALS
    from hpclaunch.recovery import deputy

    job_dir = job_folder(ctx, opts, env)
    killer = uncaught()
    with stop_signals_ignored():  # a late one would raise here (torch's handlers stay)
        try:
            agent_ends.write(
                JobFolder(job_dir),
                ctx.restart_count,
                AgentEnd(ctx.hostname, status, killer.name if killer is not None else None),
            )
        except OSError as exc:  # the supervisor does without it (srun's status says it)
            note = JobFolder(job_dir).agent_end(ctx.restart_count, ctx.hostname)
            said = "the supervisor does without it"
            log.warning("%s", unwritten.line("this agent's end note", note, exc, said))
        status = deputy.after_agent(
            status,
            job_id=ctx.job_id,
            requeue=ctx.restart_count,
            node=ctx.hostname,
            job_dir=job_dir,
            slurm=slurm,
            env=env,
            no_kill=opts.no_kill,
        )
    # Done: SLURM's SIGTERM from here on (the step ending, a deputy that ended the job)
    # would only raise torch's exception in the interpreter's teardown, a traceback in
    # the batch log.
    if threading.current_thread() is threading.main_thread():
        for sig in STEP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    return status


def context(env: Mapping[str, str], opts: AgentSettings, slurm: Slurm) -> NodeContext:
    """This node's context, in the asked rank order."""
    ctx = NodeContext.from_env(
        env, nproc_per_node=opts.nproc_per_node, master_port=opts.master_port
    )
    if opts.rank_order is RankOrder.TOPOLOGY:
        ctx = ctx.ordered(RankOrder.TOPOLOGY, parse_topology(slurm.topology()))
    return ctx


def launch(
    ctx: NodeContext,
    opts: AgentSettings,
    settings: LaunchPlan,
    env: Mapping[str, str],
    helpers: Collection[int] = (),
) -> int:
    """Run the workers through torch's elastic agent; return the exit status.

    What the workers start ends with their group (see hpclaunch.node.sweep), except
    ``helpers``: the pids of this process's children that run in sessions of their
    own and serve the whole job (the etcd sidecar); each must be named here."""
    key = local_folder.key(ctx, env, os.getuid(), local_folder.own_stamp())
    try:
        local = local_folder.LocalFolder.open(key)
    except HpclaunchError as exc:
        log.error("%s", exc)
        return 1
    sweeper = Sweeper.start(spared=helpers)  # before any worker can leave an orphan
    for stale in local_folder.clear_stale(local.path.parent, key.uid, key.name, key.host):
        log.info("removed the node-local folder %s that no running job holds", stale)
    zygote = _fork_zygote() if starts_warm(opts) else None
    try:
        return _launch(ctx, opts, settings, env, zygote, sweeper, local.path)
    finally:
        if zygote is not None:
            zygote.close()
        # torch has read its workers' status by now: every adopted zombie is reaped.
        sweeper.sweep("as the agent ends", owned=(), final=True)
        # Node-local checkpoint copies serve in-place restarts only: gone with the agent.
        local.close()


def _fork_zygote() -> Zygote | None:
    """The zygote the workers are forked from, or None (then they start fresh)."""
    from hpclaunch.node.warmstart.preload import import_torch_single_threaded

    import_torch_single_threaded()
    from hpclaunch.node.warmstart.zygote import Zygote, ZygoteError

    try:
        return Zygote.fork(handled=_signals(HANDLED_SIGNALS))
    except (ZygoteError, OSError) as exc:
        log.warning("workers start fresh (--worker-start fresh: without this warning): %s", exc)
        return None


def _rendezvous_failed(exc: BaseException, ctx: NodeContext, settings: LaunchPlan) -> int:
    """One line for a rendezvous that failed: a taken port named with its holder."""
    if ports.in_use(exc):
        port = ctx.master_port
        log.error("%s", ports.taken(port, ctx.hosts[0], ports.listeners(port)))
    else:
        log.error(
            "rendezvous %s at %s failed: %s",
            settings.rdzv_backend,
            settings.rdzv_endpoint,
            exc or type(exc).__name__,
        )
    return 1


def _signals(names: str) -> list[signal.Signals]:
    return [signal.Signals[name.strip()] for name in names.split(",")]


def _launch(
    ctx: NodeContext,
    opts: AgentSettings,
    settings: LaunchPlan,
    env: Mapping[str, str],
    zygote: Zygote | None,
    sweeper: Sweeper,
    local: Path,
) -> int:
    # The launcher first: it checks torch's version before torch's internals load.
    from hpclaunch.node.launcher import (
        ChildFailedError,
        DistNetworkError,
        LaunchConfig,
        RendezvousClosedError,
        RendezvousError,
        SignalException,
        run_agent,
    )
    from hpclaunch.node.rank_logs import RankLogs
    from hpclaunch.node.recording_agent import received
    from hpclaunch.rendezvous import etcd_rdzv, ranked_c10d

    ranked_c10d.register()
    etcd_rdzv.register()
    command, args, start = _workers_start(opts, zygote)
    job = job_folder(ctx, opts, env)
    logs = RankLogs(job, ctx.restart_count, ctx.step_id, tee=opts.tee, node=ctx.hostname)
    log.info(
        "%d workers on %s, %d %s in all; rendezvous %s at %s; rank logs in %s",
        ctx.nproc_per_node,
        ctx.hostname,
        ctx.nnodes,
        "node" if ctx.nnodes == 1 else "nodes",
        settings.rdzv_backend,
        settings.rdzv_endpoint,
        logs.root_log_dir,
    )
    watch = _hang_watch(ctx, opts, job, local)
    try:
        run_agent(
            LaunchConfig(**settings.launch_config_kwargs(), logs_specs=logs),
            command,
            args,
            worker_env=lambda attempt: _worker_env(ctx, opts, local, attempt),
            on_failure=_recorder(ctx, job, logs),
            monitor_wait_s=opts.monitor_interval_s,
            start_processes=start,
            sweeper=sweeper,
            hangs=watch,
        )
    except ChildFailedError as exc:
        return _failed_for_good(_root_cause(exc, ctx, opts, logs.folder, watch), ctx, opts, job)
    except RendezvousClosedError:
        log.error(
            "another node's agent closed the rendezvous and ended; its log says why "
            "(a root-cause block when its workers failed)"
        )
        return 1
    except (RendezvousError, DistNetworkError) as exc:  # static makes its store itself
        if isinstance(exc, DistNetworkError) and not ports.in_use(exc):
            raise
        return _rendezvous_failed(exc, ctx, settings)
    except SignalException as exc:
        log.info("stopped by %s", exc.sigval.name)
        return 128 + int(exc.sigval)
    stopped = received()
    if stopped is not None:  # the workers ended (status 0) on a stop signal: not done
        log.info("stopped by %s (the workers ended by themselves)", stopped.name)
        return 128 + int(stopped)
    return 0


def _hang_watch(ctx: NodeContext, opts: AgentSettings, job: Path, local: Path) -> Watch:
    """This node's hang watch (hpclaunch.node.hangs), its files in this agent's
    node-local folder ``local``, beside the node-local checkpoint copies."""
    return Watch(
        local,
        JobFolder(job),
        node=ctx.hostname,
        node_rank=ctx.node_rank,
        requeue=ctx.restart_count,
        timeout=HangTimeout.parse(opts.hang_timeout),
        bounds=Bounds(
            HangTimeout.parse(opts.checkpoint_timeout, TimeoutField.CHECKPOINT),
            HangTimeout.parse(opts.pause_timeout, TimeoutField.PAUSE),
            HangTimeout.parse(opts.first_step_timeout, TimeoutField.FIRST_STEP),
        ),
    )


def _worker_env(ctx: NodeContext, opts: AgentSettings, local: Path, attempt: int) -> dict[str, str]:
    """hpclaunch's part of the workers' environment for ``attempt``, and what frameworks
    need to be distributed on this node (hpclaunch.contract.worker_env.framework_env)."""
    return {
        **worker_env(ctx, opts.rdzv, local, attempt),
        **framework_env(os.environ, _gpu_devices()),
    }


def _gpu_devices() -> list[str]:
    """The node's GPU device files (NVIDIA's, AMD's): whether it has GPUs, without
    touching CUDA in the agent."""
    return sorted(glob.glob("/dev/nvidia[0-9]*")) + (
        ["/dev/kfd"] if os.path.exists("/dev/kfd") else []
    )


def _workers_start(
    opts: AgentSettings, zygote: Zygote | None
) -> tuple[str, tuple[str, ...], StartProcesses | None]:
    """The workers' (entrypoint, args) for torch, and the agent's ``start_processes``
    where the zygote starts them (None: torch's own)."""
    agent_pid, setpriv = os.getpid(), shutil.which("setpriv")
    if zygote is None:
        return (*guarded(worker_command(opts), agent_pid, setpriv), None)
    from hpclaunch.node.warmstart.warm import WarmStart

    fresh = lambda worker: guarded(worker, agent_pid, setpriv)  # noqa: E731
    command, args = launched_as(opts, agent_pid, None)
    return command, args, WarmStart(zygote, fresh, opts.grace_period_s)


def _recorder(ctx: NodeContext, job: Path, logs: RankLogs) -> OnFailure:
    """The agent's ``on_failure``: a failure record of each failed attempt in ``job``;
    returns the one error every worker of this node failed with by itself, if so
    (hpclaunch.node.failfast)."""
    from hpclaunch.node import failfast

    def record(result: RunResult, attempt: int, hung: Mapping[int, str]) -> str | None:
        failed = _failures(result.failures, logs.folder)
        mine = failures.record_of(
            ctx.hostname, ctx.node_rank, ctx.restart_count, attempt, failed, messages=hung
        )
        path = failures.write(job, mine)
        log.info("attempt %d failed; record in %s", attempt, path)
        return failfast.own_error(mine.workers)

    return record


def _failures(by_rank: Mapping[int, Any], folder: AttemptFolder | None) -> list[joblogs.Failure]:
    """torch's ProcessFailures as joblogs.Failure; ``folder`` holds the attempt's logs."""
    return [
        joblogs.Failure(
            rank=rank,
            local_rank=f.local_rank,
            exitcode=f.exitcode,
            pid=f.pid,
            timestamp=f.timestamp,
            error_file=str(folder.rank_file(rank, RankFile.ERROR)) if folder else "",
            stderr_file=str(folder.rank_file(rank, RankFile.ERR)) if folder else "",
        )
        for rank, f in by_rank.items()
    ]


def _root_cause(
    exc: Any, ctx: NodeContext, opts: AgentSettings, folder: AttemptFolder | None, watch: Watch
) -> str:
    """hpclaunch's root-cause block from torch's ChildFailedError; the hang report when
    the last attempt hung (the workers' SIGKILL is not the story then)."""
    hang = watch.last_report
    if hang is not None and hang.attempt == watch.attempt:
        logs = f"\n  rank logs: {folder.path}" if folder is not None else ""
        return f"{hang_block(hang)}{logs}"
    return joblogs.root_cause_block(
        _failures(exc.failures, folder),
        job_id=ctx.job_id,
        host=ctx.hostname,
        node_rank=ctx.node_rank,
        command=worker_command(opts),
    )


def _failed_for_good(block: str, ctx: NodeContext, opts: AgentSettings, job: Path) -> int:
    """The workers failed for good: the root-cause block to the supervisor (which prints
    one for the whole job, from the right node), else printed; the exit status."""
    if opts.supervised:
        try:
            path = failures.write_block(job, ctx.restart_count, ctx.hostname, block)
        except OSError as exc:  # the supervisor cannot print it: this log has it
            what = "the root-cause block into"
            log.error(
                "workers failed for good; %s",
                unwritten.line(what, job / "failures", exc, "it follows here instead"),
            )
        else:
            log.error("workers failed for good; root-cause block in %s", path)
            return 1
    print(block, file=sys.stderr, flush=True)
    return 1
