"""``hpclaunch status``, ``logs``, ``stacks``, ``cancel`` and ``list``: operating
submitted jobs from the login node. The work is in ``hpclaunch.ops``; these parse the
flags, print and pick the exit code. They never import torch."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from hpclaunch.cli.context import CliContext, fail
from hpclaunch.cli.format import jobs_table, render_status
from hpclaunch.errors import HpclaunchError
from hpclaunch.jobdir.hangs import ANSWER_WAIT_S
from hpclaunch.ops import cancel as cancelling
from hpclaunch.ops import follow, listing, registry
from hpclaunch.ops.logs import LogSelection, follow_logs, show
from hpclaunch.ops.status import JobStatus, exit_status, find, gather
from hpclaunch.slurm.hostlist import compress
from hpclaunch.slurm.states import JobState

LIST_DEFAULT = 20


def _job_id(value: str) -> int:
    text = value.strip()
    if not (text.isascii() and text.isdigit()):
        raise click.BadParameter(
            f"{value!r} is not a job id; give the number `hpclaunch sbatch` printed, like "
            "1234 (an array task 1234_5 has a job id of its own: `scontrol show job 1234_5` "
            "shows it as JobId=)"
        )
    return int(text)


def _job_dir_option(fn: Any) -> Any:
    return click.option(
        "--job-dir",
        type=click.Path(path_type=Path, file_okay=False),
        default=None,
        help="The job's folder (LOG_DIR/JOBID), when it is not in this user's job list "
        "and SLURM no longer knows the job.",
    )(fn)


def _looker(obj: CliContext, job_id: int, job_dir: Path | None) -> Callable[[], JobStatus]:
    return lambda: gather(job_id, obj.slurm, obj.env, job_dir)


@click.command()
@click.argument("job_id", metavar="JOBID")
@_job_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
@click.option(
    "--follow",
    "follow_on",
    is_flag=True,
    help="Print each change (state, requeues, restarts, nodes kept out, checkpoints) "
    "until the job ends, then the status; exit with the job's status.",
)
@click.pass_obj
def status(
    obj: CliContext, job_id: str, job_dir: Path | None, as_json: bool, follow_on: bool
) -> None:
    """Show JOBID's state, nodes, requeues, restarts, nodes kept out, last
    checkpoint and, when it failed, the root cause."""
    number = _job_id(job_id)
    try:
        found = find(number, obj.slurm, obj.env, job_dir)
    except HpclaunchError as exc:
        fail(exc)
    code = follow_job(obj, number, job_dir, root_cause=False) if follow_on else None
    if follow_on:  # the status shows the root cause
        found = gather(number, obj.slurm, obj.env, job_dir)
    click.echo(json.dumps(found.to_json(), indent=2) if as_json else render_status(found))
    if code is not None:
        sys.exit(code)


@click.command()
@click.argument("job_id", metavar="JOBID")
@click.option(
    "--rank",
    type=click.IntRange(min=0),
    default=None,
    help="This global rank's output, every attempt in order.",
)
@click.option("--node", default=None, help="The output of every rank that ran on this node.")
@click.option("--err", is_flag=True, help="The ranks' stderr instead of their stdout.")
@click.option(
    "--follow",
    "-f",
    "follow_on",
    is_flag=True,
    help="Keep printing as the job writes, until it ends.",
)
@_job_dir_option
@click.pass_obj
def logs(
    obj: CliContext,
    job_id: str,
    rank: int | None,
    node: str | None,
    err: bool,
    follow_on: bool,
    job_dir: Path | None,
) -> None:
    """Print JOBID's logs: the batch log (the supervisor and every agent), or with
    --rank/--node the workers' own output, across restarts and requeues."""
    number = _job_id(job_id)
    selection = LogSelection(rank, node, err)
    try:
        found = find(number, obj.slurm, obj.env, job_dir)
        if follow_on:
            look = _looker(obj, number, job_dir)
            follow_logs(selection, found, look, _write, lambda line: click.echo(line, err=True))
        else:
            show(selection, found, _write)
    except HpclaunchError as exc:
        fail(exc)
    except BrokenPipeError:  # `hpclaunch logs ... | head`
        sys.stderr.close()  # nothing more to say, and no traceback at exit
        os._exit(0)


