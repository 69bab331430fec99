"""The layers of a job watch each other, so that a stopped process (SIGSTOP, a process
stuck on a dead NFS mount, a deadlock) never holds the allocation until the time limit.

- **The supervisor watches srun** (same host: ``/proc/PID/stat``) and **the agents**
  (their progress notes, every ``NOTE_S`` = 10 s while workers train, and their end
  notes, hpclaunch.jobdir.follow), from the loop that waits for the step:

  * srun stopped (state T) for the bound, or srun still running the bound after every
    agent of the run noted its end: srun is killed and the supervisor goes on with what
    the agents noted (all ended 0: the training finished);
  * an agent that noted progress before in its current attempt (one restarted in place
    is starting its workers, bounded by its own first-step watch), then nothing for the
    bound while another agent's notes go on, is named in the batch log and status, once
    (its workers may still be training: nothing is done; one that never noted may have
    no workers). An
    agent whose workers ended (its attempts log's end) is waiting for the others at
    torch's exit barrier, not silent. When no agent's notes go on any more (the others
    ended, their workers ended, or they were silent for the bound too), the step is
    ended (srun killed) and the job requeued without the silent agent's node, as after
    a dead agent. Whether its workers finished cannot be told from the batch host, so
    a finished training is never assumed: the next run resumes from the latest
    checkpoint. When every agent falls silent at once, no agent is singled out (a job
    folder that stopped taking notes looks the same): the
    hang watch and the time limit still stand.

- **The agents watch the supervisor**: it rewrites a heartbeat file from the same loop
  (hpclaunch.jobdir.heartbeat). An agent whose run has ended waits until it sees the
  beat move; when it does not move for the bound, the agents' deputy
  (hpclaunch.recovery.deputy) ends the job or requeues it in the supervisor's place.

The bound is one number of seconds, ``hpclaunch sbatch --watch-timeout`` (default 60,
at least 20: two note intervals, so that slow notes never end a healthy job); the
supervisor writes it into its heartbeat, where the agents read it. No torch.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpclaunch import procs
from hpclaunch.contract.supervisor import DEFAULT_WATCH_TIMEOUT_S
from hpclaunch.jobdir import attempts, follow, heartbeat, silent_agents
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.slurm.commands import NodeState

log = logging.getLogger("hpclaunch.recovery.supervisor")  # the supervisor's lines

DEFAULT_BOUND_S = float(DEFAULT_WATCH_TIMEOUT_S)
READ_S = 5.0  # between two reads of the run's notes by the supervisor
BEAT_S = 1.0  # between two heartbeats of the supervisor
LOOK_S = 0.5  # between two looks at the heartbeat by an agent
# torch's agents wait this long for each other once their workers ended (the elastic
# agent's exit_barrier_timeout, which hpclaunch leaves at torch's default): an agent
# whose workers ended is waiting, not silent, for this long.
EXIT_BARRIER_S = 300.0
# A gap between two ticks (or looks) this much longer than their interval is time the
# watcher did not run: SLURM suspended the job (scontrol suspend, PreemptMode=SUSPEND,
# gang scheduling), or the process was stopped and continued. The monotonic clock ran
# on meanwhile, but nobody could note anything: that time is not silence.
SUSPENDED_S = 2 * READ_S


class StallKind(enum.Enum):
    SRUN = "srun"  # srun stopped, or left running after every agent ended
    AGENT = "agent"  # agents that stopped noting progress


@dataclass(frozen=True)
class Stall:
    """Why the supervisor ended the step."""

    kind: StallKind
    message: str  # for the batch log and the history's error
    nodes: tuple[str, ...] = ()  # the silent agents' nodes (AGENT)
    # The statuses every agent of the run noted, when each did: the step's outcome.
    statuses: Mapping[str, int] | None = None
    # The statuses the other agents noted (AGENT): the silent ones' peers.
    others: Mapping[str, int] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """Every agent noted its end: the step's outcome is known without srun."""
        return self.statuses is not None


def finished_without_lost(stall: Stall, states: Mapping[str, NodeState]) -> Stall | None:
    """``stall`` as finished when its silent agents are on nodes SLURM says are lost
    (down, failed, not responding) and every other agent ended 0: a ``--nodes MIN:MAX
    --no-kill`` job whose survivors trained on without them; srun only waited for SLURM
    to notice. None otherwise (a stopped agent on a live node: its workers' end is not
    known). Pure."""
    if stall.kind is not StallKind.AGENT or not stall.others:
        return None
    if any(status != 0 for status in stall.others.values()):
        return None
    if not all(node in states and states[node].lost for node in stall.nodes):
        return None
    lost = ", ".join(stall.nodes)
    message = (
        f"the agent on {lost} noted nothing, and SLURM says {lost} is lost; every other "
        "agent ended 0: the training finished without it"
    )
    return Stall(stall.kind, message, stall.nodes, dict(stall.others), stall.others)


