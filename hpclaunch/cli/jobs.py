"""``hpclaunch status``, ``logs``, ``cancel`` and ``list``: operating submitted jobs
from the login node. They read SLURM and the job folder (see
``hpclaunch.ops.status``); they never import torch."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from hpclaunch.errors import ExitCode, HpclaunchError, SlurmError
from hpclaunch.jobdir.layout import JobFolder, RankFile
from hpclaunch.ops import follow, registry
from hpclaunch.ops.status import JobStatus, exit_status, gather
from hpclaunch.slurm.hostlist import compress

LIST_DEFAULT = 20


class JobNotFound(HpclaunchError):
    """Neither SLURM nor the job folder knows the job."""


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


def _look(obj: Any, job_id: int, job_dir: Path | None) -> JobStatus:
    status = gather(job_id, obj.slurm, obj.env, job_dir)
    if status.state is None and status.job_dir is None:
        error = JobNotFound(f"job {job_id} (from JOBID) is unknown: " + "; ".join(status.notes))
        if status.slurm_unreachable:  # not unknown: SLURM could not be asked
            error.exit_code = ExitCode.SLURM
        raise error
    return status


def _fail(exc: HpclaunchError) -> None:
    from hpclaunch.cli.context import fail

    fail(exc)


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


def render_status(status: JobStatus) -> str:
    """The human form of ``hpclaunch status``."""
    name = f" ({status.name})" if status.name else ""
    state = status.state or "unknown"
    if status.state_source == "history":
        state += " (from history.json; SLURM no longer knows the job)"
    lines = [f"job {status.job_id}{name}: {state}"]
    if status.pending_reason:
        lines.append(f"  waiting for:     {status.pending_reason}")
    if status.nodes:
        lines.append(f"  nodes:           {compress(status.nodes)} ({len(status.nodes)})")
    if status.exit_code and status.ended:
        lines.append(f"  exit code:       {status.exit_code}")
    if status.requeues is not None:
        budget = f" of at most {status.max_requeues}" if status.max_requeues is not None else ""
        lines.append(f"  requeues:        {status.requeues}{budget}")
    if status.attempts_total:
        lines.append(
            f"  attempts:        {status.attempts} in the latest run, "
            f"{status.attempts_total} in all (each restart in place is one more)"
        )
    for exclusion in status.excluded:
        lines.append(f"  kept out:        {exclusion.node}: {exclusion.reason}")
    if status.checkpoint_step is not None:
        lines.append(f"  last checkpoint: step {status.checkpoint_step} ({status.checkpoint_path})")
    elif status.checkpoint_dir:
        lines.append(f"  last checkpoint: none yet in {status.checkpoint_dir}")
    for run in status.runs:
        nodes = compress(run.nodes) if run.nodes else "-"
        how = f"{run.reason} -> {run.action}" if run.reason else "running"
        lines.append(f"  run {run.requeue}:           {_when(run.started)} on {nodes}: {how}")
    if status.job_dir:
        lines.append(f"  job folder:      {status.job_dir}")
    if status.batch_log:
        lines.append(f"  batch log:       {status.batch_log}")
    for note in status.notes:
        lines.append(f"  note: {note}")
    if status.root_cause and status.state not in ("RUNNING", "PENDING", "COMPLETED"):
        lines += ["", status.root_cause]
    return "\n".join(lines)


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
def status(obj: Any, job_id: str, job_dir: Path | None, as_json: bool, follow_on: bool) -> None:
    """Show JOBID's state, nodes, requeues, restarts, nodes kept out, last
    checkpoint and, when it failed, the root cause."""
    try:
        number = _job_id(job_id)
        found = _look(obj, number, job_dir)
    except HpclaunchError as exc:
        _fail(exc)
        return
    if follow_on:
        code = follow_job(obj, number, job_dir, root_cause=False)  # the status shows it
        found = gather(number, obj.slurm, obj.env, job_dir)
        click.echo(json.dumps(found.to_json(), indent=2) if as_json else render_status(found))
        sys.exit(code)
    if as_json:
        click.echo(json.dumps(found.to_json(), indent=2))
    else:
        click.echo(render_status(found))


def log_files(
    job_dir: Path, status: JobStatus, rank: int | None, node: str | None, err: bool
) -> list[tuple[str, Path]]:
    """The files ``hpclaunch logs`` shows, oldest first, with a label each."""
    kind = RankFile.ERR if err else RankFile.OUT
    if rank is None and node is None:
        return [("batch log", Path(status.batch_log))] if status.batch_log else []
    files = []
    for attempt in JobFolder(job_dir).attempts():
        ranks = [rank] if rank is not None else []
        if node is not None:
            on_node = attempt.node_ranks().get(node, [])
            ranks = [r for r in on_node if rank is None or r == rank]
        for number in ranks:
            path = attempt.rank_file(number, kind)
            if path.exists():
                files.append((f"rank {number}, {attempt.label}", path))
    return files


@click.command()
@click.argument("job_id", metavar="JOBID")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="This global rank's output, every attempt in order.")  # fmt: skip
@click.option("--node", default=None, help="The output of every rank that ran on this node.")
@click.option("--err", is_flag=True, help="The ranks' stderr instead of their stdout.")
@click.option("--follow", "-f", "follow_on", is_flag=True,
              help="Keep printing as the job writes, until it ends.")  # fmt: skip
@_job_dir_option
@click.pass_obj
def logs(
    obj: Any,
    job_id: str,
    rank: int | None,
    node: str | None,
    err: bool,
    follow_on: bool,
    job_dir: Path | None,
) -> None:
    """Print JOBID's logs: the batch log (the supervisor and every agent), or with
    --rank/--node the workers' own output, across restarts and requeues."""
    try:
        number = _job_id(job_id)
        found = _look(obj, number, job_dir)
        if found.job_dir is None and (rank is not None or node is not None):
            raise JobNotFound(f"job {number}'s folder is unknown: " + "; ".join(found.notes))
    except HpclaunchError as exc:
        _fail(exc)
        return
    folder = Path(found.job_dir) if found.job_dir else Path()

    def files(current: JobStatus) -> list[tuple[str, Path]]:
        return log_files(folder, current, rank, node, err)

    tail = follow.Tail()
    listed = files(found)
    if not listed and not follow_on:
        what = "batch log" if rank is None and node is None else "log of that rank or node"
        _fail(JobNotFound(
            f"job {number} has no {what} yet"
            + (f" (nodes it ran on: {_nodes_seen(folder)})" if node is not None else "")
        ))  # fmt: skip
    headers = rank is not None or node is not None  # one header per rank, per attempt
    try:
        if not follow_on:
            _write(tail.rest(listed, headers))
            return
        current, blind = found, 0
        if not listed and found.state == "PENDING":
            click.echo(f"hpclaunch: job {number} is pending; waiting for it to start", err=True)
        while True:
            _write(tail.read(files(current), headers))
            if current.ended:
                break
            time.sleep(follow.POLL_S)
            current = gather(number, obj.slurm, obj.env, job_dir)
            blind = blind + 1 if current.state is None else 0
            if current.state is None and (current.slurm_forgot or blind >= follow.BLIND_LOOKS):
                click.echo(f"hpclaunch: lost track of job {number}'s state: "
                           + "; ".join(current.notes), err=True)  # fmt: skip
                break
        _write(tail.rest(files(current), headers))
    except BrokenPipeError:  # `hpclaunch logs ... | head`
        sys.stderr.close()  # nothing more to say, and no traceback at exit
        os._exit(0)