def _write(parts: Iterable[str]) -> None:
    for part in parts:
        sys.stdout.write(part)
    sys.stdout.flush()


@click.command()
@click.argument("job_id", metavar="JOBID")
@_job_dir_option
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=ANSWER_WAIT_S,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for every node's agent to answer.",
)
@click.option(
    "--raw",
    is_flag=True,
    help="Each rank's stack as its agent read it (py-spy's "
    "dump, or faulthandler's), in rank order, instead of identical stacks "
    "grouped.",
)
@click.pass_obj
def stacks(obj: CliContext, job_id: str, job_dir: Path | None, timeout_s: float, raw: bool) -> None:
    """Print the live Python stacks of every rank of running job JOBID, each distinct
    stack once with the ranks that share it. Each node's agent reads its own ranks'
    (py-spy where installed, else the workers' faulthandler) when asked through the
    job folder; exits 1 when no node answers within --timeout."""
    number = _job_id(job_id)
    try:
        from hpclaunch.ops import stacks as live  # its stack readers load for this command only

        found = live.ask(number, obj.slurm, obj.env, job_dir, timeout_s)
    except HpclaunchError as exc:
        fail(exc)
    click.echo(live.render(found, raw))


@click.command()
@click.argument("job_id", metavar="JOBID")
@_job_dir_option
@click.pass_obj
def cancel(obj: CliContext, job_id: str, job_dir: Path | None) -> None:
    """End JOBID for good: it is not requeued, whatever signal its supervisor got first."""
    number = _job_id(job_id)
    try:
        done = cancelling.cancel(number, obj.slurm, obj.env, job_dir)
    except HpclaunchError as exc:
        fail(exc)
    where = f" on {compress(done.was.nodes)}" if done.was.nodes else ""
    promise = (
        "it will not be requeued"
        if done.noted
        else "its folder is unknown, so a requeue already under way may still happen"
    )
    click.echo(f"job {number}: cancelled (was {done.was.state or 'unknown'}{where}); {promise}")


@click.command(name="list")
@click.option(
    "--last",
    "-n",
    type=click.IntRange(min=1),
    default=LIST_DEFAULT,
    show_default=True,
    help="How many of the latest submissions to show.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_obj
def list_jobs(obj: CliContext, last: int, as_json: bool) -> None:
    """List this user's latest hpclaunch jobs, newest last, with their state."""
    rows = listing.latest(obj.env, obj.slurm, last)
    if as_json:
        click.echo(json.dumps([asdict(row) for row in rows], indent=2))
    elif not rows:
        click.echo(f"no jobs submitted with hpclaunch sbatch yet ({registry.path(obj.env)})")
    else:
        click.echo(jobs_table(rows))


def follow_job(obj: CliContext, job_id: int, job_dir: Path | None, root_cause: bool = True) -> int:
    """``hpclaunch sbatch --follow``: print each change until the job ends; returns
    the exit status that mirrors the job's."""

    def emit(line: str) -> None:
        click.echo(f"[{time.strftime('%H:%M:%S')}] job {job_id}: {line}", err=True)

    try:
        last = follow.watch(_looker(obj, job_id, job_dir), emit)
    except HpclaunchError as exc:
        fail(exc)
    if root_cause and last.root_cause and last.job_state is not JobState.COMPLETED:
        click.echo(last.root_cause, err=True)
    if root_cause and last.verdict and last.job_state is not JobState.COMPLETED:
        click.echo(f"job {job_id}: {last.verdict}", err=True)
    return exit_status(last)


COMMANDS = (status, logs, stacks, cancel, list_jobs)
