"""Warm worker start: workers forked from a copy of the agent that has imported torch.

torchrun starts every worker as a fresh interpreter, so each one imports torch again
(about 1.5 s of CPU here, more from a shared filesystem), at launch and after every
restart. The agent imports torch anyway; right after that, before anything has touched
CUDA or started a thread, it forks a **zygote**: a single-threaded copy of itself that
does nothing but fork workers on request. A worker forked from it has torch in memory
already, shares its pages with the zygote, and starts in milliseconds.

A forked worker must still look like ``python -u script.py args`` run by torchrun;
``become_worker`` sets up what a fresh interpreter would have (see its steps). What
cannot be made the same, and is documented: modules the agent had imported (torch,
click, hpclaunch) are already in ``sys.modules``, and ``PYTHONHASHSEED`` and other
interpreter start-up settings are the agent's.

Lifetimes: the zygote dies with the agent (``PR_SET_PDEATHSIG``, and it ends when
the agent's end of the connection closes), and each worker dies with the zygote.
The zygote reports a worker's exit without reaping it: the pid (and the process group
the agent signals) cannot be taken by another process until the agent releases it.

This module imports nothing of torch; ``fork`` expects the caller to have imported it.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import logging
import os
import select
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from hpclaunch.node.warmstart.forked_worker import ForkRequest, become_worker, prctl_pdeathsig

log = logging.getLogger(__name__)

# The signals SLURM and the agent use on a job step. The zygote ignores them (it ends
# when the agent does); workers get them back as a fresh interpreter would have them.
STEP_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
    signal.SIGTSTP,
)


# How long the agent waits for the zygote to answer a request before it gives up on
# the zygote (stopped, or stuck) and starts workers fresh.
ANSWER_TIMEOUT_S = 10.0
# How long the zygote gets to stop its workers itself when the agent lets it go.
END_TIMEOUT_S = 2.0


class Message(enum.Enum):
    """What travels between the agent and its zygote: a tuple of a kind and its values."""

    SPAWN = "spawn"  # agent -> zygote: (SPAWN, ForkRequest)
    REAP = "reap"  # agent -> zygote: (REAP, [pid, ...]) of reported exits
    PID = "pid"  # zygote -> agent: (PID, pid), the answer to SPAWN
    ERROR = "error"  # zygote -> agent: (ERROR, text), the answer to a SPAWN it could not do
    EXIT = "exit"  # zygote -> agent: (EXIT, pid, returncode), at any time


class ZygoteError(RuntimeError):
    """The zygote could not be started, or stopped answering."""


def _dispositions(handled: Iterable[int] = ()) -> dict[int, Any]:
    """What each catchable signal would be after an exec into a fresh ``python``:
    ignored stays ignored, anything else the default; then Python's own start-up
    (KeyboardInterrupt on SIGINT, SIGPIPE and SIGXFSZ ignored).

    ``handled``: the signals torch's agent will have a handler for by the time it
    starts workers (an exec resets those to the default, even if ignored now)."""
    kept: dict[int, Any] = {}
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            now = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        kept[int(sig)] = signal.SIG_IGN if now is signal.SIG_IGN else signal.SIG_DFL
    for handled_sig in handled:
        kept[int(handled_sig)] = signal.SIG_DFL
    kept[int(signal.SIGINT)] = signal.default_int_handler
    kept[int(signal.SIGPIPE)] = signal.SIG_IGN
    kept[int(signal.SIGXFSZ)] = signal.SIG_IGN
    return kept


class Zygote:
    """The agent's handle on its zygote."""

    def __init__(self, pid: int, conn: Connection) -> None:
        self.pid = pid
        self._conn = conn
        self._workers: set[int] = set()  # started and not yet released
        self._exits: dict[int, int] = {}  # worker pid -> returncode (Popen's convention)
        self.gone = False  # the zygote ended: nothing more can be started from it
        self._reaped = False

    @classmethod
    def fork(cls, handled: Iterable[int] = ()) -> Zygote:
        """Fork the zygote from this process, which must have a single thread.

        ``handled``: see ``_dispositions``. Raises ZygoteError when there are other
        threads (a fork would copy the locks they hold), OSError when fork fails."""
        threads = len(os.listdir("/proc/self/task"))
        if threads != 1:
            raise ZygoteError(
                f"the agent has {threads} threads once torch is imported, and forking it "
                "could copy a lock another thread holds; a library loaded with torch "
                "started them (numpy's OpenBLAS is kept to one thread at import)"
            )
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        dispositions = _dispositions(handled)
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        # What the agent has made stays out of the zygote's and the workers' collections:
        # they would write to every object, and so copy the pages they share with the
        # agent (copy-on-write), and spend time on them at every worker's exit.
        gc.freeze()
        try:
            pid = os.fork()
        except OSError:
            gc.unfreeze()
            raise
        if pid == 0:  # the zygote
            code = 1
            try:
                ours.close()
                prctl_pdeathsig()
                if os.getppid() == parent:
                    _serve(Connection(theirs.detach()), dispositions)
                    code = 0
            except BaseException:
                log.exception("the zygote (pid %d) failed; workers start fresh", os.getpid())
            finally:
                os._exit(code)
        gc.unfreeze()  # the agent collects as before
        theirs.close()
        return cls(pid, Connection(ours.detach()))

    def spawn(self, start: ForkRequest) -> int:
        """Start a worker; return its pid, which leads its own session already.

        Call it inside ``signals_deferred()`` where the pid must not be lost to a
        signal's handler raising the moment this returns."""
        if self.gone:
            raise ZygoteError(f"the zygote (pid {self.pid}) has ended")
        try:
            with signals_deferred():  # a handler raising mid-message would lose the stream
                self._conn.send((Message.SPAWN, start))
                while True:
                    if not self._conn.poll(ANSWER_TIMEOUT_S):
                        self._ended()
                        self.close()
                        raise ZygoteError(
                            f"the zygote (pid {self.pid}) did not answer in "
                            f"{ANSWER_TIMEOUT_S:.0f} s; it was killed"
                        )
                    kind, *rest = self._conn.recv()
                    if kind is Message.EXIT:
                        self._exits[rest[0]] = rest[1]
                    elif kind is Message.PID:
                        self._workers.add(rest[0])
                        return int(rest[0])
                    else:
                        raise ZygoteError(f"the zygote could not start a worker: {rest[0]}")
        except (EOFError, OSError) as exc:
            self._ended()
            raise ZygoteError(f"the zygote (pid {self.pid}) is gone: {exc}") from None

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for news of a worker's exit; True if there is some."""
        if self.gone:
            return True
        try:
            return self._conn.poll(timeout)
        except (EOFError, OSError):
            return True

    def returncodes(self) -> dict[int, int]:
        """Every exit reported so far: pid -> returncode (negative: killed by a signal).

        When the zygote has ended, its workers have too (they die with it): each one
        not reported is given as killed by SIGKILL."""
        if not self.gone:
            try:
                if not self._conn.poll(0):  # nothing new: no handlers to swap
                    return dict(self._exits)
                with signals_deferred():
                    while self._conn.poll(0):
                        kind, *rest = self._conn.recv()
                        if kind is Message.EXIT:
                            self._exits[rest[0]] = rest[1]
            except (EOFError, OSError):
                self._ended()
        return dict(self._exits)

    def release(self, pids: Iterable[int]) -> None:
        """Let the zygote reap these exited workers: their pids may be reused after."""
        done = [pid for pid in pids if pid in self._exits]
        for pid in done:
            self._workers.discard(pid)
            del self._exits[pid]
        if done and not self.gone:
            try:
                with signals_deferred():
                    self._conn.send((Message.REAP, done))
            except OSError:
                self._ended()

    def _ended(self) -> None:
        self.gone = True
        for pid in self._workers:
            self._exits.setdefault(pid, -int(signal.SIGKILL))

    def close(self) -> None:
        """End the zygote and reap it: told by the end of the connection, it kills the
        groups of the workers still running, and gets END_TIMEOUT_S to do so before it
        is killed (its workers then die with it). Once is enough."""
        if self._reaped:
            return
        self._reaped = True
        self._conn.close()
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:
            pidfd = -1
        if pidfd >= 0:
            waiting = select.poll()
            waiting.register(pidfd, select.POLLIN)
            waiting.poll(END_TIMEOUT_S * 1000)
            os.close(pidfd)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Run the Python handlers of the step's signals after the block, not inside it.

    torch's handlers raise: inside a message to or from the zygote that would cut the
    stream, and right after a spawn it would lose the worker's pid. Masking the signals
    is not enough: another thread of the agent takes them, and Python then runs the
    handler in the main thread at the next bytecode. So the handlers themselves wait:
    each signal that comes is noted and its handler runs once the block is over."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    holding = True
    handlers: dict[int, Callable[[int, Any], Any]] = {}

    def note(signum: int, frame: Any) -> None:
        if holding:
            noted.append(signum)
        else:  # left in place by a handler that raised while they were put back
            handlers[signum](signum, frame)

    try:
        for sig in STEP_SIGNALS:
            handler = signal.getsignal(sig)
            if callable(handler):
                handlers[int(sig)] = handler
                signal.signal(sig, note)
        yield
    finally:
        holding = False
        for signum, handler in handlers.items():
            if signal.getsignal(signum) is note:
                signal.signal(signum, handler)
        for signum in dict.fromkeys(noted):
            handlers[signum](signum, None)


