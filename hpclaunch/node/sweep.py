"""What the workers start in the background ends with them.

A training script may start processes of its own: a tensorboard server, a prefetcher,
``cmd &`` from a shell, a daemon that forks twice and calls setsid. torch's agent stops
its workers only (each worker's process group), and when a worker exits, its children
are re-parented to init, where SLURM's ``proctrack/linuxproc`` (which follows parent
links) no longer finds them: they would outlive the job on the node.

So the agent makes itself a *child subreaper* (``Sweeper.start``): what a worker leaves
is re-parented to the agent instead, and stays in the step's process tree. After each
worker group stops (a restart in place) and when the agent ends, ``Sweeper.sweep`` ends
every descendant of the agent that a worker started: SIGTERM, ``SWEEP_GRACE_S`` to
exit, then SIGKILL, in passes that all end within ``KILL_TIME_S``: one sweep takes at
most ``SWEEP_GRACE_S + KILL_TIME_S``, twice that for a restart's sweep followed by the
agent's last one, well within SLURM's KillWait (30 s by default) while it holds off
stop signals.

Which descendants: torch and the zygote start each worker in a session of its own, and
a process cannot join another session, only start one; so all that a worker started
(in its process group, in a new session, re-parented after a double fork) is outside
the agent's session. The agent's own children in its session (the zygote, an scontrol
call) are never touched; those started in a session of their own (the etcd sidecar)
are ``spared`` by pid, with all they run. The worker guard (``worker_guard.py``,
``setpriv --pdeathsig``, the zygote) covers the other case: workers end when the agent
is killed, which leaves nobody to sweep.

Processes the agent adopted that end by themselves would stay zombies under it:
``reap`` reaps them while the workers run, session leaders (a worker's ``setsid``
child) too, except the ones the caller says it ``owns``: the agent's own children
outside its session whose exit status torch reads (its fresh workers; the zygote's
workers are the zygote's children). Nothing here touches CUDA.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass

from hpclaunch import procs
from hpclaunch.node.warmstart.zygote import STEP_SIGNALS, signals_deferred
from hpclaunch.procs import Proc

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
# How long what the workers left gets between SIGTERM and SIGKILL.
SWEEP_GRACE_S = 2.0
# How long all passes of SIGKILL may wait, together, for their targets to exit (a
# process in uninterruptible I/O may take longer: it is then named, and left).
KILL_TIME_S = 3.0
# Passes of SIGKILL: each one also finds what the last one's targets started meanwhile.
KILL_PASSES = 3
# Seconds between looks for adopted processes that ended by themselves.
REAP_EVERY_S = 1.0
# The log line names this many processes and counts the others.
NAMED = 8


def leftovers(
    table: Iterable[Proc], agent: int, session: int, spared: Collection[int] = ()
) -> list[Proc]:
    """The live descendants of ``agent`` outside its ``session``, parents before
    children, without the ``spared`` pids and their descendants (pure)."""
    children: dict[int, list[Proc]] = {}
    for proc in table:
        children.setdefault(proc.ppid, []).append(proc)
    out, queue = [], [agent]
    while queue:
        for child in sorted(children.get(queue.pop(0), []), key=lambda p: p.pid):
            if child.pid in spared or child.pid == agent:
                continue
            queue.append(child.pid)
            if not child.zombie and child.session != session:
                out.append(child)
    return out


def adopted_zombies(
    table: Iterable[Proc],
    agent: int,
    session: int,
    spared: Collection[int] = (),
    owned: Collection[int] = (),
) -> list[int]:
    """The ended children of ``agent`` that the agent may reap: outside its ``session``
    (where its own children are, their status read by their owner), neither ``spared``
    nor ``owned`` (its own children outside its session whose status torch reads: its
    fresh workers) (pure)."""
    return sorted(
        p.pid
        for p in table
        if p.ppid == agent
        and p.zombie
        and p.session != session
        and p.pid not in spared
        and p.pid not in owned
    )


def kill_wait(left_s: float, passes_left: int) -> float:
    """How long a pass of SIGKILL waits for its targets, with ``left_s`` of the sweep's
    time left and ``passes_left`` passes, this one included: an equal share, so that a
    process stuck in uninterruptible I/O does not take the later passes' time (pure)."""
    return max(0.0, left_s) / max(1, passes_left)


