"""The ``hpclaunch`` command: a thin click layer over the library.

It parses flags, turns library errors into messages and exit codes, and never
imports torch (the login node must answer in a fraction of a second).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import click

from hpclaunch import __version__
from hpclaunch.errors import ExitCode, HpclaunchError, SpecError
from hpclaunch.job.spec import (
    DEFAULT_GRACE_PERIOD_S,
    DEFAULT_LOG_DIR,
    DEFAULT_MAX_FAILURE_REQUEUES,
    DEFAULT_MAX_REQUEUES,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_SIGNAL_LEAD_S,
    DEFAULT_SUPERVISOR_GRACE_S,
    EntryKind,
    Rendezvous,
    WorkerStart,
)
from hpclaunch.rendezvous.etcd.access import EtcdFlags
from hpclaunch.slurm.commands import Slurm


@dataclass
class CliContext:
    """What commands need from the outside world; tests pass their own."""

    slurm: Slurm = field(default_factory=Slurm)
    cwd: Path = field(default_factory=Path.cwd)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def fail(exc: HpclaunchError) -> NoReturn:
    """Print ``exc`` as the one error paragraph and exit with its code."""
    click.echo(f"Error: {exc}", err=True)
    sys.exit(int(exc.exit_code))


def _refuse_option_as_script(script: str) -> None:
    """ignore_unknown_options (which lets SCRIPT's own options through) would also
    take a mistyped hpclaunch option for SCRIPT: report it as click would."""
    if script.startswith("-") and script != "-":
        ctx = click.get_current_context()
        known = [opt for param in ctx.command.params for opt in param.opts]
        raise click.NoSuchOption(script.split("=")[0], possibilities=known, ctx=ctx)


def _entry_kind(module: bool, no_python: bool) -> EntryKind:
    """What SCRIPT is, from -m/--module and --no-python (exits 2 when both are given)."""
    if module and no_python:
        fail(SpecError("module", "-m/--module and --no-python exclude each other; give one"))
    return EntryKind.MODULE if module else EntryKind.EXECUTABLE if no_python else EntryKind.SCRIPT


class _BadValue(click.BadParameter):
    """A bad flag value: one ``Error:`` paragraph, like every other hpclaunch error
    (click's default would add the usage lines first)."""

    def show(self, file: Any = None) -> None:
        click.echo(f"Error: {self.format_message()}", err=True)


class _SpecParam(click.ParamType):  # type: ignore[type-arg]
    """A flag value parsed by one of hpclaunch.job.spec's parsers."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self._parse(value)
        except SpecError as exc:
            raise _BadValue(exc.message, ctx, param) from None


def _types() -> dict[str, _SpecParam]:
    from hpclaunch.job import values

    return {
        "nodes": _SpecParam("N|MIN:MAX", values.parse_nodes),
        "time": _SpecParam("TIME", values.parse_time),
        "mem": _SpecParam("SIZE", values.parse_mem),
        "env": _SpecParam("KEY=VALUE", values.parse_env),
        "option": _SpecParam("KEY[=VALUE]", values.parse_sbatch_option),
        "endpoints": _SpecParam("HOST:PORT[,...]", values.parse_endpoints),
    }


_T = _types()


def _etcd_access_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """TLS and user options for an etcd of your own, shared by sbatch and agent.
    No password option: it would land in the script and in ps."""
    options = [
        click.option(
            "--etcd-binary", help="The etcd server for --etcd-sidecar. [default: etcd on PATH]"
        ),
        click.option("--etcd-cacert", help="CA certificate of the etcd server (turns on TLS)."),
        click.option("--etcd-cert", help="Client certificate for etcd (with --etcd-key)."),
        click.option("--etcd-key", help="Client certificate key for etcd."),
        click.option("--etcd-user", help="etcd user; the password comes from --etcd-password-file "
                     "or $HPCLAUNCH_ETCD_PASSWORD."),
        click.option("--etcd-password-file", help="File whose first line is the etcd password."),
    ]  # fmt: skip
    for option in reversed(options):
        fn = option(fn)
    return fn


class _Commands(click.Group):
    """The group, importing the commands that live in other modules only when used,
    so that ``hpclaunch sbatch`` does not pay for them."""

    LAZY: Mapping[str, tuple[str, str]] = {
        "cancel": ("hpclaunch.cli.jobs", "cancel"),
        "list": ("hpclaunch.cli.jobs", "list_jobs"),
        "logs": ("hpclaunch.cli.jobs", "logs"),
        "sandbox": ("hpclaunch.sandbox.cli", "sandbox"),
        "status": ("hpclaunch.cli.jobs", "status"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY:
            import importlib

            module, name = self.LAZY[cmd_name]
            command: click.Command = getattr(importlib.import_module(module), name)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpclaunch")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Launch distributed PyTorch jobs on SLURM: render, submit, supervise."""
    logging.basicConfig(level=logging.WARNING, format="hpclaunch: %(message)s")
    if ctx.obj is None:
        ctx.obj = CliContext()


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--nodes", type=_T["nodes"], help="Node count N, or MIN:MAX for an elastic job. [default: 1]"
)
@click.option("--gpus-per-node", type=int, help="GPUs per node; 0 for a CPU job. [default: 0]")
@click.option("--nproc-per-node", type=int, help="Workers per node. [default: GPUs per node, or 1]")
@click.option(
    "--time",
    "time_limit",
    type=_T["time"],
    help="Time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED.",
)
@click.option("--partition", help="SLURM partition.")
@click.option("--account", help="SLURM account to charge.")
@click.option("--qos", help="SLURM quality of service.")
@click.option("--constraint", help="Node features the job needs (SLURM --constraint).")
@click.option("--exclude", help="Nodes to keep the job off (a SLURM hostlist).")
@click.option("--mem", type=_T["mem"], help="Memory per node, e.g. 64G (0: all of it).")
@click.option("--cpus-per-task", type=int, help="CPUs for each node's agent and its workers.")
@click.option("--job-name", help="Job name. [default: the script's name]")
@click.option(
    "--log-dir",
    help=f"Folder for logs (%x-%j.out) and job folders. [default: {DEFAULT_LOG_DIR}]",
)
@click.option(
    "--checkpoint-dir",
    help="HPCLAUNCH_CHECKPOINT_DIR for workers. [default: LOG_DIR/JOBID/checkpoints]",
)
@click.option(
    "--max-restarts",
    type=int,
    help=f"In-place worker-group restarts per node. [default: {DEFAULT_MAX_RESTARTS}]",
)
@click.option(
    "--max-requeues",
    type=int,
    help=f"Requeue budget given to the batch-step supervisor. [default: {DEFAULT_MAX_REQUEUES}]",
)
@click.option(
    "--signal-lead",
    "signal_lead_s",
    type=int,
    help="Seconds before the time limit that SLURM warns the job (USR1). "
    f"[default: {DEFAULT_SIGNAL_LEAD_S}]",
)
@click.option(
    "--rdzv",
    type=click.Choice(["static", "c10d", "etcd"]),
    help=f"Rendezvous backend. [default: {Rendezvous.C10D.value}]",
)
@click.option(
    "--etcd-endpoint",
    "etcd_endpoints",
    type=_T["endpoints"],
    help="etcd endpoints HOST:PORT[,HOST:PORT...] for --rdzv etcd.",
)
@click.option(
    "--etcd-sidecar",
    is_flag=True,
    default=None,
    help="Start an etcd server on the first node for --rdzv etcd.",
)
@_etcd_access_options
@click.option(
    "--no-kill",
    is_flag=True,
    default=None,
    help="Keep the job when a node is lost; with --nodes MIN:MAX it goes on on fewer nodes.",
)
@click.option(
    "--node-multiple",
    type=int,
    help="Keep the node count a multiple of K (a data-parallel degree); "
    "nodes beyond it stand by. [default: 1]",
)
@click.option(
    "--template",
    type=click.Path(dir_okay=False),
    help="A Jinja template to render instead of the built-in one.",
)
@click.option(
    "--profile",
    help="Profile from ./hpclaunch.toml or ~/.config/hpclaunch/config.toml. "
    "[default: 'default' if defined]",
)
@click.option(
    "--sbatch-option",
    "sbatch_options",
    type=_T["option"],
    multiple=True,
    help="Extra #SBATCH option KEY=VALUE or KEY (repeatable).",
)
@click.option(
    "--srun-option",
    "srun_options",
    type=_T["option"],
    multiple=True,
    help="Extra srun option KEY=VALUE or KEY for the agent step (repeatable).",
)
@click.option(
    "--setup",
    multiple=True,
    help="A shell line run before the launch, as written: module loads, venv activation "
    "(repeatable).",
)
@click.option(
    "--env",
    type=_T["env"],
    multiple=True,
    help="Environment variable KEY=VALUE for the job (repeatable).",
)
@click.option(
    "-m", "--module", is_flag=True, help="SCRIPT is a Python module name, run as python -m."
)
@click.option("--no-python", is_flag=True, help="SCRIPT is an executable, run without python.")
@click.option("--dry-run", is_flag=True, help="Print the script; submit nothing.")
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"job_id": ..., "script": ...} as JSON.'
)
@click.option(
    "--follow",
    "follow_job",
    is_flag=True,
    help="After submitting, print the job's state changes, requeues, restarts and "
    "checkpoints on stderr until it ends; exit with the job's status.",
)
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def sbatch(
    obj: CliContext,
    /,
    script: str,
    args: tuple[str, ...],
    profile: str | None,
    module: bool,
    no_python: bool,
    dry_run: bool,
    as_json: bool,
    follow_job: bool,
    **flags: Any,
) -> None:
    """Render an sbatch script for SCRIPT [ARGS]... and submit it.

    One agent runs per node and starts the workers; everything after SCRIPT
    is passed to the training command unchanged. Without --dry-run, prints
    the job id alone on stdout.
    """
    from hpclaunch.job.profiles import Entry, build_spec, load_profile
    from hpclaunch.job.render import render

    _refuse_option_as_script(script)
    if follow_job and dry_run:
        raise click.UsageError("--follow follows a submitted job; --dry-run submits none")
    kind = _entry_kind(module, no_python)
    if flags["rdzv"] is not None:
        flags["rdzv"] = Rendezvous(flags["rdzv"])
    if flags["template"] is not None:
        flags["template"] = str(obj.cwd / flags["template"])
    try:
        spec = build_spec(
            Entry(script, args, kind),
            flags,
            load_profile(profile, obj.cwd, obj.env),
        )
        if kind is EntryKind.SCRIPT and not (obj.cwd / script).is_file():
            raise SpecError(
                "script",
                f"training script {script!r} (from SCRIPT) is not a file in {obj.cwd}; "
                "check the path, or use -m for a module or --no-python for an executable",
            )
        text = render(spec)
        if dry_run:
            submission = None
        else:
            from hpclaunch.slurm.submit import submit

            submission = submit(text, obj.cwd / spec.log_dir, obj.slurm, cwd=obj.cwd)
            _note_job(obj, submission, spec.effective_job_name)
    except HpclaunchError as exc:
        fail(exc)
    if as_json:
        payload = {
            "job_id": submission.job_id if submission else None,
            "cluster": submission.cluster if submission else None,
            "script_path": str(submission.script_path) if submission else None,
            "script": text,
        }
        click.echo(json.dumps(payload, indent=2))
    elif submission is None:
        click.echo(text, nl=False)
    else:
        click.echo(submission.job_id)
    if follow_job and submission is not None:
        from hpclaunch.cli.jobs import follow_job as follow

        sys.stdout.flush()
        sys.exit(follow(obj, submission.job_id, submission.job_dir))


