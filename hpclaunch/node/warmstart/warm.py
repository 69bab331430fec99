"""torch's process context for workers forked by the zygote (imports torch).

torch's agent starts its workers through ``start_processes``, which picks a process
context by the entrypoint. hpclaunch's agent (``RecordingAgent``) is given a
``WarmStart`` to call instead: a ``python`` command line of a script or ``-m`` module
gets a ``WarmContext`` (workers from the zygote), anything else torch's own context.

``WarmContext`` keeps the contract of torch's ``SubprocessContext``, which torchrun
uses: one session per worker, the group killed with the death signal and SIGKILL after
the timeout, success and failure by exit status alone, stdout/stderr into the files
torch's log specs name. Written against torch 2.13 (``PContext``, ``start_processes``
and its ``_validate_full_rank``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.multiprocessing import api as mp_api
from torch.distributed.elastic.multiprocessing import start_processes as torch_start_processes
from torch.distributed.elastic.multiprocessing.api import (
    PContext,
    RunProcsResult,
    SignalException,
)
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from hpclaunch import procs
from hpclaunch.node.warmstart.forked_worker import ForkRequest, parse_python_args
from hpclaunch.node.warmstart.zygote import Zygote, ZygoteError, kill_group, signals_deferred

log = logging.getLogger(__name__)

# A python worker's command line -> the (entrypoint, args) pair that starts it fresh.
Fresh = Callable[[tuple[str, ...]], tuple[str, tuple[str, ...]]]


class WarmContext(PContext):
    """Workers forked from the zygote, supervised like torch's subprocess workers."""

    def __init__(self, zygote: Zygote, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._zygote = zygote
        self._pids: dict[int, int] = {}
        self._codes: dict[int, int] = {}  # pid -> returncode, for the workers that ended
        self._running: set[int] = set(range(self.nprocs))
        self._failures: dict[int, ProcessFailure] = {}

    def _start(self) -> None:
        environ = dict(os.environ)
        cwd = os.getcwd()
        # A stop signal is handled once every pid started is known, so that the
        # shutdown it causes stops them all.
        with signals_deferred():
            for local_rank in range(self.nprocs):
                start = ForkRequest(
                    python_args=tuple(str(a) for a in self.args[local_rank]),
                    env={**environ, **self.envs[local_rank]},
                    cwd=cwd,
                    stdout=self.stdouts[local_rank] or "",
                    stderr=self.stderrs[local_rank] or "",
                )
                self._pids[local_rank] = self._zygote.spawn(start)

    def wait_for_exit(self, timeout: float) -> None:
        """Return as soon as a worker exits, or after ``timeout`` s."""
        self._zygote.wait(timeout)

    def _returncodes(self) -> dict[int, int]:
        """The exits of this context's workers reported so far, by pid."""
        reported = self._zygote.returncodes()
        for pid in self._pids.values():
            if pid in reported:
                self._codes[pid] = reported[pid]
        return self._codes

    def _capture(self, done: set[int]) -> None:
        codes = self._returncodes()
        for local_rank in self._running:
            code = codes.get(self._pids[local_rank])
            if code is None:
                continue
            done.add(local_rank)
            if code != 0:
                self._failures[local_rank] = ProcessFailure(
                    local_rank=local_rank,
                    pid=self._pids[local_rank],
                    exitcode=code,
                    error_file=self.error_files[local_rank],
                )

    def _poll(self) -> RunProcsResult | None:
        done: set[int] = set()
        self._capture(done)
        self._running.difference_update(done)
        if self._running and not self._failures:
            return None
        self.close()
        self._capture(done)
        result = RunProcsResult(failures=self._failures, stdouts=self.stdouts, stderrs=self.stderrs)
        if result.is_failed():
            first = min(result.failures.values(), key=lambda f: f.timestamp)
            log.error(
                "failed (exitcode: %s) local_rank: %s (pid: %s) of %s",
                first.exitcode,
                first.local_rank,
                first.pid,
                self.entrypoint,
            )
        else:
            result.return_values = dict.fromkeys(range(self.nprocs))
        return result

    def pids(self) -> dict[int, int]:
        return dict(self._pids)

    def exit_codes(self) -> dict[int, int]:
        """local rank -> returncode, for the workers that ended (negative: by a signal)."""
        codes = self._returncodes()
        return {rank: codes[pid] for rank, pid in self._pids.items() if pid in codes}

    def _alive(self) -> list[int]:
        """The workers to stop. Once the zygote is gone its workers are dead (they die
        with it), but what they started in their process group may not be: each group
        with a live process left counts (not a zombie: where the machine's init does not
        reap orphans, they stay), and is stopped as a worker would be."""
        codes = self._returncodes()
        if self._zygote.gone:
            return [pid for pid in self._pids.values() if procs.group_alive(pid)]
        return [pid for pid in self._pids.values() if pid not in codes]

    def _wait_gone(self, timeout: float) -> list[int]:
        end = time.monotonic() + timeout
        alive = self._alive()
        while alive and time.monotonic() < end:
            wait = min(0.05, max(0.0, end - time.monotonic()))
            if self._zygote.gone:  # no reports to wait for: look again shortly
                time.sleep(min(wait, 0.01))
            else:
                self._zygote.wait(wait)
            alive = self._alive()
        return alive

    def _close(self, death_sig: signal.Signals, timeout: int = 30) -> None:
        alive = self._alive()
        for pid in alive:
            log.warning("Sending process %s closing signal %s", pid, death_sig.name)
            kill_group(pid, death_sig)
        alive = self._wait_gone(timeout)
        for pid in alive:
            log.warning("process %s outlived %s; sending SIGKILL", pid, death_sig.name)
            kill_group(pid, signal.SIGKILL)
        for pid in self._wait_gone(timeout):
            log.error("process %s did not exit after SIGKILL within %s s", pid, timeout)
        # Until now the zygote kept each ended worker's pid from being reused, so that
        # the signals above could not reach another process.
        self._zygote.release(self._codes)


class WarmStart:
    """Starts the agent's workers from ``zygote`` where they are python scripts or
    modules; called as torch's ``start_processes`` is.

    ``fresh`` turns a worker's command line into the (entrypoint, args) torch starts
    instead, should the zygote be gone: it ends when killed, and its workers with it.
    ``grace_s``: how long workers get between a stop signal and SIGKILL (torch's
    shutdown timeout), for a stop that comes while they are being started."""

    def __init__(self, zygote: Zygote, fresh: Fresh, grace_s: float) -> None:
        self._zygote = zygote
        self._fresh = fresh
        self._grace_s = grace_s

    def __call__(
        self,
        name: str,
        entrypoint: Any,
        args: dict[int, tuple[Any, ...]],
        envs: dict[int, dict[str, str]],
        logs_specs: Any,
        **kwargs: Any,
    ) -> PContext:
        """A started process context for the workers. Raises SignalException when a
        stop signal came while they were being started (they are stopped)."""

        def by_torch(entrypoint: Any, args: dict[int, tuple[Any, ...]]) -> PContext:
            context: PContext = torch_start_processes(
                name=name,
                entrypoint=entrypoint,
                args=args,
                envs=envs,
                logs_specs=logs_specs,
                **kwargs,
            )
            return context

        zygote = self._zygote
        if not _is_python(entrypoint, args):
            return by_torch(entrypoint, args)
        if zygote.gone:
            log.warning("the zygote (pid %s) has ended: workers start fresh", zygote.pid)
            return by_torch(*_fresh(self._fresh, entrypoint, args))
        mp_api._validate_full_rank(args, len(args), "args")
        mp_api._validate_full_rank(envs, len(args), "envs")
        context = WarmContext(
            zygote,
            name=name,
            entrypoint=entrypoint,
            args=args,
            envs=envs,
            logs_specs=logs_specs,
            log_line_prefixes=kwargs.get("log_line_prefixes"),
            duplicate_stdout_filters=kwargs.get("duplicate_stdout_filters"),
            duplicate_stderr_filters=kwargs.get("duplicate_stderr_filters"),
        )
        try:
            context.start()
        except SignalException as exc:  # torch's agent would stop them so: pass it on
            context.close(exc.sigval, timeout=int(self._grace_s))
            raise
        except ZygoteError as exc:
            context.close()
            log.warning("workers start fresh: %s", exc)
            return by_torch(*_fresh(self._fresh, entrypoint, args))
        except Exception:
            context.close()
            raise
        return context


def _fresh(
    fresh: Fresh, entrypoint: str, args: dict[int, tuple[Any, ...]]
) -> tuple[str, dict[int, tuple[Any, ...]]]:
    started = {rank: fresh((entrypoint, *map(str, a))) for rank, a in args.items()}
    entrypoints = {entry for entry, _ in started.values()}
    return entrypoints.pop(), {rank: tuple(a) for rank, (_, a) in started.items()}


def _is_python(entrypoint: Any, args: dict[int, tuple[Any, ...]]) -> bool:
    """Whether every worker is ``python [-u] SCRIPT|-m MODULE ...`` (the zygote's kind)."""
    if not isinstance(entrypoint, str):
        return False
    try:
        if not os.path.samefile(entrypoint, sys.executable):
            return False
    except OSError:
        return False
    try:
        for worker_args in args.values():
            parse_python_args([str(a) for a in worker_args])
    except ValueError:
        return False
    return True
