"""``hpclaunch agent``: one per node, inside the allocation."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from hpclaunch.cli.context import (
    TYPES,
    CliContext,
    entry_kind,
    etcd_access_options,
    fail,
    refuse_option_as_script,
)
from hpclaunch.errors import HpclaunchError
from hpclaunch.job import rendezvous
from hpclaunch.job.spec import DEFAULT_GRACE_PERIOD_S, DEFAULT_MAX_RESTARTS, WorkerStart


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--nnodes", type=TYPES["nodes"], help="N or MIN:MAX nodes. [default: the step's]")
@click.option(
    "--nproc-per-node",
    type=int,
    help="Workers on this node. "
    "[default: SLURM_GPUS_ON_NODE, else CUDA_VISIBLE_DEVICES' count, else 1]",
)
@click.option(
    "--rdzv",
    type=click.Choice(list(rendezvous.BACKENDS)),
    default=rendezvous.DEFAULT.name,
    show_default=True,
    help="Rendezvous backend: static (fixed ranks from SLURM), c10d (a store on the first "
    "node) or etcd.",
)
@click.option(
    "--etcd-endpoint",
    type=TYPES["endpoints"],
    help="etcd endpoints HOST:PORT[,HOST:PORT...] for --rdzv etcd.",
)
@click.option(
    "--etcd-sidecar", is_flag=True, help="The first node starts an etcd server for the job."
)
@click.option(
    "--node-multiple",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Run on a multiple of K nodes; the nodes beyond it stand by as spares.",
)
@etcd_access_options
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_RESTARTS,
    show_default=True,
    help="In-place restarts of this node's worker group.",
)
@click.option(
    "--master-addr", help="Address of the first node. [default: its name, or its NodeAddr]"
)
@click.option(
    "--master-port",
    type=click.IntRange(1, 65535),
    help="Rendezvous port. [default: 15000 + job id % 10000]",
)
@click.option(
    "--rank-order",
    type=click.Choice(["slurm", "topology"]),
    default="slurm",
    show_default=True,
    help="topology: nodes under one leaf switch get consecutive ranks.",
)
@click.option(
    "--job-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Job folder; per-rank logs go to its logs/. "
    "[default: $HPCLAUNCH_JOB_DIR, else hpclaunch-logs/JOBID]",
)
@click.option(
    "--tee/--no-tee",
    default=True,
    show_default=True,
    help="Also copy every rank's output to the agent's, each line prefixed [rankN].",
)
@click.option(
    "--grace-period",
    type=click.IntRange(0),
    default=DEFAULT_GRACE_PERIOD_S,
    show_default=True,
    help="Seconds the workers get to exit after a signal is passed on, before SIGKILL.",
)
@click.option(
    "--worker-start",
    type=click.Choice([start.value for start in WorkerStart]),
    default=WorkerStart.WARM.value,
    show_default=True,
    help="warm: python workers are forked from a copy of the agent that has imported "
    "torch (fast launch and restart); fresh: a new interpreter each, as torchrun does.",
)
@click.option("-m", "--module", is_flag=True, help="SCRIPT is a Python module name.")
@click.option("--no-python", is_flag=True, help="SCRIPT is an executable.")
@click.option("--dry-run", is_flag=True, help="Print the node context and launch settings as JSON.")
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def agent(
    obj: CliContext,
    /,
    script: str,
    args: tuple[str, ...],
    nnodes: Any,
    nproc_per_node: int | None,
    rdzv: str,
    max_restarts: int,
    master_addr: str | None,
    master_port: int | None,
    rank_order: str,
    job_dir: Path | None,
    tee: bool,
    grace_period: int,
    module: bool,
    no_python: bool,
    dry_run: bool,
    node_multiple: int,
    worker_start: str,
    **etcd: Any,
) -> None:
    """Start this node's workers of SCRIPT [ARGS]... through torch's elastic agent.

    Runs inside an allocation, once per node: srun --ntasks-per-node=1 hpclaunch agent ...
    """
    from hpclaunch.jobdir.layout import JobFolder
    from hpclaunch.node import agent as node_agent
    from hpclaunch.node import options
    from hpclaunch.slurm.env import RankOrder

    refuse_option_as_script(script)
    kind = entry_kind(module, no_python)
    try:
        settings_of_rdzv = rendezvous.build(rdzv, etcd, others=True)
    except HpclaunchError as exc:
        fail(exc)
    opts = options.AgentOptions(
        entrypoint=script, args=args, entry_kind=kind, nnodes=nnodes,
        nproc_per_node=nproc_per_node, rdzv=settings_of_rdzv, max_restarts=max_restarts,
        master_addr=master_addr, master_port=master_port, rank_order=RankOrder(rank_order),
        job_dir=job_dir, tee=tee, grace_period_s=grace_period, node_multiple=node_multiple,
        worker_start=WorkerStart(worker_start),
    )  # fmt: skip
    sidecar = None
    try:
        ctx = node_agent.context(obj.env, opts, obj.slurm)
        master = master_addr or node_agent.reachable_addr(ctx.first_host, obj.slurm)
        local = master if ctx.node_rank == 0 else node_agent.reachable_addr(ctx.hostname, obj.slurm)
        if not dry_run:  # from here on the agent logs, the sidecar's start included
            logging.basicConfig(
                level=logging.INFO,
                format=f"hpclaunch[job {ctx.job_id} node {ctx.node_rank}]: %(message)s",
                force=True,
            )
        if isinstance(opts.rdzv, rendezvous.EtcdRdzv) and opts.rdzv.sidecar:
            opts, sidecar = node_agent.etcd_sidecar(ctx, opts, master, start=not dry_run)
        settings = options.launch_settings(ctx, opts, master, local)
    except HpclaunchError as exc:
        if sidecar is not None:
            sidecar.stop()
        fail(exc)
    if dry_run:
        launcher, launcher_args = options.launched_as(opts, os.getpid(), shutil.which("setpriv"))
        payload = {
            "context": {
                "job_id": ctx.job_id, "node_rank": ctx.node_rank, "nnodes": ctx.nnodes,
                "hosts": list(ctx.hosts), "hostname": ctx.hostname,
                "restart_count": ctx.restart_count, "nproc_per_node": ctx.nproc_per_node,
                "nproc_source": ctx.nproc_source, "master_addr": master,
                "master_port": ctx.master_port, "topology_addr": ctx.topology_addr,
                "step_id": ctx.step_id,
            },
            "launch": settings,
            "rank_logs": str(JobFolder(node_agent.job_folder(ctx, opts, obj.env)).attempt(
                ctx.restart_count, ctx.step_id, 0
            ).path),
            "worker_command": list(options.worker_command(opts)),
            "launched_as": [launcher, *launcher_args],
            "worker_start": "warm" if options.starts_warm(opts) else "fresh",
            "worker_env": options.worker_env(ctx, opts.rdzv),
        }  # fmt: skip
        click.echo(json.dumps(payload, indent=2))
        return
    try:
        status = node_agent.launch(ctx, opts, settings, obj.env)
    finally:
        if sidecar is not None:
            sidecar.stop()
    sys.exit(status)