def outcome(
    termed: Collection[int],
    killed: Collection[int],
    left: list[tuple[int, str]],
    grace_s: float,
) -> list[tuple[int, str]]:
    """The log lines (level, text) that end a sweep: ``termed`` got SIGTERM, ``killed``
    SIGKILL (some of them found only after the SIGTERM: started meanwhile), ``left``
    (pid, command) still run as the sweep ends (pure)."""
    lines = []
    outlived = len(set(killed) & set(termed))
    later = len(set(killed) - set(termed))
    parts = [f"{outlived} of them outlived SIGTERM by {grace_s:g} s"] if outlived else []
    if later:
        parts.append(f"{later} {'was' if later == 1 else 'were'} started meanwhile")
    if parts:
        lines.append((logging.WARNING, f"{' and '.join(parts)}: SIGKILL"))
    stuck = [(pid, command) for pid, command in left if pid in killed]
    if stuck:
        lines.append((logging.ERROR, f"still running after SIGKILL: {describe(stuck)}"))
    unsignalled = [(pid, command) for pid, command in left if pid not in killed]
    if unsignalled:
        lines.append(
            (
                logging.ERROR,
                f"started after the last SIGKILL, left running: {describe(unsignalled)}",
            )
        )
    return lines


def describe(found: list[tuple[int, str]], named: int = NAMED) -> str:
    """``pid command`` of the first ``named`` processes, and how many more (pure)."""
    shown = [f"{pid} {_short(command)}" for pid, command in found[:named]]
    if len(found) > named:
        shown.append(f"and {len(found) - named} more")
    return "; ".join(shown)


def _short(command: str, width: int = 80) -> str:
    return command if len(command) <= width else command[: width - 3] + "..."


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants; False (and a warning)
    where the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
        return True
    log.warning(
        "prctl(PR_SET_CHILD_SUBREAPER) failed (%s): processes the workers start in the "
        "background and leave behind may outlive the job",
        os.strerror(ctypes.get_errno()),
    )
    return False