def _write(parts: Iterable[str]) -> None:
    for part in parts:
        sys.stdout.write(part)
    sys.stdout.flush()


def _nodes_seen(folder: Path) -> str:
    names = sorted({name for a in JobFolder(folder).attempts() for name in a.node_ranks()})
    return ", ".join(names) or "none recorded"


@click.command()
@click.argument("job_id", metavar="JOBID")
@_job_dir_option
@click.pass_obj
def cancel(obj: Any, job_id: str, job_dir: Path | None) -> None:
    """End JOBID for good: it is not requeued, whatever signal its supervisor got first."""
    try:
        number = _job_id(job_id)
        found = _look(obj, number, job_dir)
        if found.ended:
            raise HpclaunchError(f"job {number} already ended ({found.state}); nothing to cancel")
        marker = JobFolder(Path(found.job_dir)).cancelled if found.job_dir else None
        if marker is not None:
            try:
                marker.write_text(f"{time.time()}\n")
            except OSError as exc:
                raise HpclaunchError(
                    f"cannot leave the cancel note {marker} for job {number}'s supervisor: "
                    f"{exc.strerror or exc}; nothing was cancelled (is it your job? "
                    "`scancel` cancels without the note, but a time-limit warning that came "
                    "first may then still requeue it)"
                ) from None
        try:
            obj.slurm.cancel(number)
        except SlurmError:
            if marker is not None:
                marker.unlink(missing_ok=True)  # nothing half-done
            raise
    except HpclaunchError as exc:
        _fail(exc)
        return
    where = f" on {compress(found.nodes)}" if found.nodes else ""
    promise = (
        "it will not be requeued" if marker is not None
        else "its folder is unknown, so a requeue already under way may still happen"
    )  # fmt: skip
    click.echo(f"job {number}: cancelled (was {found.state or 'unknown'}{where}); {promise}")


