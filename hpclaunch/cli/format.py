"""Text for a terminal: ``hpclaunch status``'s report and ``list``'s table. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from hpclaunch.ops.listing import ListedJob
from hpclaunch.ops.status import JobStatus
from hpclaunch.slurm.hostlist import compress
from hpclaunch.slurm.states import JobState

# States in which the root cause is not shown: nothing failed, or not yet.
_NO_ROOT_CAUSE = frozenset({JobState.RUNNING, JobState.PENDING, JobState.COMPLETED})


def when(seconds: float | None) -> str:
    """A time for a person, in this machine's time zone; "-" for none."""
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
    if status.never_starts:
        lines.append(
            f"  never starts:    {status.never_starts}; cancel it: hpclaunch cancel {status.job_id}"
        )
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
    lines += _last_checkpoint(status)
    if status.last_save:
        lines.append(f"  last save:       {status.last_save}")
    if status.progress:
        lines.append(f"  progress:        {status.progress}")
    for restart in status.restarts:
        lines.append(f"  restart:         {restart}")
    for loss in status.lost_work:
        lines.append(f"  lost work:       {loss.text}")
    if status.goodput is not None:
        lines.append(f"  goodput:         {status.goodput.line()}")
    for hang in status.hangs:
        lines.append(f"  hang:            {hang}")
    for run in status.runs:
        nodes = compress(run.nodes) if run.nodes else "-"
        how = f"{run.reason} -> {run.action}" if run.reason else run.unclosed or "running"
        lines.append(f"  run {run.requeue}:           {when(run.started)} on {nodes}: {how}")
    if status.job_dir:
        lines.append(f"  job folder:      {status.job_dir}")
    if status.batch_log:
        lines.append(f"  batch log:       {status.batch_log}")
    if status.verdict and status.ended:
        lines.append(f"  verdict:         {status.verdict}")
    for note in status.notes:
        lines.append(f"  note: {note}")
    if status.root_cause and status.job_state not in _NO_ROOT_CAUSE:
        lines += ["", status.root_cause]
    return "\n".join(lines)


def _last_checkpoint(status: JobStatus) -> list[str]:
    """The "last checkpoint" line: hpclaunch's own, or one the job wrote its own way
    (found by pattern) when that is newer."""
    if status.found_is_last:
        written = when(status.found_checkpoint_written)
        return [f"  last checkpoint: {status.found_checkpoint} (written {written})"]
    if status.checkpoint_step is not None:
        return [f"  last checkpoint: step {status.checkpoint_step} ({status.checkpoint_path})"]
    if status.checkpoint_dir:
        nor = ", nor matching " + ", ".join(status.checkpoint_patterns)
        return [
            f"  last checkpoint: none seen in {status.checkpoint_dir}"
            + (nor if status.checkpoint_patterns else "")
        ]
    return []


def jobs_table(rows: Sequence[ListedJob]) -> str:
    """``hpclaunch list``'s table, a header line first."""
    table: list[tuple[str, ...]] = [
        ("JOBID", "NAME", "STATE", "NODES", "REQUEUES", "SUBMITTED", "JOB FOLDER")
    ]
    for row in rows:
        table.append(
            (
                str(row.job_id),
                row.name if len(row.name) <= NAME_CELL else f"{row.name[: NAME_CELL - 3]}...",
                row.state or "unknown",
                row.nodes or "-",
                "-" if row.requeues is None else str(row.requeues),
                when(row.submitted),
                row.job_dir,
            )
        )
    why = [f"job {row.job_id} is unreadable: {row.error}" for row in rows if row.error]
    return "\n".join([columns(table), *why])


# The widest job name the table shows whole: a longer one (submitted before names were
# limited, hpclaunch.job.paths) is cut, so that the other columns stay on the screen.
NAME_CELL = 40


def columns(table: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, without trailing blanks."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in table
    )
