"""``hpclaunch report``: the job's goodput split, a table of its runs and attempts, and
its timeline as a picture (PNG or SVG, through matplotlib, the optional ``report``
extra, imported only to draw). No torch.
"""

from __future__ import annotations

from pathlib import Path

from hpclaunch.errors import HpclaunchError
from hpclaunch.ops.status import JobStatus
from hpclaunch.record.attempts import Attempt
from hpclaunch.record.goodput import PARTS, RunTimes, Timeline, duration

FORMATS = (".png", ".svg")
COLOURS = {
    "queue": "#bdbdbd",
    "startup": "#fdd835",
    "productive": "#43a047",
    "checkpoint": "#1e88e5",
    "lost": "#e53935",
    "unknown": "#f48fb1",
    "restarts": "#fb8c00",
    "hangs": "#8e24aa",
    "shutdown": "#757575",
}


class ReportError(HpclaunchError):
    """The picture cannot be drawn: no matplotlib, or an output name it cannot write."""


def text(status: JobStatus, found: Timeline | None) -> str:
    """The split, one part a line with its share, then one line per attempt."""
    lines = [
        f"job {status.job_id}{f' ({status.name})' if status.name else ''}: "
        f"{status.state or 'unknown'}"
    ]
    if found is None:
        return "\n".join([*lines, "  no run yet: nothing to split"])
    split = found.split
    lines.append(f"  goodput: {split.line()}")
    for part, seconds in split.parts().items():
        share = seconds / split.wall_s * 100 if split.wall_s else 0.0
        lines.append(f"    {part:<11} {duration(seconds):>13}  {share:5.1f} %")
    header = "  run  attempt  began        first step   last step    steps        steps/s  ended"
    lines += ["", header]
    for attempt in found.attempts:
        lines.append("  " + _row(attempt, split.submitted))
    for run in found.runs:
        lines.append(f"  run {run.requeue}: {ending(run)}")
    return "\n".join(lines)


def ending(run: RunTimes) -> str:
    """How a run ended, as history.json says: ``completed``, ``requeued: bad nodes``."""
    if run.ended is None and run.reason is None:
        return "running" if run.action is None else "no end recorded"
    reason = run.reason or "unknown"
    if run.action in ("requeue", "SLURM requeues"):
        return reason if reason.startswith("requeued") else f"requeued: {reason}"
    if reason == "completed":
        return "completed"
    if run.action in ("give up", "requeue failed"):
        return f"ended ({run.action}): {reason}"
    return f"ended: {reason}"


def steps_of(a: Attempt) -> str:
    """The steps an attempt did, as status counts them: ``40→60`` (the job's count: it
    resumed from 40 and reached 60), ``+20`` where it did 20 from a step not seen."""
    if a.first_step is None or a.last_step is None:
        return "-"
    if a.job_count:
        return f"{a.first_step - 1}→{a.last_step}"
    return f"+{a.last_step - a.first_step + 1}"


def _row(a: Attempt, zero: float) -> str:
    def at(t: float | None) -> str:
        return "-" if t is None else f"+{duration(t - zero)}"

    rate = rate_of(a)
    return (
        f"{a.requeue:<4} {a.attempt:<8} {at(a.began):<12} {at(a.first):<12} "
        f"{at(a.last):<12} {steps_of(a):<12} "
        f"{f'{rate:.2f}' if rate else '-':<8} {at(a.ended)}"
    )


def rate_of(a: Attempt) -> float | None:
    """The attempt's steps per second over its training, None without two steps."""
    if None in (a.first, a.last, a.first_step, a.last_step):
        return None
    span = (a.last or 0) - (a.first or 0)
    return ((a.last_step or 0) - (a.first_step or 0)) / span if span > 0 else None


def check_output(output: Path) -> None:
    """Raises ReportError when ``output``'s suffix is not one the picture is drawn in."""
    if output.suffix.lower() not in FORMATS:
        raise ReportError(
            f"--output {output}: the picture is drawn as PNG or SVG; name the file "
            "FILE.png or FILE.svg"
        )


