"""Following a job: what changed between two looks at it (pure), log files read as
they grow, and the one loop behind ``hpclaunch sbatch --follow``, ``status --follow``
and ``logs --follow``. No torch."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpclaunch.errors import ExitCode, HpclaunchError
from hpclaunch.ops import deadends
from hpclaunch.ops.status import JobStatus
from hpclaunch.record import training
from hpclaunch.record.training import Training
from hpclaunch.slurm.hostlist import compress
from hpclaunch.slurm.states import ON_NODES, JobState

# How often a follower looks again (a person watching, not a synchronisation), and
# after how many looks in a row without any state it gives up (SLURM unreachable).
POLL_S = 2.0
BLIND_LOOKS = 30
# How often at most --follow prints the training's progress while it steps.
PROGRESS_EVERY_S = 30.0
# Lines about what a run did: a look that misses them (a file being replaced) must not
# have the next one say them again.
_ONCE = ("lost work:", "worker group restarted in place:")


def changes(before: JobStatus | None, after: JobStatus) -> list[str]:
    """One line per thing that changed, in the order a reader wants them."""
    lines = []
    old = before or JobStatus(after.job_id)
    if after.requeues is not None and after.requeues > (old.requeues or 0):
        ended = [run for run in after.runs if run.requeue < after.requeues and run.ended]
        why = ended[-1].reason if ended else None
        budget = f" of {after.max_requeues}" if after.max_requeues else ""
        lines.append(f"requeued ({after.requeues}{budget})" + (f": {why}" if why else ""))
    new_exclusions = [e for e in after.excluded if e not in old.excluded]
    for exclusion in new_exclusions:
        lines.append(f"node {exclusion.node} kept out: {exclusion.reason}")
    state_changed = after.state != old.state or (after.nodes != old.nodes and after.nodes)
    if state_changed and not after.ended:
        lines.append(_state_line(after))
    same_run = after.requeues == old.requeues
    for restart in after.restarts:
        if not same_run or restart not in old.restarts:
            lines.append(f"worker group restarted in place: {restart}")
    told = {loss.requeue for loss in old.lost_work if loss.final}
    for loss in after.lost_work:
        if loss.final and loss.requeue not in told:
            lines.append(f"lost work: {loss.text}")  # once, when nothing can change it
    if after.checkpoint_step is not None and after.checkpoint_step != old.checkpoint_step:
        lines.append(f"checkpoint: step {after.checkpoint_step}")
    found = (after.found_checkpoint, after.found_checkpoint_written)
    if after.found_is_last and found != (old.found_checkpoint, old.found_checkpoint_written):
        lines.append(f"checkpoint: {after.found_checkpoint}")  # the job's own, by pattern
    if state_changed and after.ended:
        lines.append(_state_line(after))  # the end comes last
    return lines


def _state_line(status: JobStatus) -> str:
    line = f"state {status.state or 'unknown'}"
    if status.pending_reason:
        line += f" ({status.pending_reason})"
    if status.nodes and status.job_state in ON_NODES:
        line += f" on {compress(status.nodes)}"
    if status.ended and status.exit_code:
        line += f", exit code {status.exit_code}"
    return line


class LostTrack(HpclaunchError):
    """The follower cannot tell the job's state any more; the message says why, and
    ``last`` is the last look."""

    exit_code = ExitCode.SLURM

    def __init__(self, message: str, last: JobStatus) -> None:
        super().__init__(message)
        self.last = last


def progress_due(shown: tuple[float, Training] | None, now: Training, at: float) -> bool:
    """Whether ``--follow`` prints a progress line: the first one, a new run's or
    attempt's, the first with an ETA, the steps stopping (once), or new steps
    PROGRESS_EVERY_S after the last line (``at``: a monotonic clock); never more,
    however often it looks."""
    if shown is None:
        return True
    when, last = shown
    stalled = now.idle_s >= training.IDLE_SHOWN_S
    if (now.run, now.attempt) != (last.run, last.attempt):
        return True  # a new run or attempt
    if now.eta_s is not None and last.eta_s is None:
        return True  # the first look with a rate and a total
    if stalled:
        return last.idle_s < training.IDLE_SHOWN_S  # it stopped stepping: say so once
    return now.step != last.step and at - when >= PROGRESS_EVERY_S


def watch(
    look: Callable[[], JobStatus],
    emit: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    blind_looks: int = BLIND_LOOKS,
    clock: Callable[[], float] = time.monotonic,
) -> JobStatus:
    """Look at the job until it has ended, emitting each change (and the training's
    progress, see ``progress_due``); returns the last look. Raises LostTrack (see
    ``loop``)."""
    before: list[JobStatus] = []
    shown: list[tuple[float, Training]] = []  # when the last progress line was, and what
    said: set[str] = set()  # the lines about one run's past, said once whatever a look misses

    def seen(now: JobStatus) -> None:
        for line in changes(before[-1] if before else None, now):
            if line.startswith(_ONCE):
                if line in said:
                    continue
                said.add(line)
            emit(line)
        at = clock()
        stepping = now.job_state is JobState.RUNNING  # not an old run's, once requeued
        if (
            now.training is not None
            and stepping
            and progress_due(shown[-1] if shown else None, now.training, at)
        ):
            emit(f"progress: {training.line(now.training, time.time())}")
            shown[:] = [(at, now.training)]
        before[:] = [now]

    return loop(look, seen, sleep, blind_looks)


def loop(
    look: Callable[[], JobStatus],
    seen: Callable[[JobStatus], None],
    sleep: Callable[[float], None] = time.sleep,
    blind_looks: int = BLIND_LOOKS,
    first: JobStatus | None = None,
) -> JobStatus:
    """The one follow loop: look at the job (``first``, when given, is the first look),
    hand each look to ``seen``, and sleep between looks until the job has ended;
    returns the last look. Raises NeverStarts for a pending job that can never start
    (ops.deadends); LostTrack when SLURM has forgotten the job and its folder does not
    say how it ended, or after ``blind_looks`` looks in a row without a state."""
    blind = 0
    now = first if first is not None else look()
    while True:
        seen(now)
        if now.ended:
            return now
        if now.never_starts is not None:  # SLURM would keep it pending for ever
            raise deadends.error(now.job_id, now.never_starts)
        blind = blind + 1 if now.state is None else 0
        if now.state is None and (now.slurm_forgot or blind >= blind_looks):
            why = "; ".join(now.notes) or "no state from SLURM or the job folder"
            raise LostTrack(
                f"cannot tell whether job {now.job_id} is still running: {why}. "
                f"`hpclaunch logs {now.job_id}` shows what it wrote",
                now,
            )
        sleep(POLL_S)
        now = look()


@dataclass
class Tail:
    """Files read as they grow: each ``read`` returns what was added since the last,
    in the order the files are given, with a header before a file's first part when
    there is more than one file."""

    offsets: dict[Path, int] = field(default_factory=dict)
    shown: Path | None = None  # the file the last part came from
    headed: set[Path] = field(default_factory=set)  # the files whose header was printed

    def read(self, files: Sequence[tuple[str, Path]], headers: bool) -> Iterator[str]:
        for label, path in files:
            start = self.offsets.get(path, 0)
            try:
                with path.open("rb") as handle:
                    if start > os.fstat(handle.fileno()).st_size:
                        start = 0  # the file was truncated: read it again
                    handle.seek(start)
                    data = handle.read()
            except OSError:
                continue
            if not data:
                continue
            # A line still being written waits for its end, except at the very end.
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                continue
            self.offsets[path] = start + cut
            if headers and self.shown != path:
                yield f"==> {label}: {path} <==\n"
                self.shown = path
                self.headed.add(path)
            yield data[:cut].decode(errors="replace")

    def rest(self, files: Sequence[tuple[str, Path]], headers: bool) -> Iterator[str]:
        """What is left, a last line without its newline included; with ``headers``,
        an empty file gets its header too (it exists, it is just empty)."""
        yield from self.read(files, headers)
        for label, path in files:
            try:
                with path.open("rb") as handle:
                    handle.seek(self.offsets.get(path, 0))
                    data = handle.read()
            except OSError:
                continue
            if headers and path not in self.headed:
                yield f"==> {label}: {path} <==\n"
                self.headed.add(path)
                self.shown = path
            if data:
                self.offsets[path] = self.offsets.get(path, 0) + len(data)
                yield data.decode(errors="replace") + "\n"
