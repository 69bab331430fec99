"""A worker forked from the zygote becomes what ``python -u SCRIPT ARGS`` would be.

``become_worker`` runs in the fresh fork: its own session, the signal dispositions an
exec would leave, the environment, working directory and output files torch asks for,
the interpreter state a fresh ``python`` has (see ``_reset_interpreter``); then the
script or module runs as ``__main__`` and the process ends as python would end
(``_run_main``). What cannot be made the same is listed in docs/agent.md.

This module imports nothing of torch. It uses two private parts of CPython that
python itself uses the same way, tested here on 3.11: ``runpy._run_module_as_main``
(what ``python -m`` runs) and ``threading._shutdown`` (the wait for non-daemon threads).
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
import signal
import sys
import threading
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpclaunch import progress
from hpclaunch.node import boot_env

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


@dataclass(frozen=True)
class ForkRequest:
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


def prctl_pdeathsig() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _stream(fd: int, errors: str) -> io.TextIOWrapper:
    """An unbuffered text stream on ``fd``, as ``python -u`` gives
    (``PYTHONIOENCODING=encoding:errors`` as python reads it)."""
    encoding, _, chosen = os.environ.get("PYTHONIOENCODING", "").partition(":")
    encoding = encoding or locale.getpreferredencoding(False)
    errors = chosen or errors
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
    # numpy's OpenBLAS was loaded with one thread (see the agent's _fork_zygote): give
    # it the threads it would have started with in a fresh interpreter.
    _set_blas_threads(_blas_threads(env))
    # The default multiprocessing start method, as a fresh interpreter has it, and a
    # key of its own (children check it): the agent's would be shared by every rank.
    multiprocessing.set_start_method(None, force=True)
    multiprocessing.current_process().authkey = os.urandom(32)
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


# OpenBLAS reads these at load time, the first one set wins; else one per usable CPU.
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
# Its thread setter, as numpy's wheels (scipy-openblas, 64-bit ints) and plain builds name it.
BLAS_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)


def _blas_threads(env: Mapping[str, str]) -> int:
    """The threads OpenBLAS starts with in a fresh process with environment ``env``."""
    for name in BLAS_THREAD_VARS:
        value = env.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return len(os.sched_getaffinity(0))


def _set_blas_threads(count: int) -> None:
    """Set the thread count of each OpenBLAS loaded in this process (none: nothing)."""
    try:
        with open("/proc/self/maps") as maps:
            libraries = {line.split()[-1] for line in maps if "openblas" in line}
    except OSError:
        return
    for library in sorted(libraries):
        try:
            handle = ctypes.CDLL(library)
        except OSError:
            continue
        for name in BLAS_SETTERS:
            setter = getattr(handle, name, None)
            if setter is not None:
                setter(ctypes.c_int(count))
                break


def become_worker(
    start: ForkRequest, zygote: int, dispositions: Mapping[int, Any], ready: int = -1
) -> int:
    """In a fresh fork of the zygote: become ``python -u ARGS`` and run it; the exit status.

    ``ready``: a pipe to close once this process leads its own session and takes
    signals as a fresh one would: from then on the agent may signal its group."""
    os.setsid()  # torchrun's workers lead their own session: the agent kills the group
    prctl_pdeathsig()
    if os.getppid() != zygote:
        return 1
    for sig, action in dispositions.items():
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, action)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    if ready >= 0:
        os.close(ready)
    _set_name(Path(sys.executable).name)
    os.chdir(start.cwd)
    os.environ.clear()
    os.environ.update(start.env)
    boot_env.unboot(os.environ)  # a fresh python would have taken the boot out of it
    _redirect(start.stdout, 1)
    _redirect(start.stderr, 2)
    sys.stdout = sys.__stdout__ = _stream(1, "strict")  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = _stream(2, "backslashreplace")  # type: ignore[misc]
    _reset_interpreter(start.env)
    progress.install(os.environ)
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
        folder_or_zip = Path(target).suffix != ".py" and not Path(target).is_file()
        sys.path[0] = target if folder_or_zip else str(Path(target).resolve().parent)
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
        except _CannotOpen as exc:
            print(f"{sys.executable}: {exc}", file=sys.stderr)
            code = 2
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
        # C's stdio buffers (an extension's printf), which exit() would flush.
        ctypes.CDLL(None).fflush(None)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


class _CannotOpen(Exception):
    """The script cannot be read: python says so and exits 2."""


def _exec_script(main: types.ModuleType, target: str) -> None:
    path = os.path.abspath(target)
    try:
        source = Path(path).read_bytes()
    except OSError as exc:
        raise _CannotOpen(f"can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}") from None
    main.__file__ = path
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    # dont_inherit: this module's `from __future__` imports are not the script's.
    code = compile(source, path, "exec", dont_inherit=True)
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
    the modules it imported are flushed. What the zygote had is frozen (gc.freeze), so
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
