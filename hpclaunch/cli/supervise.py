"""``hpclaunch supervise``: the batch step the rendered script runs. Its options are
generated from the supervisor's settings table (hpclaunch.contract.supervisor)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

import click

from hpclaunch.cli.context import CliContext, fail, settings_options
from hpclaunch.contract.supervisor import SupervisorSettings
from hpclaunch.errors import ExitCode, HpclaunchError


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@settings_options(SupervisorSettings)
@click.argument("step", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def supervise(obj: CliContext, /, step: tuple[str, ...], values: Mapping[str, Any]) -> None:
    """Run STEP (the srun line) as the batch step, passing SLURM's signals on.

    Used by the rendered sbatch script. After SLURM's time-limit warning (USR1 or
    USR2) it requeues the job once the step has ended (exit status 0, or 4 when
    --max-requeues is spent); otherwise it exits with STEP's status.
    """
    from hpclaunch.contract.table import from_values
    from hpclaunch.recovery.supervisor import supervise as run_supervised

    settings = from_values(SupervisorSettings, values)
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
            step,
            env=obj.env,
            slurm=obj.slurm,
            job_dir=settings.job_dir,
            max_requeues=settings.max_requeues,
            grace_s=settings.grace_period_s,
            max_failure_requeues=settings.max_failure_requeues,
            adopt_checkpoints=settings.adopt_checkpoints,
            slurm_patience_s=settings.slurm_patience_s,
            watch_timeout_s=settings.watch_timeout_s,
            checkpoint_patterns=settings.checkpoint_patterns,
        )
    except HpclaunchError as exc:
        fail(exc)
    sys.exit(status)
