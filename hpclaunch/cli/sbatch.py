"""``hpclaunch sbatch``: flags and profile -> JobSpec -> script -> sbatch."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from hpclaunch.cli.context import (
    TYPES,
    CliContext,
    entry_kind,
    etcd_access_options,
    fail,
)
from hpclaunch.cli.spellings import (
    ARRAY_REFUSED,
    SBATCH_REFUSED,
    ScriptCommand,
    check_script,
    with_dependency,
)
from hpclaunch.contract import rendezvous
from hpclaunch.contract.agent import DEFAULT_MAX_RESTARTS, EntryKind
from hpclaunch.contract.supervisor import (
    DEFAULT_MAX_FAILURE_REQUEUES,
    DEFAULT_MAX_REQUEUES,
    DEFAULT_SLURM_PATIENCE_S,
    DEFAULT_WATCH_TIMEOUT_S,
    MIN_WATCH_TIMEOUT_S,
)
from hpclaunch.contract.values import (
    HANG_FLOOR_S,
    HANG_MULTIPLE,
    LOAD_MULTIPLE,
    PAUSE_S,
    STRETCH_FLOOR_S,
    STRETCH_MULTIPLE,
    UNSEEN_SAVE_S,
)
from hpclaunch.contract.worker_env import DEFAULT_LOG_DIR
from hpclaunch.errors import HpclaunchError, SpecError
from hpclaunch.job.spec import DEFAULT_SIGNAL_LEAD_S, JobSpec

if TYPE_CHECKING:
    from pathlib import Path

    from hpclaunch.job.profiles import Resolved
    from hpclaunch.slurm.submit import Submission

# The training command config show's job has when no SCRIPT is named.
NO_SCRIPT = "SCRIPT"


@click.command(
    cls=ScriptCommand,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--nodes",
    "--nnodes",
    "-N",
    "nodes",
    type=TYPES["nodes"],
    help="Node count N, or MIN:MAX for an elastic job. [default: 1]",
)
@click.option("--gpus-per-node", type=int, help="GPUs per node; 0 for a CPU job. [default: 0]")
@click.option(
    "--nproc-per-node",
    "--nproc_per_node",
    "nproc_per_node",
    type=int,
    help="Workers per node. [default: GPUs per node, or 1]",
)
@click.option(
    "--time",
    "-t",
    "time_limit",
    type=TYPES["time"],
    help="Time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED.",
)
@click.option("--partition", "-p", "partition", help="SLURM partition.")
@click.option("--account", "-A", "account", help="SLURM account to charge.")
@click.option("--qos", "-q", "qos", help="SLURM quality of service.")
@click.option(
    "--constraint", "-C", "constraint", help="Node features the job needs (SLURM --constraint)."
)
@click.option("--exclude", "-x", "exclude", help="Nodes to keep the job off (a SLURM hostlist).")
@click.option(
    "--dependency",
    "-d",
    "dependency",
    type=TYPES["dependency"],
    help="Start only when SLURM's dependency SPEC holds, e.g. afterok:1234 (sbatch --dependency).",
)
@click.option(
    "--after",
    "after",
    metavar="JOBID",
    type=int,
    multiple=True,
    help="Start only after job JOBID has completed successfully, requeues included "
    "(afterok; repeatable).",
)
@click.option("--mem", type=TYPES["mem"], help="Memory per node, e.g. 64G (0: all of it).")
@click.option(
    "--cpus-per-task",
    "-c",
    "cpus_per_task",
    type=int,
    help="CPUs for each node's agent and its workers.",
)
@click.option("--job-name", "-J", "job_name", help="Job name. [default: the script's name]")
@click.option(
    "--log-dir",
    help=f"Folder for logs (%x-%j.out) and job folders. [default: {DEFAULT_LOG_DIR}]",
)
@click.option(
    "--checkpoint-dir",
    help="HPCLAUNCH_CHECKPOINT_DIR for workers. [default: LOG_DIR/JOBID/checkpoints]",
)
@click.option(
    "--adopt-checkpoints",
    is_flag=True,
    default=None,
    help="Continue from the checkpoints an ended job left in --checkpoint-dir "
    "(without it, such a folder is refused).",
)
@click.option(
    "--checkpoint-pattern",
    "checkpoint_patterns",
    metavar="GLOB",
    multiple=True,
    help="A glob naming checkpoints the job writes its own way (relative: to the submit "
    "folder; ** for any folders), for `hpclaunch status` (repeatable).",
)
@click.option(
    "--max-restarts",
    "--max_restarts",
    "max_restarts",
    type=int,
    help=f"In-place worker-group restarts per node. [default: {DEFAULT_MAX_RESTARTS}]",
)
@click.option(
    "--hang-timeout",
    type=TYPES["hang_timeout"],
    help="Seconds without training progress (optimizer steps, hpclaunch.progress.beat) "
    "after which the workers count as hung: their stacks are saved and they restart in "
    f"place; auto: {HANG_MULTIPLE:g} x the slowest step, at least {HANG_FLOOR_S:g} s; off. "
    "[default: auto]",
)
@click.option(
    "--checkpoint-timeout",
    type=TYPES["checkpoint_timeout"],
    help="Seconds a save or load through hpclaunch.checkpoint may take before the workers "
    f"count as hung (as after --hang-timeout); auto: {STRETCH_MULTIPLE:g} x the job's slowest "
    f"recent save ({LOAD_MULTIPLE:g} x for a load), at least {STRETCH_FLOOR_S:g} s "
    f"({UNSEEN_SAVE_S:g} s before any save, doubled for each attempt cut in one); off. "
    "[default: auto]",
)
@click.option(
    "--pause-timeout",
    type=TYPES["pause_timeout"],
    help="Seconds a pause of the script (hpclaunch.progress.paused) may last before the "
    f"workers count as hung; auto: {PAUSE_S:g} s; off. [default: auto]",
)
@click.option(
    "--first-step-timeout",
    type=TYPES["first_step_timeout"],
    help="Seconds from an attempt's start to its first step before the workers count as "
    f"hung; auto: on a node that stepped in an earlier attempt, {STRETCH_MULTIPLE:g} x the "
    f"longest an earlier attempt took, at least {STRETCH_FLOOR_S:g} s and a load's bound "
    "(a job's first start is not watched); off. [default: auto]",
)
@click.option(
    "--max-requeues",
    type=int,
    help=f"Requeue budget given to the batch-step supervisor. [default: {DEFAULT_MAX_REQUEUES}]",
)
@click.option(
    "--max-failure-requeues",
    type=int,
    help="Requeues without bad nodes the job gets (preemptions and time limits do not "
    f"count). [default: {DEFAULT_MAX_FAILURE_REQUEUES}]",
)
@click.option(
    "--signal-lead",
    "signal_lead_s",
    type=int,
    help="Seconds before the time limit that SLURM warns the job (USR1). "
    f"[default: {DEFAULT_SIGNAL_LEAD_S}]",
)
@click.option(
    "--slurm-patience",
    "slurm_patience_s",
    type=int,
    help="Seconds the supervisor keeps trying an unreachable SLURM controller after a "
    f"failed step (after a signal: until the time limit). [default: {DEFAULT_SLURM_PATIENCE_S}]",
)
@click.option(
    "--watch-timeout",
    "watch_timeout_s",
    type=int,
    help="Seconds after which a stopped srun, an agent that stopped noting progress, or a "
    "supervisor that stopped answering is acted on (at least "
    f"{MIN_WATCH_TIMEOUT_S}). [default: {DEFAULT_WATCH_TIMEOUT_S}]",
)
@click.option(
    "--rdzv",
    type=click.Choice(list(rendezvous.BACKENDS)),
    help=f"Rendezvous backend. [default: {rendezvous.DEFAULT.name}]",
)
@click.option(
    "--etcd-endpoint",
    type=TYPES["endpoints"],
    help="etcd endpoints HOST:PORT[,HOST:PORT...] for --rdzv etcd.",
)
@click.option(
    "--etcd-sidecar",
    is_flag=True,
    default=None,
    help="Start an etcd server on the first node for --rdzv etcd.",
)
@etcd_access_options
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
    "--master-port",
    "--master_port",
    "master_port",
    type=int,
    help="The rendezvous port on the first node, for a port that is taken or a firewall. "
    "[default: 15000 + job id % 10000]",
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
    type=TYPES["option"],
    multiple=True,
    help="Extra #SBATCH option KEY=VALUE or KEY (repeatable).",
)
@click.option(
    "--srun-option",
    "srun_options",
    type=TYPES["option"],
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
    type=TYPES["env"],
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
    check_script(script, args, SBATCH_REFUSED)
    if follow_job and dry_run:
        raise click.UsageError("--follow follows a submitted job; --dry-run submits none")
    kind = entry_kind(module, no_python)
    try:
        text, submission = _submit(obj, _spec(obj, script, args, kind, profile, flags), dry_run)
    except HpclaunchError as exc:
        fail(exc)
    if as_json:
        click.echo(_answer(text, submission))
    else:
        click.echo(submission.job_id if submission else text, nl=submission is not None)
    if follow_job and submission is not None:
        from hpclaunch.cli.jobs import follow_job as follow

        sys.stdout.flush()
        sys.exit(follow(obj, submission.job_id, submission.job_dir))


def _spec(
    obj: CliContext,
    script: str,
    args: tuple[str, ...],
    kind: EntryKind,
    profile: str | None,
    flags: dict[str, Any],
) -> JobSpec:
    """The job the flags and the profile describe. Raises SpecError or ConfigError."""
    return resolve_job(obj, script, args, kind, profile, flags).spec


def resolve_job(
    obj: CliContext,
    script: str | None,
    args: tuple[str, ...],
    kind: EntryKind,
    profile: str | None,
    flags: dict[str, Any],
) -> Resolved:
    """The job the flags and the profile describe, with each value's source: what
    ``hpclaunch sbatch`` submits and ``hpclaunch config show`` prints. Without a
    ``script`` (config show), a placeholder stands in and no file is looked for.
    Raises SpecError or ConfigError."""
    from hpclaunch.job.profiles import Entry, load_profile, resolve
    from hpclaunch.job.values import folder_pattern

    flags["sbatch_options"] = with_dependency(flags)
    if flags["template"] is not None:
        flags["template"] = str(obj.cwd / flags["template"])
    entry = Entry(script or NO_SCRIPT, args, kind)
    done = resolve(entry, flags, load_profile(profile, obj.cwd, obj.env))
    if any(key in ("array", "a") for key, _ in done.spec.sbatch_options):
        raise SpecError(
            "sbatch_options",
            f"--sbatch-option array (or a profile's sbatch_options): {ARRAY_REFUSED}",
        )
    if script is not None and kind is EntryKind.SCRIPT and not (obj.cwd / script).is_file():
        raise SpecError(
            "script",
            f"training script {script!r} (from SCRIPT) is not a file in {obj.cwd}; "
            "check the path, or use -m for a module or --no-python for an executable",
        )
    _check_path_lengths(done, obj.cwd)
    if done.spec.checkpoint_patterns:  # the patterns' reader loads only for a job with some
        from hpclaunch.jobdir.found_checkpoints import has_wildcard

        for pattern in done.spec.checkpoint_patterns:
            if not has_wildcard(pattern) and (obj.cwd / pattern).is_dir():
                raise SpecError(
                    "checkpoint_patterns", f"--checkpoint-pattern: {folder_pattern(pattern)}"
                )
    return done


def _check_path_lengths(done: Resolved, cwd: Path) -> None:
    """The log and checkpoint folders' whole paths, from the submit folder, against
    PATH_MAX (hpclaunch.job.paths). Raises SpecError saying where the value came from."""
    from hpclaunch.job.paths import check_lengths

    try:
        check_lengths(done.spec.log_dir, done.spec.checkpoint_dir, cwd)
    except SpecError as exc:
        origin = done.origins.get(exc.field)
        where = str(origin) if origin else f"the default --{exc.field.replace('_', '-')}"
        raise SpecError(exc.field, f"{where}: {exc.message}") from None


def _submit(obj: CliContext, spec: JobSpec, dry_run: bool) -> tuple[str, Submission | None]:
    """The script, and unless ``dry_run`` its submission, noted in this user's job list
    (a job that cannot be noted is submitted all the same: a warning says so).
    Raises TemplateError, SlurmError or HpclaunchError."""
    from hpclaunch.job.render import compiled_cache, render

    text = render(spec, compiled=compiled_cache(obj.env))
    if dry_run:
        return text, None
    # Only a submission needs these: --dry-run stays fast on a login node.
    from hpclaunch.cli import configure_logging
    from hpclaunch.jobdir.modes import folder_mode
    from hpclaunch.ops import registry
    from hpclaunch.slurm.submit import submit

    configure_logging()  # a submission may warn (the job list, the checkpoint folder)
    if spec.checkpoint_dir is not None:
        from hpclaunch.checkpoint.claim import check_submit
        from hpclaunch.checkpoint.sharing import CLI, dependency_of

        check_submit(
            obj.cwd / spec.checkpoint_dir,
            adopt=spec.adopt_checkpoints,
            dependency=dependency_of(spec.sbatch_options),
            name=spec.effective_job_name,
            slurm=obj.slurm,
            spell=CLI,
        )
    # The job's own environment decides (hpclaunch.jobdir.modes): this one, and --env.
    mode = folder_mode({**obj.env, **dict(spec.env)})
    done = submit(text, obj.cwd / spec.log_dir, obj.slurm, cwd=obj.cwd, folder_mode=mode)
    problem = registry.note(
        obj.env, done.job_id, done.job_dir, spec.effective_job_name, obj.cwd, done.cluster
    )
    if problem is not None:
        click.echo(
            f"hpclaunch: warning: {problem}; give `hpclaunch status` --job-dir {done.job_dir}",
            err=True,
        )
    return text, done


def _answer(text: str, submission: Submission | None) -> str:
    """``--json``'s object."""
    return json.dumps(
        {
            "job_id": submission.job_id if submission else None,
            "cluster": submission.cluster if submission else None,
            "script_path": str(submission.script_path) if submission else None,
            "script": text,
        },
        indent=2,
    )
