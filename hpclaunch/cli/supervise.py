"""``hpclaunch supervise``: the batch step the rendered script runs."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from hpclaunch.cli.context import (
    CliContext,
    fail,
)
from hpclaunch.errors import ExitCode, HpclaunchError
from hpclaunch.job.spec import (
    DEFAULT_MAX_FAILURE_REQUEUES,
    DEFAULT_SUPERVISOR_GRACE_S,
)


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
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