@dataclass(frozen=True)
class Seen:
    """What the supervisor has seen of the step, on its own monotonic clock."""

    nodes: tuple[str, ...]
    started: float  # when the watch began
    changed: Mapping[str, float]  # node -> when its progress note last changed
    ended: Mapping[str, float]  # node -> when its end note was first seen
    statuses: Mapping[str, int]  # node -> the status its end note says
    srun_stopped: float | None  # since when srun is seen stopped (state T)
    flagged: frozenset[str] = frozenset()  # named silent while others went on
    # node -> since when its workers are seen ended (its attempts log's end or stop),
    # while the agent waits for the others (torch's exit barrier: up to 300 s)
    resting: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Judgement:
    warn: tuple[str, ...] = ()  # newly silent agents while others go on
    live: tuple[str, ...] = ()  # the agents whose notes go on (for the warning)
    stall: Stall | None = None


def judge(seen: Seen, now: float, bound: float) -> Judgement:
    """What the watch does now. Pure."""
    nodes = seen.nodes
    last_end = max(seen.ended.values(), default=None)
    statuses = dict(seen.statuses) if all(n in seen.statuses for n in nodes) else None
    if statuses is not None and last_end is not None and now - last_end >= bound:
        what = f"had not exited {bound:g} s after every agent noted its end"
        return Judgement(stall=Stall(StallKind.SRUN, _srun_stuck(what), (), statuses))
    if seen.srun_stopped is not None and now - seen.srun_stopped >= bound:
        what = f"was stopped (state T) for {bound:g} s"
        return Judgement(stall=Stall(StallKind.SRUN, _srun_stuck(what), (), statuses))
    rested = [*seen.ended.values(), *seen.resting.values()]
    last_rest = max(rested, default=-math.inf)

    def since(node: str) -> float:
        """When ``node``'s silence counts from: its last note, or, unless it was already
        named, the latest end or rest of another agent (it may be the next to end)."""
        changed = max(seen.changed.get(node, seen.started), seen.started)
        return changed if node in seen.flagged else max(changed, last_rest)

    running = [n for n in nodes if n not in seen.ended and n not in seen.resting]
    quiet = [n for n in running if now - since(n) >= bound]
    live = tuple(n for n in running if n not in quiet)
    if live:
        # Only an agent that noted progress before can be told to have stopped: one that
        # never noted may have no workers (a --node-multiple spare standing by) or run a
        # script that reports no progress on its ranks.
        fresh = tuple(n for n in quiet if n not in seen.flagged and n in seen.changed)
        return Judgement(warn=fresh, live=live)
    # Nobody's notes go on. Single out agents that fell silent while others went on; or,
    # once others ended or rested, agents that noted progress before and nothing since
    # (a script that reports no progress writes no notes: such an agent could be busy);
    # or agents whose workers ended that outlived the others' ends by the bound.
    silent = [n for n in quiet if n in seen.flagged]
    if not silent and rested:
        silent = [n for n in quiet if n in seen.changed]
    # An agent whose workers ended waits at torch's exit barrier for the others, up to
    # EXIT_BARRIER_S, even after they ended (a rank 0 that saved past the others'
    # barrier): only past that and the bound is it stuck.
    waited = EXIT_BARRIER_S + bound
    stuck = [
        n
        for n in nodes
        if n in seen.resting
        and n not in seen.ended
        and last_end is not None
        and now - max(last_end, seen.resting[n]) >= waited
    ]
    silent += stuck
    if not silent:
        return Judgement()
    which = ", ".join(silent)
    message = (
        f"the agent on {which} noted no progress and no end for {bound:g} s or more "
        "while the others went on; the supervisor ended the step"
        if len(stuck) < len(silent)
        else f"the agent on {which} noted no end {waited:g} s after its workers and the "
        f"others ended (torch's exit barrier waits {EXIT_BARRIER_S:g} s); the supervisor "
        "ended the step"
    )
    others = {n: s for n, s in seen.statuses.items() if n not in silent}
    return Judgement(stall=Stall(StallKind.AGENT, message, tuple(silent), None, others))