def _note_job(obj: CliContext, submission: Any, name: str) -> None:
    """Add the job to this user's job list (for status, logs, cancel, list); the
    job is submitted either way, so a failure here is a warning."""
    import time

    from hpclaunch.ops import registry

    entry = registry.Entry(
        submission.job_id, str(submission.job_dir.absolute()), name, time.time(),
        submission.cluster, str(obj.cwd),
    )  # fmt: skip
    try:
        registry.add(obj.env, entry)
    except OSError as exc:
        click.echo(
            f"hpclaunch: warning: job {submission.job_id} was submitted, but could not be "
            f"added to {registry.path(obj.env)} ({exc.strerror or exc}); give "
            f"`hpclaunch status` --job-dir {submission.job_dir}",
            err=True,
        )


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--max-requeues",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Requeue budget of the job: requeues after it give up (exit status 4).",
)
@click.option(
    "--job-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The job's folder: history.json goes there.",
)
@click.option(
    "--grace-period",
    type=click.FloatRange(min=0),
    default=DEFAULT_SUPERVISOR_GRACE_S,
    show_default=True,
    help="Seconds the step gets to end after a signal before srun is killed.",
)
@click.option(
    "--max-failure-requeues",
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_FAILURE_REQUEUES,
    show_default=True,
    help="Requeues without bad nodes the job gets (preemptions and time limits do not count).",
)
@click.argument("step", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def supervise(
    obj: CliContext, /, max_requeues: int, job_dir: Path | None, grace_period: float,
    max_failure_requeues: int, step: tuple[str, ...],
) -> None:  # fmt: skip
    """Run STEP (the srun line) as the batch step, passing SLURM's signals on.

    Used by the rendered sbatch script. After SLURM's time-limit warning (USR1 or
    USR2) it requeues the job once the step has ended (exit status 0, or 4 when
    --max-requeues is spent); otherwise it exits with STEP's status.
    """
    from hpclaunch.recovery.supervisor import supervise as run_supervised

    job = obj.env.get("SLURM_JOB_ID")
    if not job or not job.isdigit():
        click.echo(
            f"Error: SLURM_JOB_ID={job!r}: hpclaunch supervise runs as a job's batch step "
            "(the rendered script calls it)",
            err=True,
        )
        sys.exit(int(ExitCode.USAGE))
    logging.basicConfig(level=logging.INFO, format=f"hpclaunch[job {job}]: %(message)s", force=True)
    try:
        status = run_supervised(
            step, env=obj.env, slurm=obj.slurm, job_dir=job_dir, max_requeues=max_requeues,
            grace_s=grace_period, max_failure_requeues=max_failure_requeues,
        )  # fmt: skip
    except HpclaunchError as exc:
        fail(exc)
    sys.exit(status)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--nnodes", type=_T["nodes"], help="N or MIN:MAX nodes. [default: the step's]")
@click.option(
    "--nproc-per-node",
    type=int,
    help="Workers on this node. "
    "[default: SLURM_GPUS_ON_NODE, else CUDA_VISIBLE_DEVICES' count, else 1]",
)
@click.option(
    "--rdzv",
    type=click.Choice(["static", "c10d", "etcd"]),
    default="c10d",
    show_default=True,
    help="Rendezvous backend: static (fixed ranks from SLURM), c10d (a store on the first "
    "node) or etcd.",
)
@click.option(
    "--etcd-endpoint",
    "etcd_endpoints",
    type=_T["endpoints"],
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
@_etcd_access_options
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
    from hpclaunch.jobdir import joblogs
    from hpclaunch.node import agent as node_agent
    from hpclaunch.slurm.env import RankOrder

    _refuse_option_as_script(script)
    kind = _entry_kind(module, no_python)
    opts = node_agent.AgentOptions(
        entrypoint=script, args=args, entry_kind=kind, nnodes=nnodes,
        nproc_per_node=nproc_per_node, rdzv=Rendezvous(rdzv), max_restarts=max_restarts,
        master_addr=master_addr, master_port=master_port, rank_order=RankOrder(rank_order),
        job_dir=job_dir, tee=tee, grace_period_s=grace_period, node_multiple=node_multiple,
        worker_start=WorkerStart(worker_start),
        etcd=EtcdFlags(
            endpoints=etcd.pop("etcd_endpoints") or (), sidecar=etcd.pop("etcd_sidecar"),
            **{k.removeprefix("etcd_"): v for k, v in etcd.items()},
        ),
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
        if opts.etcd.sidecar:
            opts, sidecar = node_agent.etcd_sidecar(ctx, opts, master, start=not dry_run)
        settings = node_agent.launch_settings(ctx, opts, master, local)
    except HpclaunchError as exc:
        if sidecar is not None:
            sidecar.stop()
        fail(exc)
    if dry_run:
        launcher, launcher_args = node_agent.launched_as(opts, os.getpid(), shutil.which("setpriv"))
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
            "rank_logs": str(joblogs.attempt_dir(
                node_agent.job_folder(ctx, opts, obj.env), ctx.restart_count, ctx.step_id, 0
            )),
            "worker_command": list(node_agent.worker_command(opts)),
            "launched_as": [launcher, *launcher_args],
            "worker_start": "warm" if node_agent.starts_warm(opts) else "fresh",
            "worker_env": node_agent.worker_env(ctx, opts.rdzv),
        }  # fmt: skip
        click.echo(json.dumps(payload, indent=2))
        return
    try:
        status = node_agent.launch(ctx, opts, settings, obj.env)
    finally:
        if sidecar is not None:
            sidecar.stop()
    sys.exit(status)
