"""``hpclaunch agent``: one per node, inside the allocation. Its options are
generated from the agent's settings table (hpclaunch.contract.agent.AgentSettings),
the one the rendered script is written from."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from hpclaunch.cli.context import CliContext, fail, settings_options
from hpclaunch.cli.spellings import AGENT_REFUSED, ScriptCommand, check_script
from hpclaunch.contract.agent import AgentSettings
from hpclaunch.errors import HpclaunchError
from hpclaunch.node.torch_version import check_installed_torch

if TYPE_CHECKING:
    from hpclaunch.node.launch_plan import LaunchPlan
    from hpclaunch.slurm.env import NodeContext


@click.command(
    cls=ScriptCommand,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@settings_options(AgentSettings)
@click.option("--dry-run", is_flag=True, help="Print the node context and launch settings as JSON.")
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def agent(
    obj: CliContext,
    /,
    script: str,
    args: tuple[str, ...],
    dry_run: bool,
    values: Mapping[str, Any],
) -> None:
    """Start this node's workers of SCRIPT [ARGS]... through torch's elastic agent.

    Runs inside an allocation, once per node: srun --ntasks-per-node=1 hpclaunch agent ...
    """
    from hpclaunch.contract.table import from_values
    from hpclaunch.node import agent as node_agent
    from hpclaunch.node import launch_plan

    check_script(script, args, AGENT_REFUSED)
    opts = from_values(AgentSettings, values, entrypoint=script, args=args)
    sidecar = None
    try:
        ctx = node_agent.context(obj.env, opts, obj.slurm)
        master = opts.master_addr or node_agent.reachable_addr(ctx.first_host, obj.slurm)
        local = master if ctx.node_rank == 0 else node_agent.reachable_addr(ctx.hostname, obj.slurm)
        if not dry_run:  # from here on the agent logs, the sidecar's start included
            logging.basicConfig(
                level=logging.INFO,
                format=f"hpclaunch[job {ctx.job_id} node {ctx.node_rank}]: %(message)s",
                force=True,
            )
        if not dry_run:  # before the sidecar, the zygote and torch's internals start
            check_installed_torch()
            node_agent.check_job_folder(ctx, opts, obj.env)
        if opts.etcd_sidecar:
            opts, sidecar = node_agent.etcd_sidecar(ctx, opts, master, start=not dry_run)
        plan = launch_plan.launch_settings(ctx, opts, master, local)
    except HpclaunchError as exc:
        if sidecar is not None:
            sidecar.stop()
        fail(exc)
    if dry_run:
        click.echo(json.dumps(_dry_run(obj, ctx, opts, plan, master), indent=2))
        return
    try:
        helpers = (sidecar.proc.pid,) if sidecar is not None else ()
        status = node_agent.launch(ctx, opts, plan, obj.env, helpers)
        if opts.supervised:  # the supervisor reads how each agent ended
            status = node_agent.after_run(status, ctx, opts, obj.env, obj.slurm)
    finally:
        if sidecar is not None:
            sidecar.stop()
    sys.exit(status)


def _dry_run(
    obj: CliContext, ctx: NodeContext, opts: AgentSettings, plan: LaunchPlan, master: str
) -> dict[str, object]:
    """What ``--dry-run`` prints: the node context, the launch plan, the workers."""
    from hpclaunch.jobdir.layout import JobFolder
    from hpclaunch.node import agent as node_agent
    from hpclaunch.node import launch_plan, local_folder

    # The folder the agent would make (without HPCLAUNCH_SUBMITTED it would carry the
    # agent's own process stamp; this process's is shown).
    stamp = local_folder.own_stamp()
    local = local_folder.key(ctx, obj.env, os.getuid(), stamp)
    launcher, launcher_args = launch_plan.launched_as(opts, os.getpid(), shutil.which("setpriv"))
    return {
        "context": {
            "job_id": ctx.job_id,
            "node_rank": ctx.node_rank,
            "nnodes": ctx.nnodes,
            "hosts": list(ctx.hosts),
            "hostname": ctx.hostname,
            "restart_count": ctx.restart_count,
            "nproc_per_node": ctx.nproc_per_node,
            "nproc_source": ctx.nproc_source,
            "master_addr": master,
            "master_port": ctx.master_port,
            "topology_addr": ctx.topology_addr,
            "step_id": ctx.step_id,
        },
        "launch": plan.launch_config_kwargs(),
        "rank_logs": str(
            JobFolder(node_agent.job_folder(ctx, opts, obj.env))
            .attempt(ctx.restart_count, ctx.step_id, 0)
            .path
        ),
        "worker_command": list(launch_plan.worker_command(opts)),
        "launched_as": [launcher, *launcher_args],
        "worker_start": "warm" if launch_plan.starts_warm(opts) else "fresh",
        "worker_env": launch_plan.worker_env(ctx, opts.rdzv, local_folder.path_of(local)),
    }
