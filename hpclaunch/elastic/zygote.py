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

import atexit
import builtins
import contextlib
import ctypes
import gc
import importlib.machinery
import io
import locale
import logging
import multiprocessing
import os
import random
import runpy
import select
import signal
import socket
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15

# The signals SLURM and the agent use on a job step. The zygote ignores them (it ends
# when the agent does); workers get them back as a fresh interpreter would have them.
STEP_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
    signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT, signal.SIGTSTP,
)  # fmt: skip


class ZygoteError(RuntimeError):
    """The zygote could not be started, or stopped answering."""


@dataclass(frozen=True)
class WorkerStart:
    """One worker to start: what ``python -u ARGV...`` with ``env`` in ``cwd`` would be.

    ``python_args`` are the interpreter's arguments after the executable: ``-u``, then
    ``SCRIPT ARGS...`` or ``-m MODULE ARGS...``. ``stdout``/``stderr`` are files to
    write the streams to (truncated), or "" to keep the agent's.
    """

    python_args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    stdout: str = ""
    stderr: str = ""


def parse_python_args(args: Sequence[str]) -> tuple[str, str, list[str]]:
    """("script"|"module", target, argv tail) from ``-u SCRIPT ARGS`` / ``-u -m MOD ARGS``.

    Raises ValueError for anything else: those workers are started fresh.
    """
    rest = list(args)
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    if rest[:1] == ["-m"] and len(rest) >= 2:
        return "module", rest[1], rest[2:]
    if rest and not rest[0].startswith("-"):
        return "script", rest[0], rest[1:]
    raise ValueError(f"not a script or -m module command line: {list(args)!r}")