def _serve(conn: Connection, dispositions: dict[int, Any]) -> None:
    """The zygote's loop: fork workers on request, report their exits, end with the agent."""
    for sig in STEP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    running: set[int] = set()  # started, exit not reported
    exited: set[int] = set()  # reported, kept as zombies until the agent releases them
    me = os.getpid()
    try:
        while True:
            try:
                ready, _, _ = select.select([conn.fileno(), wake_r], [], [])
            except InterruptedError:
                continue
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                _report_exits(conn, running, exited)
            if conn.fileno() in ready:
                kind, payload = conn.recv()
                if kind is Message.REAP:
                    for pid in set(payload) & exited:
                        exited.discard(pid)
                        with contextlib.suppress(ChildProcessError):
                            os.waitpid(pid, 0)
                    continue
                pid = _fork_worker(conn, payload, me, dispositions, (wake_r, wake_w))
                if pid:
                    running.add(pid)
                    conn.send((Message.PID, pid))
    except (EOFError, OSError):  # the agent closed its end, or is gone: so are we
        for pid in running:
            kill_group(pid, signal.SIGKILL)


def _fork_worker(
    conn: Connection,
    start: ForkRequest,
    me: int,
    dispositions: dict[int, Any],
    wake: tuple[int, int],
) -> int:
    """Fork a worker; its pid once it leads its own session (the agent signals that
    group), or 0 when the fork failed (the agent is told)."""
    try:
        ready_r, ready_w = os.pipe()
    except OSError as exc:
        conn.send((Message.ERROR, f"pipe: {exc}"))
        return 0
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(ready_r)
        os.close(ready_w)
        conn.send((Message.ERROR, f"fork: {exc}"))
        return 0
    if pid == 0:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            conn.close()
            for fd in (*wake, ready_r):
                os.close(fd)
            code = become_worker(start, me, dispositions, ready_w)
        except BaseException:  # before the script ran: into the rank's stderr log
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(ready_w)
    with contextlib.suppress(OSError):
        os.read(ready_r, 1)  # b"" when it ended first: its exit is reported as any other
    os.close(ready_r)
    return pid


def _report_exits(conn: Connection, running: set[int], exited: set[int]) -> None:
    """Tell the agent of each worker that ended, leaving it unreaped (WNOWAIT)."""
    for pid in sorted(running):
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # not ours any more: cannot be told how it ended
            code = -int(signal.SIGKILL)
        else:
            if info is None:
                continue
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        running.discard(pid)
        exited.add(pid)
        conn.send((Message.EXIT, pid, code))


def kill_group(pid: int, sig: int) -> None:
    """Signal a worker's process group (it leads its own session); gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