@click.command(name="list")
@click.option("--last", "-n", type=click.IntRange(min=1), default=LIST_DEFAULT, show_default=True,
              help="How many of the latest submissions to show.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_obj
def list_jobs(obj: Any, last: int, as_json: bool) -> None:
    """List this user's latest hpclaunch jobs, newest last, with their state."""
    entries = registry.entries(obj.env)[-last:]
    rows: list[dict[str, Any]] = []
    slurm = obj.slurm
    for entry in entries:
        found = gather(entry.job_id, slurm, obj.env, Path(entry.job_dir))
        if found.slurm_unreachable:
            slurm = None  # ask no more: each would wait for the same time-out
        rows.append({
            "job_id": entry.job_id, "name": entry.name, "state": found.state,
            "nodes": compress(found.nodes) if found.nodes else None,
            "requeues": found.requeues, "submitted": entry.submitted,
            "job_dir": entry.job_dir,
        })  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no jobs submitted with hpclaunch sbatch yet ({registry.path(obj.env)})")
        return
    table: list[tuple[str, ...]] = [
        ("JOBID", "NAME", "STATE", "NODES", "REQUEUES", "SUBMITTED", "JOB FOLDER")
    ]
    for row in rows:
        table.append((
            str(row["job_id"]), row["name"], row["state"] or "unknown", row["nodes"] or "-",
            "-" if row["requeues"] is None else str(row["requeues"]),
            _when(row["submitted"]), row["job_dir"],
        ))  # fmt: skip
    click.echo(_columns(table))


def _columns(table: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in table
    )


def follow_job(obj: Any, job_id: int, job_dir: Path | None, root_cause: bool = True) -> int:
    """``hpclaunch sbatch --follow``: print each change until the job ends; returns
    the exit status that mirrors the job's."""

    def emit(line: str) -> None:
        click.echo(f"[{time.strftime('%H:%M:%S')}] job {job_id}: {line}", err=True)

    try:
        last = follow.watch(lambda: gather(job_id, obj.slurm, obj.env, job_dir), emit)
    except HpclaunchError as exc:
        _fail(exc)
        return int(exc.exit_code)
    if root_cause and last.root_cause and last.state != "COMPLETED":
        click.echo(last.root_cause, err=True)
    return exit_status(last)


COMMANDS = (status, logs, cancel, list_jobs)