def _set_name(name: str) -> None:
    """The process name ps and top show (a fresh worker's is its interpreter's)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _prctl_pdeathsig() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _dispositions() -> dict[int, Any]:
    """What each catchable signal would be after an exec into a fresh ``python``:
    ignored stays ignored, anything else the default; then Python's own start-up
    (KeyboardInterrupt on SIGINT, SIGPIPE and SIGXFSZ ignored)."""
    kept: dict[int, Any] = {}
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            now = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        kept[int(sig)] = signal.SIG_IGN if now is signal.SIG_IGN else signal.SIG_DFL
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

    @classmethod
    def fork(cls) -> Zygote:
        """Fork the zygote from this (single-threaded) process."""
        threads = len(os.listdir("/proc/self/task"))
        if threads != 1:
            raise ZygoteError(f"the agent has {threads} threads; a fork now would be unsafe")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        dispositions = _dispositions()
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the zygote
            code = 1
            try:
                ours.close()
                _prctl_pdeathsig()
                if os.getppid() == parent:
                    _serve(Connection(theirs.detach()), dispositions)
                    code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        theirs.close()
        return cls(pid, Connection(ours.detach()))

    def spawn(self, start: WorkerStart) -> int:
        """Start a worker; return its pid, which leads its own session already.

        Call it inside ``signals_deferred()`` where the pid must not be lost to a
        signal's handler raising the moment this returns."""
        if self.gone:
            raise ZygoteError(f"the zygote (pid {self.pid}) has ended")
        try:
            with signals_deferred():  # a handler raising mid-message would lose the stream
                self._conn.send(("spawn", start))
                while True:
                    kind, *rest = self._conn.recv()
                    if kind == "exit":
                        self._exits[rest[0]] = rest[1]
                    elif kind == "pid":
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
                with signals_deferred():
                    while self._conn.poll(0):
                        kind, *rest = self._conn.recv()
                        if kind == "exit":
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
                    self._conn.send(("reap", done))
            except OSError:
                self._ended()

    def _ended(self) -> None:
        self.gone = True
        for pid in self._workers:
            self._exits.setdefault(pid, -int(signal.SIGKILL))

    def close(self) -> None:
        """End the zygote (its workers die with it) and reap it."""
        self._conn.close()
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
    holding = [True]
    handlers: dict[int, Callable[[int, Any], Any]] = {}

    def note(signum: int, frame: Any) -> None:
        if holding[0]:
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
        holding[0] = False
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
    # What the agent made stays shared with the workers: their collections neither
    # touch it (copy-on-write) nor spend time on it.
    gc.collect()
    gc.freeze()
    running: set[int] = set()  # started, exit not reported
    exited: set[int] = set()  # reported, kept as zombies until the agent releases them
    me = os.getpid()
    watched: list[Any] = [conn, wake_r]
    while True:
        try:
            ready, _, _ = select.select(watched, [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            _report_exits(conn, running, exited)
        if conn in ready:
            try:
                kind, payload = conn.recv()
            except (EOFError, OSError):
                for pid in running:
                    kill_group(pid, signal.SIGKILL)
                return
            if kind == "reap":
                for pid in set(payload) & exited:
                    exited.discard(pid)
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)
                continue
            pid = _fork_worker(conn, payload, me, dispositions, (wake_r, wake_w))
            if pid:
                running.add(pid)
                conn.send(("pid", pid))


def _fork_worker(
    conn: Connection, start: WorkerStart, me: int, dispositions: dict[int, Any],
    wake: tuple[int, int],
) -> int:  # fmt: skip
    """Fork a worker; its pid once it leads its own session (the agent signals that
    group), or 0 when the fork failed (the agent is told)."""
    ready_r, ready_w = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(ready_r)
        os.close(ready_w)
        conn.send(("error", f"fork: {exc}"))
        return 0
    if pid == 0:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            conn.close()
            for fd in (*wake, ready_r):
                os.close(fd)
            code = become_worker(start, me, dispositions, ready_w)
        except BaseException:
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
        conn.send(("exit", pid, code))


def kill_group(pid: int, sig: int) -> None:
    """Signal a worker's process group (it leads its own session); gone is fine."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)  # only while it could not yet have its own group
    except PermissionError:
        pass


def _stream(fd: int, errors: str) -> io.TextIOWrapper:
    """An unbuffered text stream on ``fd``, as ``python -u`` gives."""
    encoding = os.environ.get("PYTHONIOENCODING", "").partition(":")[0] or (
        locale.getpreferredencoding(False)
    )
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True)


def _redirect(path: str, fd: int) -> None:
    if not path:
        return
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    os.dup2(target, fd)
    os.close(target)


def _reset_interpreter(env: Mapping[str, str]) -> None:
    """What differs between a fork of the zygote and a fresh interpreter, and can change."""
    # Random state: a fresh interpreter seeds `random` (and numpy's global generator)
    # from the OS; forks would all share the zygote's.
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    # torch read OMP_NUM_THREADS when the agent imported it; the worker's own value wins.
    torch = sys.modules.get("torch")
    threads = env.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    # The default multiprocessing start method, as a fresh interpreter has it.
    multiprocessing.set_start_method(None, force=True)
    # The agent's exception hooks and logging set-up are not the script's:
    # logging.basicConfig() in the script must take effect. Its exit handlers stay:
    # before the fork the agent registers none of its own, and those of the modules it
    # imported (logging, multiprocessing, torch) a fresh interpreter importing them
    # would have too; they flush logs and join child processes.
    sys.excepthook = sys.__excepthook__
    threading.excepthook = threading.__excepthook__
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)


def become_worker(
    start: WorkerStart, zygote: int, dispositions: Mapping[int, Any], ready: int = -1
) -> int:
    """In a fresh fork of the zygote: become ``python -u ARGS`` and run it; the exit status.

    ``ready``: a pipe to close once this process leads its own session."""
    os.setsid()  # torchrun's workers lead their own session: the agent kills the group
    if ready >= 0:
        os.close(ready)
    _prctl_pdeathsig()
    _set_name(Path(sys.executable).name)
    if os.getppid() != zygote:
        return 1
    for sig, action in dispositions.items():
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, action)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    os.chdir(start.cwd)
    os.environ.clear()
    os.environ.update(start.env)
    _redirect(start.stdout, 1)
    _redirect(start.stderr, 2)
    sys.stdout = sys.__stdout__ = _stream(1, "strict")  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = _stream(2, "backslashreplace")  # type: ignore[misc]
    _reset_interpreter(start.env)
    kind, target, tail = parse_python_args(start.python_args)
    return _run_main(kind, target, tail)


def _run_main(kind: str, target: str, tail: list[str]) -> int:
    """Run the script or module as ``__main__``; the exit status ``python`` would give.

    As in python itself, the code runs in the namespace of a ``__main__`` module that
    stays in ``sys.modules`` until the end (exit handlers and child processes find it
    there), and is cleared once the exit handlers have run."""
    before = set(sys.modules)
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __annotations__={}, __cached__=None)
    sys.modules["__main__"] = main
    if kind == "script":
        sys.argv = [target, *tail]
        sys.path[0] = str(Path(target).resolve().parent)
    else:
        sys.argv = ["-m", *tail]
        sys.path[0] = os.getcwd()
    try:
        try:
            if kind == "module":  # what `python -m` calls
                getattr(runpy, "_run_module_as_main")(target)  # noqa: B009
            elif Path(target).suffix == ".py":
                _exec_script(main, target)
            else:  # a folder or zip file with __main__.py, a .pyc
                runpy.run_path(target, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = _exit_status(exc.code)
        except KeyboardInterrupt:
            _print_exception()
            code = -int(signal.SIGINT)  # python then dies of SIGINT itself
        except BaseException:
            _print_exception()
            code = 1
        # What the interpreter does on its way out: wait for non-daemon threads, then
        # the atexit handlers (their errors are printed and do not change the status).
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        _clear_namespace(main.__dict__)
        _finalize(set(sys.modules) - before)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _exec_script(main: types.ModuleType, target: str) -> None:
    path = os.path.abspath(target)
    main.__file__ = path
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    # dont_inherit: this module's `from __future__` imports are not the script's.
    code = compile(Path(path).read_bytes(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _clear_namespace(namespace: dict[str, Any]) -> None:
    """Clear ``__main__`` as the interpreter does at exit: names starting with an
    underscore first, then the others, ``__builtins__`` kept for finalizers."""
    for first in (True, False):
        for name in list(namespace):
            if name != "__builtins__" and name.startswith("_") == first:
                namespace[name] = None


def _finalize(imported: Iterable[str]) -> None:
    """What the interpreter's shutdown still does before the process ends with os._exit,
    so that nothing the script wrote is lost: its objects are finalized (its namespace
    is gone, but holds cycles through its functions' globals), and files left open in
    the modules it imported are flushed. The zygote froze what it had (gc.freeze), so
    the collection looks only at the worker's own objects."""
    gc.collect()
    for name in imported:
        module = sys.modules.get(name)
        for value in list(getattr(module, "__dict__", {}).values()):
            if issubclass(type(value), io.IOBase):
                with contextlib.suppress(Exception):
                    if not value.closed and value.writable():
                        value.flush()


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _print_exception() -> None:
    """The traceback as ``python script.py`` prints it: without runpy's and our frames."""
    kind, value, tb = sys.exc_info()
    skip = (runpy.__file__, "<frozen runpy>", __file__)
    while tb is not None and tb.tb_frame.f_code.co_filename in skip:
        tb = tb.tb_next
    if value is not None:
        value.__traceback__ = tb
    sys.excepthook(kind, value, tb)  # type: ignore[arg-type]