@dataclass
class _Target:
    """A process to end, held by a pidfd where the kernel has them (5.3 and later): a
    signal cannot reach another process that took its pid after it ended. Without one
    (``fd`` -1), its start time is checked before each signal."""

    proc: Proc
    fd: int

    @classmethod
    def open(cls, proc: Proc, pidfds: bool) -> _Target | None:
        fd = -1
        if pidfds:
            try:
                fd = os.pidfd_open(proc.pid)
            except ProcessLookupError:
                return None
            except OSError:  # ENOSYS: an older kernel
                fd = -1
        target = cls(proc, fd)
        if not target.running():  # gone, or its pid taken by another process
            target.close()
            return None
        return target

    def running(self) -> bool:
        """Not ended (a zombie has), and still the process found."""
        return procs.Tracked(self.proc.pid, self.proc.start_time).alive()

    def send(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.fd >= 0:
                signal.pidfd_send_signal(self.fd, sig)
            elif self.running():
                os.kill(self.proc.pid, sig)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _wait_exit(targets: list[_Target], timeout_s: float) -> list[_Target]:
    """Wait until every target has ended, up to ``timeout_s``; the ones still running.
    Woken by their pidfds, and every 20 ms where some have none."""
    deadline = time.monotonic() + timeout_s
    running = targets
    while True:
        running = [t for t in running if t.running()]
        left = deadline - time.monotonic()
        if not running or left <= 0:
            return running
        poller = select.poll()
        for target in running:
            if target.fd >= 0:
                poller.register(target.fd, select.POLLIN)
        if any(t.fd < 0 for t in running):
            left = min(left, 0.02)
        poller.poll(left * 1000)


@contextlib.contextmanager
def stop_signals_ignored() -> Iterator[None]:
    """What the agent does last runs to its end (the last sweep, its note for the
    supervisor): the agent is ending already, and torch's handlers of a stop signal
    raise, which would cut it short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in STEP_SIGNALS}
    held = {sig: handler for sig, handler in saved.items() if callable(handler)}
    for sig in held:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


class Sweeper:
    """The agent's hold on what its workers start (see the module's docstring)."""

    def __init__(
        self, spared: Collection[int] = (), grace_s: float = SWEEP_GRACE_S, pidfds: bool = True
    ) -> None:
        """``pidfds=False``: processes are signalled and watched by pid, as on kernels
        without pidfds (before 5.3), where that is what happens anyway."""
        self.pid = os.getpid()
        self.session = os.getsid(0)
        self.spared = frozenset(spared)
        self.grace_s = grace_s
        self.pidfds = pidfds
        self._next_reap = 0.0

    @classmethod
    def start(cls, spared: Collection[int] = ()) -> Sweeper:
        """This process made the subreaper of what it starts, and its sweeper.
        ``spared``: pids of helpers that run in sessions of their own."""
        become_subreaper()
        return cls(spared)

    def sweep(self, when: str, *, owned: Collection[int], final: bool = False) -> int:
        """End what the workers left running: SIGTERM, SIGKILL after ``grace_s``; one
        log line names them, saying ``when``; then reap the adopted zombies but the
        ``owned`` (see ``reap``). ``final``: the agent's last sweep, which a stop signal
        does not interrupt (else the signal's handler runs after it). Returns how many
        processes were found."""
        with stop_signals_ignored() if final else signals_deferred():
            return self._sweep(when, owned)

    def _sweep(self, when: str, owned: Collection[int]) -> int:
        targets = self._targets()
        if not targets:
            self._reap_zombies(owned)
            return 0
        found = [(t.proc.pid, procs.command_line(t.proc.pid)) for t in targets]
        log.info(
            "ending %d %s the workers left running %s (SIGTERM, SIGKILL after %g s): %s",
            len(found),
            "process" if len(found) == 1 else "processes",
            when,
            self.grace_s,
            describe(found),
        )
        termed = {t.proc.pid for t in targets}
        for target in targets:
            target.send(signal.SIGTERM)
            target.send(signal.SIGCONT)  # a stopped process acts on SIGTERM only so
        _wait_exit(targets, self.grace_s)
        _close(targets)
        killed, left = self._kill(time.monotonic() + KILL_TIME_S)
        described = [(p.pid, procs.command_line(p.pid)) for p in left]
        for level, line in outcome(termed, killed, described, self.grace_s):
            log.log(level, "%s", line)
        self._reap_zombies(owned)
        return len(termed | killed)

    def _kill(self, deadline: float) -> tuple[set[int], list[Proc]]:
        """SIGKILL what still runs, in up to KILL_PASSES passes that end by ``deadline``;
        the pids killed, and what still runs after the last pass."""
        killed: set[int] = set()
        for passes_left in range(KILL_PASSES, 0, -1):
            targets = self._targets()
            if not targets:
                return killed, []
            for target in targets:
                target.send(signal.SIGKILL)
            killed.update(t.proc.pid for t in targets)
            _wait_exit(targets, kill_wait(deadline - time.monotonic(), passes_left))
            _close(targets)
        return killed, leftovers(procs.snapshot(), self.pid, self.session, self.spared)

    def _targets(self) -> list[_Target]:
        found = leftovers(procs.snapshot(), self.pid, self.session, self.spared)
        targets = (_Target.open(proc, self.pidfds) for proc in found)
        return [t for t in targets if t is not None]

    def reap(self, owned: Collection[int]) -> None:
        """Reap the adopted processes that ended by themselves, at most once every
        REAP_EVERY_S (called at every look at the workers). ``owned``: the agent's
        own children outside its session, whose exit status torch reads (its fresh
        workers' pids): never reaped here."""
        now = time.monotonic()
        if now < self._next_reap:
            return
        self._next_reap = now + REAP_EVERY_S
        self._reap_zombies(owned)

    def _reap_zombies(self, owned: Collection[int]) -> None:
        children = procs.children(self.pid)
        for pid in adopted_zombies(children, self.pid, self.session, self.spared, owned):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _close(targets: list[_Target]) -> None:
    for target in targets:
        target.close()