def draw(found: Timeline, output: Path, title_prefix: str) -> None:
    """The timeline into ``output``: a lane per run with its parts and how it ended, the
    checkpoint saves and hangs as marks, and steps per second below. Raises ReportError."""
    check_output(output)
    try:
        import matplotlib

        matplotlib.use("Agg")
        matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: "run 1" can be found
        from matplotlib import pyplot
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise ReportError(
            f"drawing {output} needs matplotlib ({exc}); install it with "
            "pip install 'hpclaunch[report]', or leave out --output for the text"
        ) from exc
    zero = found.split.submitted
    runs = sorted({s.requeue for s in found.segments if s.requeue >= 0})
    lane = {requeue: index for index, requeue in enumerate(runs)}
    figure, (top, bottom) = pyplot.subplots(
        2, 1, figsize=(11, 2.2 + 0.6 * len(runs)), sharex=True, height_ratios=[2, 1]
    )
    for segment in found.segments:
        row = lane.get(segment.requeue, -1)
        span = [(segment.start - zero, segment.end - segment.start)]
        top.broken_barh(
            span,
            (row - 0.4, 0.8),
            color=COLOURS[segment.part],
            gid=f"{segment.part}-{segment.requeue}",
        )
    for save in found.saves:
        mark = next(
            (
                lane[s.requeue]
                for s in found.segments
                if s.requeue in lane and s.start <= save.called <= s.end
            ),
            None,
        )
        if mark is not None:
            top.plot([save.called - zero], [mark + 0.5], marker="v", color=COLOURS["checkpoint"])
    rates: list[float] = []
    for attempt in found.attempts:
        if (attempt.requeue, attempt.attempt) in found.hung and attempt.last is not None:
            top.plot(
                [attempt.last - zero],
                [lane.get(attempt.requeue, 0) - 0.5],
                marker="x",
                color=COLOURS["hangs"],
            )
        rate = rate_of(attempt)
        if rate and attempt.first is not None and attempt.last is not None:
            rates.append(rate)
            bottom.plot(
                [attempt.first - zero, attempt.last - zero],
                [rate, rate],
                color=COLOURS["productive"],
                gid=f"rate-{attempt.requeue}-{attempt.attempt}",
            )
    extent = max([found.split.until - zero, *(s.end - zero for s in found.segments)])
    for run in found.runs:
        mine = [s for s in found.segments if s.requeue == run.requeue]
        if mine and run.requeue in lane:
            top.text(
                max(s.end for s in mine) - zero,
                lane[run.requeue],
                f" {ending(run)}",
                va="center",
                fontsize="small",
                gid=f"ending-{run.requeue}",
            )
    # Every mark inside the frame: the lanes with their marks above and below, the time
    # with room on the right for how each run ended, the fastest rate below the top.
    top.set_ylim(-1.7, len(runs) - 0.3)
    top.set_xlim(0, max(extent, 1.0) * 1.3)
    top.set_yticks([-1, *lane.values()], ["queue", *(f"run {r}" for r in runs)])
    split = found.split
    if not split.stepped or split.ratio is None:
        title = "goodput unknown (no training step seen)"
    elif split.ratio_max is not None:
        title = f"goodput {split.ratio * 100:.1f} % to {split.ratio_max * 100:.1f} %"
    else:
        title = f"goodput {split.ratio * 100:.1f} %"
    top.set_title(f"{title_prefix}: {title}")
    top.legend(
        handles=[Patch(color=COLOURS[p], label=p) for p in PARTS],
        ncol=5,
        fontsize="small",
        loc="upper left",
        bbox_to_anchor=(0, -0.05),
    )
    bottom.set_ylabel("steps/s")
    bottom.set_ylim(0, max(rates, default=1.0) * 1.25)
    bottom.set_xlabel("seconds since submission")
    figure.tight_layout()
    try:
        figure.savefig(output)
    except OSError as exc:
        raise ReportError(f"--output {output} cannot be written: {exc.strerror}") from exc
    finally:
        pyplot.close(figure)
