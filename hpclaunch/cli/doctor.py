"""``hpclaunch doctor``: check this cluster's set-up for hpclaunch jobs."""

from __future__ import annotations

import sys
from typing import Any

import click

from hpclaunch.cli.config import SBATCH_PARAMS
from hpclaunch.cli.context import CliContext, entry_kind, fail
from hpclaunch.errors import HpclaunchError


def _doctor(
    obj: CliContext,
    /,
    profile: str | None,
    module: bool,
    no_python: bool,
    allocate: bool,
    **flags: Any,
) -> None:
    from hpclaunch.cli.sbatch import resolve_job
    from hpclaunch.ops.doctor import Verdict
    from hpclaunch.ops.doctor_probe import run

    try:
        resolved = resolve_job(obj, None, (), entry_kind(module, no_python), profile, flags)
    except HpclaunchError as exc:
        fail(exc)
    problems = 0
    for finding in run(obj.slurm, dict(obj.env), obj.cwd, resolved, allocate):
        click.echo(finding.line())
        problems += finding.verdict is Verdict.PROBLEM
    click.echo(f"{problems} problem{'s' * (problems != 1)} found" if problems else "all good")
    sys.exit(1 if problems else 0)


doctor = click.Command(
    "doctor",
    callback=click.pass_obj(_doctor),
    params=[
        *SBATCH_PARAMS,
        click.Option(
            ["--allocate/--no-allocate"],
            default=True,
            show_default=True,
            help="Run one task on one node (srun, at most a minute's wait) to check "
            "hpclaunch on the nodes' PATH and that they see the log folder.",
        ),
    ],
    help="Check this cluster's set-up for the job these options describe (the options of "
    "`hpclaunch sbatch`, and the profile): SLURM's commands and controller, the partition, "
    "the rendered job script (`sbatch --test-only`, GPU directives included), requeue limits, "
    "hpclaunch on the nodes and a log folder they share. One line per check; exits 1 when a "
    "check finds a problem.",
)
