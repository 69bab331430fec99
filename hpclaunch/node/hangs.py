"""A node's hang watch, run by its agent between its looks at the workers. No torch.

Each worker reports its progress into a file in node memory (hpclaunch.progress); the
watch reads those files at most every CHECK_S and finds a hang (``judge``) when none of
its ranks made progress for the hang timeout, or one of its workers has been stopped
(SIGSTOP) that long. The timeout (``HangTimeout``) is off until the first step is seen;
by default it is then MULTIPLE times the slowest step seen so far, and never less than
FLOOR_S: long enough for an evaluation loop or a checkpoint save between two steps. In
a job whose ranks step together, one rank that stops stops every rank within a step, so
each node sees the hang by itself, and no node sends anything per step.

Nothing between steps waits forever either (``Bounds``): a rank in a stretch its board
names (a save or load through hpclaunch.checkpoint, the script's own ``paused()``) hangs
when the stretch outlasts its bound, and an attempt's first step, once the job has
stepped in an earlier attempt or run, is watched from the attempt's start on each node
that stepped before. The automatic bounds come from the job's own record (``Learned``):
its recent saves (hpclaunch.jobdir.saves) and how long its earlier attempts took to their
first step (hpclaunch.jobdir.attempts), times STRETCH_MULTIPLE (LOAD_MULTIPLE for a
load), never less than STRETCH_FLOOR_S; an attempt's first step, which may include a
load of the script's own, never less than a load's.

At a hang the watch reads every rank's stack (hpclaunch.node.stacks), names the rank
this node has evidence against (stopped, or not waiting in a collective while others
are), and writes its report and the stacks into the job folder (hpclaunch.jobdir.hangs);
the agent then ends the workers, and the group restarts as after a crash. The watch
also answers ``hpclaunch stacks`` and writes the node's progress note for status.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hpclaunch import procs, progress
from hpclaunch.contract.values import (
    HANG_AUTO,
    HANG_FLOOR_S,
    HANG_MULTIPLE,
    HANG_OFF,
    LOAD_MULTIPLE,
    PAUSE_S,
    STRETCH_FLOOR_S,
    STRETCH_MULTIPLE,
    UNSEEN_SAVE_S,
    TimeoutField,
    parse_hang_timeout,
    parse_timeout,
)
from hpclaunch.jobdir import attempts, progress_notes, saves
from hpclaunch.jobdir import hangs as reports
from hpclaunch.jobdir.hangs import HangReport, RankAtHang
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.node import boot_env, stacks
from hpclaunch.record.job_record import read_run

log = logging.getLogger(__name__)

FLOOR_S = HANG_FLOOR_S  # the shortest automatic timeout
MULTIPLE = HANG_MULTIPLE  # the automatic timeout: this many times the slowest step seen
CHECK_S = 0.5  # between two reads of the progress files
NOTE_S = 10.0  # between two progress notes in the job folder
REQUESTS_S = 5.0  # between two looks for `hpclaunch stacks` requests (a shared folder)
# After reading its ranks' stacks, a node waits this long before it ends its workers:
# the other nodes find the hang within about CHECK_S of it, and must read their ranks'
# stacks while those still wait (a rank whose peers are gone is on its way out).
DEFER_S = 2.0
STOPPED_NOTE = "(this worker is stopped: state T, SIGSTOP)\n"


@dataclass(frozen=True)
class HangTimeout:
    """``--hang-timeout``: "auto", "off", or seconds."""

    seconds: float | None = None  # None: automatic
    off: bool = False

    @classmethod
    def parse(cls, text: str, field: TimeoutField = TimeoutField.HANG) -> HangTimeout:
        """From the text of ``--hang-timeout`` (or of the option of ``field``: the stretch
        timeouts take the same words). Raises SpecError naming the value."""
        value = parse_timeout(text, field)
        if value == HANG_AUTO:
            return cls()
        return cls(off=True) if value == HANG_OFF else cls(float(value))

    def limit(self, slowest_step_s: float) -> float | None:
        """The seconds without progress that make a hang; None when off."""
        if self.off:
            return None
        if self.seconds is not None:
            return self.seconds
        return max(FLOOR_S, MULTIPLE * slowest_step_s)

    def __str__(self) -> str:
        if self.off or self.seconds is None:
            return HANG_OFF if self.off else HANG_AUTO
        return parse_hang_timeout(self.seconds)


@dataclass(frozen=True)
class Bounds:
    """The timeouts of the stretches between steps: ``--checkpoint-timeout`` (a save or a
    load through hpclaunch.checkpoint), ``--pause-timeout`` (the script's ``paused()``),
    ``--first-step-timeout`` (from an attempt's start to its first step)."""

    checkpoint: HangTimeout = HangTimeout()
    pause: HangTimeout = HangTimeout()
    first_step: HangTimeout = HangTimeout()


@dataclass(frozen=True)
class Learned:
    """What the job's own record says its stretches take (see ``learn``)."""

    slowest_save_s: float | None = None  # of its recent saves; None: none recorded
    # The longest an earlier attempt took from its start to its first step, on any node
    # (0.0 where none could be timed); None: this node never stepped (a node whose
    # script never steps, a role without training, is not watched for a first step).
    first_step_s: float | None = None
    # Hangs of the job in a save or load cut by its bound (each attempt once): before any
    # save was recorded, each doubles the unseen save's bound (a first save that takes
    # longer than it would be cut in every attempt).
    cut_saves: int = 0


MAX_DOUBLINGS = 6  # of the unseen save's bound: at most 64 times it


def unseen_save_bound(kind: progress.Stretch, bounds: Bounds, learned: Learned) -> bool:
    """Whether the bound of ``kind`` is the automatic one of a job with no save recorded
    (a guess: the hang says how to give a better one). Pure."""
    auto = not bounds.checkpoint.off and bounds.checkpoint.seconds is None
    return kind in (progress.SAVE, progress.LOAD) and auto and learned.slowest_save_s is None


# A stretch as the hang report says it: "rank 1 in checkpoint save for 31 s (bound 30 s)".
STRETCH_WORDS = {
    progress.SAVE: "checkpoint save",
    progress.LOAD: "checkpoint load",
    progress.PAUSE: "a pause (hpclaunch.progress.paused)",
}


def stretch_bound(kind: progress.Stretch, bounds: Bounds, learned: Learned) -> float | None:
    """The seconds a rank may stay in the stretch ``kind`` (one of progress.STRETCHES);
    None: unbounded (its option is off). Pure."""
    timeout = bounds.pause if kind == progress.PAUSE else bounds.checkpoint
    if timeout.off:
        return None
    if timeout.seconds is not None:
        return timeout.seconds
    if kind == progress.PAUSE:
        return PAUSE_S
    if learned.slowest_save_s is None:
        # A first save may be the longest: nothing says how long, but one cut before
        # was too long for this bound.
        return UNSEEN_SAVE_S * float(2 ** min(learned.cut_saves, MAX_DOUBLINGS))
    # A load reads what the saves wrote, but every rank may read what one rank wrote.
    multiple = LOAD_MULTIPLE if kind == progress.LOAD else STRETCH_MULTIPLE
    return max(STRETCH_FLOOR_S, multiple * learned.slowest_save_s)


def first_step_bound(bounds: Bounds, learned: Learned) -> float | None:
    """The seconds an attempt may take to its first step; None: not watched (off, or
    auto on a node that never stepped: its start may take any time). Auto is never less
    than a load's bound: the attempt may resume, and a script's own load (torch.load,
    a framework's restore) is no stretch of its board; with loads unbounded, neither is
    the first step. Pure."""
    timeout = bounds.first_step
    if timeout.off:
        return None
    if timeout.seconds is not None:
        return timeout.seconds
    load = stretch_bound(progress.LOAD, bounds, learned)
    if learned.first_step_s is None or load is None:
        return None
    return max(STRETCH_FLOOR_S, STRETCH_MULTIPLE * learned.first_step_s, load)


def learn(
    recorded: Sequence[saves.SaveRecord],
    events: Iterable[tuple[int, attempts.AttemptEvent]],
    node_rank: int | None = None,
    hung: Iterable[HangReport] = (),
) -> Learned:
    """The job's record as the bounds use it: its slowest recent save; the attempts whose
    save or load was cut by its bound (``hung``: every run's hang reports); and, when the
    node of ``node_rank`` stepped in an earlier attempt, the longest its attempts took
    from their ``begin`` to their ``first`` step (``events``: (requeue, event) of every
    run's attempts logs), each node's attempt timed on its own. Pure."""
    begun: dict[tuple[int, str, int], float] = {}
    firsts: list[tuple[tuple[int, str, int], float]] = []
    stepped_here = False
    for requeue, event in events:
        key = (requeue, event.node, event.attempt)
        if event.event == attempts.BEGIN:
            begun[key] = event.time
        elif event.event == attempts.FIRST:
            firsts.append((key, event.time))
            # A log of an older hpclaunch names no node rank: not known to be this node.
            stepped_here = stepped_here or (
                event.node_rank is not None and event.node_rank == node_rank
            )
    first_step = None
    if stepped_here:
        timed = [at - begun[key] for key, at in firsts if key in begun]
        first_step = max([0.0, *timed])
    slowest = saves.slowest(recorded)
    checkpointing = (str(progress.SAVE), str(progress.LOAD))
    cut = {(r.requeue, r.attempt) for r in hung if r.stretch_kind in checkpointing}
    return Learned(None if slowest is None else slowest.total_s, first_step, len(cut))


@dataclass(frozen=True)
class Seen:
    """One worker as the watch saw it."""

    rank: int
    local_rank: int
    pid: int
    state: str  # from /proc: "T" is stopped
    progress: progress.Progress | None
    stopped_s: float  # how long it has been seen stopped (0: not stopped)


@dataclass(frozen=True)
class Hang:
    reason: str
    limit_s: float
    seen: tuple[Seen, ...]
    # Where the workers hung, when not between two steps, without the ranks: "in
    # checkpoint save for 31 s (bound 30 s)", "with no first step for 40 s (bound 30 s)".
    stretch: str | None = None
    kind: progress.Stretch | None = None  # that stretch's kind; None: the first step


def judge(
    seen: Sequence[Seen],
    now: float,
    timeout: HangTimeout,
    *,
    bounds: Bounds = Bounds(),
    learned: Learned = Learned(),
    began: float | None = None,
) -> Hang | None:
    """A hang among one node's workers, seen at ``now`` (CLOCK_MONOTONIC); None while
    they progress, or are in a stretch within its bound. ``began``: when the attempt's
    workers were started (None: its first step is not watched). Pure."""
    stopped = _stopped(seen, timeout)
    if stopped is not None:
        return stopped
    # (rank, stretch, seconds in it, its bound) of each rank in one: the bound of the
    # largest of the stretches open (a save inside the script's pause: the larger).
    in_stretch = [
        (s.rank, s.progress.stretch, now - s.progress.since, _bound_of(s.progress, bounds, learned))
        for s in seen
        if s.progress is not None and s.progress.stretch is not None
    ]
    for _, kind, held, bound in in_stretch:
        if bound is not None and held >= bound:
            past = [(r, h) for r, k, h, b in in_stretch if k == kind and b == bound and h >= bound]
            names = ("rank " if len(past) == 1 else "ranks ") + ", ".join(str(r) for r, _ in past)
            longest = max(h for _, h in past)
            why = ""
            if unseen_save_bound(kind, bounds, learned):
                why = (
                    ": no save of this job was recorded yet; give --checkpoint-timeout "
                    "if its saves take longer"
                )
            words = f"in {STRETCH_WORDS[kind]} for {longest:.0f} s (bound {bound:g} s{why})"
            return Hang(f"{names} {words}", bound, tuple(seen), words, kind)
    if in_stretch:
        return None  # each is judged by its own bound, above
    # Since the last step, or the end of a stretch after it (a save between two steps).
    ended = max((s.progress.since for s in seen if s.progress is not None), default=0.0)
    reported = [s.progress for s in seen if s.progress is not None and s.progress.count > 0]
    if not reported:
        bound = first_step_bound(bounds, learned)
        if bound is None or began is None:
            return None  # before the first step of a job that never stepped
        waited = now - max(began, ended)
        if waited < bound:
            return None
        words = f"no first step for {waited:.0f} s (bound {bound:g} s)"
        return Hang(words, bound, tuple(seen), f"with {words}")
    limit = timeout.limit(max(p.slowest for p in reported))
    if limit is None:
        return None
    idle = now - max(max(p.last for p in reported), ended)
    if idle < limit:
        return None
    return Hang(f"no progress for {idle:.0f} s (limit {limit:g} s)", limit, tuple(seen))


def _bound_of(read: progress.Progress, bounds: Bounds, learned: Learned) -> float | None:
    """The bound of a rank's stretch: the largest of its open kinds' (None: one is
    unbounded). Pure."""
    kinds = read.within | ({read.stretch} if read.stretch is not None else set())
    found = [stretch_bound(kind, bounds, learned) for kind in kinds]
    return None if None in found else max((b for b in found if b is not None), default=None)


def _stopped(seen: Sequence[Seen], timeout: HangTimeout) -> Hang | None:
    """Workers stopped (SIGSTOP) for the hang timeout: a hang, first step or not."""
    reported = [s.progress for s in seen if s.progress is not None and s.progress.count > 0]
    limit = timeout.limit(max((p.slowest for p in reported), default=0.0))
    if limit is None:
        return None
    stopped = [s for s in seen if s.stopped_s >= limit]
    if not stopped:
        return None
    names = ", ".join(f"rank {s.rank}" for s in stopped)
    return Hang(f"{names} stopped (SIGSTOP) for {stopped[0].stopped_s:.0f} s", limit, tuple(seen))


def evidence(
    seen: Sequence[Seen], waiting: Mapping[int, bool | None]
) -> tuple[tuple[int, ...], str]:
    """The ranks among ``seen`` that this node has evidence hung first, and that evidence:
    its stopped workers, else those whose stack is not in a collective (``waiting``:
    rank -> whether it is; None: no stack). Pure."""
    stopped = tuple(s.rank for s in seen if s.state == "T")
    if stopped:
        return stopped, "stopped by a signal (SIGSTOP)"
    outside = tuple(s.rank for s in seen if waiting.get(s.rank) is False)
    if outside:
        return outside, "not waiting in a collective"
    return (), "no rank here was outside a collective"


class Watch:
    """One node's hang watch over the workers of each attempt (see the module)."""

    def __init__(
        self,
        local: Path,
        job: JobFolder,
        *,
        node: str,
        node_rank: int,
        requeue: int,
        timeout: HangTimeout,
        bounds: Bounds = Bounds(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._local, self._job, self._timeout, self._clock = local, job, timeout, clock
        self._bounds = bounds
        self._learned = Learned()
        self._began: float | None = None  # when the attempt's workers were started
        self._next_learn = 0.0
        self.node, self.node_rank, self.requeue = node, node_rank, requeue
        self.attempt = 0
        self._ranks: dict[int, int] = {}  # local rank -> global rank
        self._stopped_since: dict[int, float] = {}
        # local rank -> its last whole reading in this attempt: a read that fails (the
        # board caught mid-write every time) is no news, not a rank without progress.
        self._last_read: dict[int, progress.Progress] = {}
        self._next_check = self._next_note = self._next_requests = 0.0
        self.last_report: HangReport | None = None
        self._firsts: set[int] = set()  # attempts whose first step is in the attempts log
        self._ends: set[int] = set()  # attempts whose end is
        self._steps: dict[int, int] = {}  # attempt -> the step of its last STEP event

    def folder(self, attempt: int) -> Path:
        return self._local / "progress" / f"attempt-{attempt}"

    def highest_attempt(self) -> int | None:
        """The highest attempt this run's attempts logs name, any node's."""
        return attempts.highest(self._job, self.requeue)

    def worker_env(self, attempt: int, local_rank: int) -> dict[str, str]:
        """The progress and stack files of one worker of ``attempt``, and the boot that
        installs the reporting in a fresh python (hpclaunch.node.boot_env)."""
        folder = self.folder(attempt)
        return {
            progress.PROGRESS_FILE: str(folder / f"local-{local_rank}.progress"),
            progress.STACKS_FILE: str(folder / f"local-{local_rank}.stacks"),
            progress.WATCHER_PID: str(os.getpid()),
            **boot_env.boot_env(os.environ),
        }

    def begin(self, attempt: int, ranks: Mapping[int, int]) -> None:
        """A new attempt's workers (local rank -> global rank) are about to start."""
        self.attempt, self._ranks = attempt, dict(ranks)
        self._stopped_since.clear()
        self._last_read.clear()
        self.folder(attempt).mkdir(parents=True, exist_ok=True)
        self._learned = self._learn()  # before this attempt's own begin is logged
        self._next_learn = self._clock() + NOTE_S
        # Rounded as every other event's time is (to the millisecond): a first step
        # within the same millisecond, rounded down, would otherwise sort before it.
        began = round(time.time(), 3)
        self._log_event(attempts.AttemptEvent(self.node, attempt, attempts.BEGIN, began))
        self._began = self._clock()

    def _learn(self) -> Learned:
        """The bounds' measures from the job folder: every save recorded, and every run's
        attempts logs up to this one (a folder that cannot be read: nothing learned)."""
        runs = [read_run(self._job.root, requeue) for requeue in range(self.requeue + 1)]
        events = [(run.requeue, event) for run in runs for event in run.events]
        hung = [report for run in runs for report in run.hangs]
        return learn(saves.read(self._job.saves), events, self.node_rank, hung)

    def check(self, pids: Mapping[int, int]) -> Hang | None:
        """Look at the workers (local rank -> pid) if CHECK_S has passed: a hang, or None.
        Also answers stack requests and writes the progress note when they are due."""
        now = self._clock()
        if now < self._next_check or not pids:
            return None
        self._next_check = now + CHECK_S
        seen = self._see(pids, now)
        if now >= self._next_requests:
            self._next_requests = now + REQUESTS_S
            self._answer_requests(seen)
        if now >= self._next_note and self.note(now):
            self._next_note = now + NOTE_S
        checkpointing = any(
            s.progress is not None and s.progress.within & {progress.SAVE, progress.LOAD}
            for s in seen
        )
        if checkpointing and now >= self._next_learn:  # the saves of this attempt count too
            self._next_learn = now + NOTE_S
            slowest = learn(saves.read(self._job.saves), ()).slowest_save_s
            self._learned = replace(self._learned, slowest_save_s=slowest)
        return judge(
            seen, now, self._timeout, bounds=self._bounds, learned=self._learned, began=self._began
        )

    def _see(self, pids: Mapping[int, int], now: float) -> list[Seen]:
        folder = self.folder(self.attempt)
        seen = []
        for local_rank, pid in sorted(pids.items()):
            state = procs.state(pid)
            if state == "T":
                self._stopped_since.setdefault(local_rank, now)
            else:
                self._stopped_since.pop(local_rank, None)
            since = self._stopped_since.get(local_rank)
            read = progress.read(str(folder / f"local-{local_rank}.progress"))
            if read is None:
                read = self._last_read.get(local_rank)
            else:
                self._last_read[local_rank] = read
            seen.append(
                Seen(
                    self._ranks.get(local_rank, local_rank),
                    local_rank,
                    pid,
                    state,
                    read,
                    now - since if since is not None else 0.0,
                )
            )
        return seen

    def read_stacks(self, seen: Sequence[Seen]) -> dict[int, str]:
        """rank -> its stack text, now."""
        folder = self.folder(self.attempt)
        # Only the worker itself, not a python it started, answers the signal.
        handlers = {
            s.rank: str(folder / f"local-{s.local_rank}.stacks")
            for s in seen
            if s.progress is not None and s.progress.stacks_on_signal and s.progress.pid == s.pid
        }
        stopped = {s.rank for s in seen if s.state == "T"}
        read = stacks.read({s.rank: s.pid for s in seen}, stopped, handlers)
        return {
            rank: (STOPPED_NOTE + text if rank in stopped else text) for rank, text in read.items()
        }

    def diagnose(self, hang: Hang) -> HangReport:
        """The stacks of every rank, the ranks named, the report and stacks written into
        the job folder (a folder that cannot be written is logged, not raised)."""
        now = self._clock()
        text = self.read_stacks(hang.seen)
        parsed = {rank: stacks.parse(t) for rank, t in text.items()}
        # A rank no longer in its script (exiting: its peers are gone) is no evidence.
        waiting = {
            rank: stacks.waiting(threads) if stacks.in_script(threads) else None
            for rank, threads in parsed.items()
        }
        culprits, how = evidence(hang.seen, waiting)
        stacks_file = reports.report_path(self._job, self.requeue, self.attempt, self.node, "txt")
        ranks = tuple(
            RankAtHang(
                s.rank,
                s.local_rank,
                s.pid,
                s.state,
                s.progress.step if s.progress and s.progress.count else None,
                round(now - s.progress.last, 1) if s.progress and s.progress.count else None,
                waiting.get(s.rank),
                stacks.where(parsed.get(s.rank, [])),
            )
            for s in hang.seen
        )
        report = HangReport(
            self.node,
            self.node_rank,
            self.requeue,
            self.attempt,
            time.time(),
            hang.reason,
            hang.limit_s,
            ranks,
            culprits,
            how,
            str(stacks_file),
            hang.stretch,
            None if hang.kind is None else str(hang.kind),
        )
        try:
            stacks_file.parent.mkdir(parents=True, exist_ok=True)
            stacks_file.write_text(reports.sections(text))
            reports.write_report(self._job, report)
        except OSError as exc:
            log.warning("could not write the hang report into %s: %s", stacks_file.parent, exc)
        self.last_report = report
        return report

    def began_here(self, report: HangReport) -> bool:
        """Whether the hang of ``report``'s attempt began on this node, as every node's
        report of it says (hpclaunch.jobdir.hangs.began_on); their reports are in the job
        folder by now (each node waits DEFER_S after writing its own)."""
        found = [
            r
            for r in read_run(self._job.root, self.requeue).hangs
            if r.attempt == report.attempt and r.node != self.node
        ]
        return reports.began_on([report, *found]) == self.node

    def _answer_requests(self, seen: Sequence[Seen]) -> None:
        for request in reports.open_requests(self._job, self.node):
            try:
                reports.write_answer(self._job, request, self.node, self.read_stacks(seen))
            except OSError as exc:
                log.warning("could not answer the stacks request %s: %s", request, exc)

    def note(self, now: float | None = None) -> bool:
        """Write the node's progress note from every worker's file of the attempt (the
        agent calls it once more when the group ends); whether there was any to note."""
        now = self._clock() if now is None else now
        folder = self.folder(self.attempt)
        found = {
            rank: progress.read(str(folder / f"local-{local_rank}.progress"))
            for local_rank, rank in sorted(self._ranks.items())
        }
        ranks = tuple(
            progress_notes.RankProgress(
                rank,
                p.step,
                p.steps_per_s,
                round(p.slowest, 3),
                round(now - p.last, 1),
                p.job_steps,
                p.resumed,
                p.resumed_by,
            )
            for rank, p in found.items()
            if p is not None and p.count
        )
        if not ranks:
            return False
        totals = [p.total for p in found.values() if p is not None and p.total is not None]
        rank, metrics = self._metrics()
        self._note_first(found)
        self._note_step(found)
        note = progress_notes.NodeProgress(
            self.node, self.attempt, time.time(), ranks, max(totals, default=None), metrics, rank
        )
        try:
            progress_notes.write(self._job, self.requeue, note)
        except OSError as exc:
            log.debug("could not write the progress note: %s", exc)
        return True

    def _metrics(self) -> tuple[int | None, dict[str, float]]:
        """The latest metrics of the node's lowest rank that reported any, and that rank."""
        folder = self.folder(self.attempt)
        for local_rank, rank in sorted(self._ranks.items(), key=lambda item: item[1]):
            found = progress.read_metrics(str(folder / f"local-{local_rank}.progress"))
            if found:
                return rank, found
        return None, {}

    def _note_first(self, found: Mapping[int, progress.Progress | None]) -> None:
        """The attempt's first step into the attempts log, once (for the goodput), with
        where its ranks resumed when they saw it (the note keeps only the latest attempt):
        the point of those that saw one, when they agree; none when they differ."""
        stepped = [p for p in found.values() if p is not None and p.count]
        if self.attempt in self._firsts or not stepped:
            return
        self._firsts.add(self.attempt)
        first = min(stepped, key=lambda p: p.first)
        wall = self._wall(first.first)
        step = min(p.step - p.count + 1 for p in stepped)
        seen = sorted(
            {(p.resumed, p.resumed_by) for p in stepped if p.resumed is not None and p.resumed_by}
        )
        agreed = len({point for point, _ in seen}) == 1
        resumed, by = seen[0] if agreed else (None, None)
        self._log_event(
            attempts.AttemptEvent(
                self.node,
                self.attempt,
                attempts.FIRST,
                round(wall, 3),
                step,
                resumed=resumed,
                resumed_by=by,
            )
        )

    def _note_step(self, found: Mapping[int, progress.Progress | None]) -> None:
        """A sample of the node's progress into the attempts log, when its step changed
        since the last one: the node's lowest step (its slowest rank's), and when the
        node's ranks had all done it (the latest of their last steps at that step)."""
        stepped = [p for p in found.values() if p is not None and p.count]
        if not stepped:
            return
        step = min(p.step for p in stepped)
        if self._steps.get(self.attempt) == step:
            return
        self._steps[self.attempt] = step
        last = max(p.last for p in stepped if p.step == step)
        self._log_event(
            attempts.AttemptEvent(
                self.node, self.attempt, attempts.STEP, round(self._wall(last), 3), step
            )
        )

    def _wall(self, monotonic: float) -> float:
        """The wall time of a worker's CLOCK_MONOTONIC time, both clocks read now (not
        at the note's start: what it did since would be added). The monotonic clock is
        read first: a pause between the two reads (a loaded machine) then makes the result
        later, never earlier than the step, which would put a first step before its
        attempt's begin."""
        now = self._clock()
        return time.time() - (now - monotonic)

    def ended(self) -> None:
        """The attempt's group has ended: its last progress note, and its end and last
        step into the attempts log; once per attempt (the agent calls it when a group
        fails, and when it shuts down: a stop signal, the end)."""
        if self.attempt in self._ends:
            return
        self._ends.add(self.attempt)
        self._log_last(attempts.END)

    def stopping(self) -> None:
        """A stop signal came: the workers' progress now, noted and logged as the
        attempt's ``stop`` before the agent waits for them (SLURM may kill the step, the
        agent with it, before they end and ``ended`` can say more)."""
        if self.attempt not in self._ends:
            self._log_last(attempts.STOP)

    def _log_last(self, event: str) -> None:
        """The progress note, and ``event`` with the node's last step and its time."""
        self.note()
        now = self._clock()
        folder = self.folder(self.attempt)
        found = [progress.read(str(folder / f"local-{local}.progress")) for local in self._ranks]
        stepped = [p for p in found if p is not None and p.count]
        step = min((p.step for p in stepped), default=None)
        last = max((p.last for p in stepped), default=None)
        wall_now = time.time()
        step_time = round(wall_now - (now - last), 3) if last is not None else None
        self._log_event(
            attempts.AttemptEvent(
                self.node, self.attempt, event, round(wall_now, 3), step, step_time
            )
        )

    def _log_event(self, event: attempts.AttemptEvent) -> None:
        event = replace(event, node_rank=self.node_rank)
        try:
            attempts.append(self._job, self.requeue, event)
        except OSError as exc:
            log.debug("could not write the attempts log: %s", exc)