# Beyond SLURM's window, what the supervisor may spend deciding after the step: a test
# write into each shared folder (hpclaunch.recovery.verdicts, 30 s each), SLURM's node
# states for a silent agent, the history's lock.
DECIDING_EXTRA_S = 120.0


def deciding_s(bound: float, signal_lead_s: float, patience_s: float) -> float:
    """The bound the supervisor's beat names while it decides after the step: the
    watch's bound, plus the longest window it tries SLURM's controller for (after a
    signal: its lead; else its patience), plus DECIDING_EXTRA_S. Pure."""
    return bound + max(signal_lead_s, patience_s) + DECIDING_EXTRA_S


def _srun_stuck(what: str) -> str:
    return f"srun (the job step, on the batch host) {what}; the supervisor killed it"


@dataclass
class StepWatch:
    """The supervisor's watch of the step it waits for (see the module): ``tick`` is
    called from that wait loop, often; it beats, looks at srun, and reads the notes
    every READ_S. Returns a Stall when the step must be ended."""

    job_dir: Path
    requeue: int
    nodes: tuple[str, ...]
    bound: float
    clock: Callable[[], float] = time.monotonic
    # The bound the last beat names while the supervisor decides after the step (see
    # ``deciding``); None: the watch's bound.
    deciding_s: float | None = None
    _beat: heartbeat.Beat | None = None
    _next_beat: float = 0.0
    _next_read: float = 0.0
    _started: float | None = None
    _notes: dict[str, float] = field(default_factory=dict)  # node -> its note's time
    _noted_attempt: dict[str, int] = field(default_factory=dict)  # node -> its note's attempt
    _changed: dict[str, float] = field(default_factory=dict)
    _ended: dict[str, float] = field(default_factory=dict)
    _statuses: dict[str, int] = field(default_factory=dict)
    _srun_stopped: float | None = None
    _flagged: set[str] = field(default_factory=set)
    _resting: dict[str, float] = field(default_factory=dict)
    _beat_failed: bool = False
    _broken: bool = False
    _last_tick: float | None = None
    _follower: follow.Follower | None = None

    def beat(self) -> None:
        """Rewrite the heartbeat, at most every BEAT_S; a missed beat is logged once."""
        now = self.clock()
        if now < self._next_beat:
            return
        self._next_beat = now + BEAT_S
        try:
            if self._beat is None:
                self._beat = heartbeat.Beat(JobFolder(self.job_dir), self.requeue, self.bound)
            self._beat.beat()
        except OSError as exc:
            if not self._beat_failed:
                log.warning(
                    "supervisor: cannot write the heartbeat the agents watch (%s); the "
                    "agents will not take over if this supervisor stops",
                    exc,
                )
            self._beat_failed = True

    def deciding(self) -> None:
        """The step ended and the supervisor decides what follows (the failure records,
        SLURM's controller, its patience: minutes, without a loop that beats). One beat
        that names ``deciding_s``: an agent that outlived srun waits that long for the
        beat to move before its deputy acts, not the watch's bound (both would act)."""
        if self.deciding_s is None:
            return
        if self._beat is None:
            self._beat = heartbeat.Beat(JobFolder(self.job_dir), self.requeue, self.bound)
        self._beat.bound_s = self.deciding_s
        self._next_beat = 0.0
        self.beat()

    def decided(self) -> None:
        """The supervisor has acted: one last beat, which the agents that wait see move."""
        self._next_beat = 0.0
        self.beat()
        self.close()

    def close(self) -> None:
        if self._beat is not None:
            self._beat.close()

    def tick(self, srun_pid: int) -> Stall | None:
        """Beat, look, judge: the Stall when the step must be ended. A watch that fails
        (a bug) says so once and watches no more: it is worth less than the job."""
        if self._broken:
            self.beat()
            return None
        try:
            return self._tick(srun_pid)
        except Exception:
            log.exception("supervisor: the watch of srun and the agents failed; it stops")
            self._broken = True
            return None

    def _tick(self, srun_pid: int) -> Stall | None:
        self.beat()
        now = self.clock()
        if self._started is None:
            self._started = now
        if self._last_tick is not None and now - self._last_tick > SUSPENDED_S:
            self._shift(now - self._last_tick)
        self._last_tick = now
        if procs.state(srun_pid) == "T":
            if self._srun_stopped is None:
                self._srun_stopped = now
                log.warning(
                    "supervisor: srun (pid %d) is stopped; it is killed if it stays "
                    "stopped for %g s",
                    srun_pid,
                    self.bound,
                )
        else:
            self._srun_stopped = None
        if now >= self._next_read:
            self._next_read = now + READ_S
            self._read(now)
        seen = Seen(
            self.nodes,
            self._started,
            dict(self._changed),
            dict(self._ended),
            dict(self._statuses),
            self._srun_stopped,
            frozenset(self._flagged),
            dict(self._resting),
        )
        judgement = judge(seen, now, self.bound)
        for node in judgement.warn:
            self._flagged.add(node)
            self._note_silent(node, judgement.live)
            log.warning(
                "supervisor: warning: the agent on %s has noted no progress for %g s "
                "while the agents on %s go on (a stopped or stuck agent: its workers "
                "may still train, its hang watch is blind); the step is ended when "
                "the others end or fall silent too",
                node,
                self.bound,
                ", ".join(judgement.live),
            )
        return judgement.stall

    def _shift(self, gap: float) -> None:
        """The supervisor did not run for ``gap`` seconds (see SUSPENDED_S): every time
        the watch counts from moves on by it, as if the clock had stood still."""
        log.info(
            "supervisor: the watch did not run for %.0f s (the job suspended, or this "
            "process stopped); that time is not counted as silence",
            gap,
        )
        assert self._started is not None
        self._started += gap
        for times in (self._changed, self._ended, self._resting):
            for node in times:
                times[node] += gap
        if self._srun_stopped is not None:
            self._srun_stopped += gap

    def _note_silent(self, node: str, live: tuple[str, ...]) -> None:
        """For ``hpclaunch status``; the batch log's line says it either way."""
        note = silent_agents.SilentAgent(node, time.time(), self.bound, live)
        try:
            silent_agents.write(JobFolder(self.job_dir), self.requeue, note)
        except OSError as exc:
            log.debug("supervisor: could not note the silent agent: %s", exc)

    def _unnote_silent(self, node: str) -> None:
        try:
            silent_agents.remove(JobFolder(self.job_dir), self.requeue, node)
        except OSError as exc:
            log.debug("supervisor: could not remove the silent agent's note: %s", exc)

    def _read(self, now: float) -> None:
        if self._follower is None:
            self._follower = follow.Follower(JobFolder(self.job_dir), self.requeue)
        run = self._follower.read()
        for note in run.progress:
            if self._notes.get(note.node) != note.time:
                if note.node in self._flagged and note.node in self._notes:
                    # Its notes go on again (it was stopped and continued, or its job
                    # folder answered again): it is no longer taken for silent.
                    self._flagged.discard(note.node)
                    log.info("supervisor: the agent on %s notes progress again", note.node)
                    self._unnote_silent(note.node)
                self._notes[note.node] = note.time
                self._noted_attempt[note.node] = note.attempt
                self._changed[note.node] = now
        for node, latest in run.latest.items():  # by attempt and time
            if latest.event in (attempts.END, attempts.STOP):
                self._resting.setdefault(node, now)
            else:
                self._resting.pop(node, None)
            if latest.attempt > self._noted_attempt.get(node, latest.attempt):
                # Restarted in place and not stepped yet: its workers start (torch's
                # import, a checkpoint's load, the first step's data), which the agent's
                # own first-step watch bounds, and which writes no note. Its silence
                # counts as a first attempt's does: it is taken for stopped only once it
                # noted in this attempt, not from the last note of the attempt before.
                self._changed.pop(node, None)
                if node in self._flagged:
                    self._flagged.discard(node)
                    log.info("supervisor: the agent on %s began attempt %d", node, latest.attempt)
                    self._unnote_silent(node)
        for end in run.ends:
            if end.node not in self._ended:
                self._ended[end.node] = now
                self._statuses[end.node] = end.status


def supervisor_silent(
    job_dir: Path,
    requeue: int,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float | None:
    """For an agent whose run has ended: None once the supervisor's heartbeat is seen
    to move (or when there is none to watch); else, after the bound the heartbeat
    names without a move, the seconds waited. Raises OSError."""
    folder = JobFolder(job_dir)
    first = heartbeat.read(folder, requeue)
    if first is None:
        return None
    bound = heartbeat.bound_s(first) or DEFAULT_BOUND_S
    start = last = clock()
    while clock() - start < bound:
        sleep(LOOK_S)
        if heartbeat.read(folder, requeue) != first:
            return None
        now = clock()
        if now - last > SUSPENDED_S:  # the job was suspended: the supervisor too
            start += now - last
        last = now
    return clock() - start
