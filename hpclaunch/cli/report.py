"""``hpclaunch report``: the goodput split, the runs' table and the timeline picture."""

from __future__ import annotations

from pathlib import Path

import click

from hpclaunch.cli.context import CliContext, fail
from hpclaunch.cli.jobs import _job_dir_option, _job_id
from hpclaunch.errors import HpclaunchError
from hpclaunch.ops import report
from hpclaunch.ops.status import find


@click.command("report")
@click.argument("job_id", metavar="JOBID")
@_job_dir_option
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also draw the job's timeline into this FILE.png or FILE.svg "
    "(needs pip install 'hpclaunch[report]').",
)
@click.pass_obj
def report_command(obj: CliContext, job_id: str, job_dir: Path | None, output: Path | None) -> None:
    """Print JOBID's goodput (its wall time split into queue, start-up, training,
    checkpoints, lost work, restarts and hangs) and its attempts; draw its timeline."""
    number = _job_id(job_id)
    try:
        if output is not None:
            report.check_output(output)
        status = find(number, obj.slurm, obj.env, job_dir)
        found = status.timeline
        click.echo(report.text(status, found))
        if output is not None:
            if found is None:
                raise report.ReportError(f"job {number} has no run yet: no timeline to draw")
            report.draw(found, output, f"job {number}")
            click.echo(f"timeline: {output}")
    except HpclaunchError as exc:
        fail(exc)
