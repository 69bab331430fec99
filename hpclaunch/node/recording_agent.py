"""hpclaunch's elastic agent: torch's LocalElasticAgent, writing a failure record each
time the worker group fails, starting the workers through the process context it is
given, and stopping workers quickly when a peer node is lost (imports torch).

torch reports failures only when its agent gives up, and only the failures of the
last attempt; the supervisor needs every attempt's, on every node, to tell a bad
node from a bug (see hpclaunch.jobdir.failures). hpclaunch builds this agent itself
(``hpclaunch.node.launcher``), with its settings given to ``__init__``.
Written against torch 2.13 (LocalElasticAgent._start_workers is owned here).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from string import Template
from typing import Any, cast

from torch.distributed.elastic.agent.server.api import (
    _TERMINAL_STATE_SYNC_ID,
    RunResult,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import LogsSpecs, PContext, SignalException
from torch.distributed.elastic.multiprocessing import start_processes as torch_start_processes
from torch.distributed.elastic.rendezvous import RendezvousError
from torch.distributed.elastic.utils import store as store_util
from torch.distributed.elastic.utils.api import macros

from hpclaunch import procs, progress
from hpclaunch.contract.worker_env import lightning_size, slurm_task_view
from hpclaunch.jobdir import unwritten
from hpclaunch.jobdir.failures import HANGS_TO_BAD_NODE, early_exit, exited_early
from hpclaunch.node import failfast, step_signals, stop_notes
from hpclaunch.node.hangs import DEFER_S, Watch
from hpclaunch.node.pidfds import Pidfds
from hpclaunch.node.sweep import Sweeper
from hpclaunch.rendezvous.ranked_c10d import SEPARATE_STORE

log = logging.getLogger(__name__)

# Seconds between SIGTERM and SIGKILL when the workers are stopped because another
# node was lost: they are stuck in a collective with it and cannot checkpoint
# (torch waits 30 s). hpclaunch-etcd's handler says when that is the reason.
LOST_PEER_GRACE_S = 5
# The signals the agent stops its workers on, as torch's launcher tells the workers.
SIGNALS_VAR = "TORCHELASTIC_SIGNALS_TO_HANDLE"

# Called as torch's ``start_processes``: the workers' process context, started.
StartProcesses = Callable[..., PContext]
# Called with the attempt's number: hpclaunch's part of that attempt's worker environment.
WorkerEnv = Callable[[int], Mapping[str, str]]
# Called with the failed attempt's result, the attempt's number, and the messages of the
# ranks the agent knows better than their output (rank -> message: the ranks the hang
# watch stopped, the ranks that exited 0 while the others went on; empty when none);
# returns the one error every worker of the node failed with by itself, if so
# (hpclaunch.node.failfast).
OnFailure = Callable[[RunResult, int, Mapping[int, str]], str | None]
# After a worker failed, how long the node's other workers get to fail by themselves
# before they are stopped: a bug fails every worker at about the same point.
SETTLE_S = 0.5
# After the rendezvous failed, how long workers that are leaving get to end by
# themselves before the node's end is taken as the rendezvous' failure.
FINISHING_S = 5.0


class RecordingAgent(LocalElasticAgent):
    """Calls ``on_failure(result, attempt)`` once for every failed attempt, and looks
    at the workers as soon as one exits, at least every ``monitor_wait_s`` (torch's
    monitor interval is set near zero: its plain sleep is replaced by the wait for an
    exit). ``worker_env(attempt)`` is added to every worker's environment; ``start_processes``
    makes the workers' process context; ``signals`` stop the workers, as torch's
    ``signals_to_handle``; ``sweeper`` ends what the workers left running each time
    the group stops, and reaps what ended by itself (hpclaunch.node.sweep); ``hangs``
    watches the workers' progress (hpclaunch.node.hangs): a hang ends the workers
    and fails the attempt, as a crash would."""

    def __init__(
        self,
        spec: WorkerSpec,
        logs_specs: LogsSpecs,
        *,
        worker_env: WorkerEnv,
        signals: Iterable[signal.Signals],
        on_failure: OnFailure | None = None,
        monitor_wait_s: float = 0.1,
        start_processes: StartProcesses = torch_start_processes,
        sweeper: Sweeper | None = None,
        hangs: Watch | None = None,
        **torch_options: Any,
    ) -> None:
        super().__init__(spec, logs_specs, **torch_options)
        self._worker_env = worker_env
        self._signals = tuple(signals)
        self._on_failure = on_failure
        self._monitor_wait_s = monitor_wait_s
        self._start_processes = start_processes
        self._sweeper = sweeper
        self._pidfds = Pidfds()
        self._hangs = hangs
        self._hung: dict[int, str] = {}  # rank -> message, in an attempt the watch stopped
        self._hung_first = 0  # attempts whose hang began on this node
        self._blamed = False  # the latest hang began on this node
        # global rank -> message, of the ranks of this attempt that had exited 0 when
        # another of the node's ranks failed (torch waits for the rest of the group
        # and reports only the peers that failed without them).
        self._early: dict[int, str] = {}
        self._ranks: dict[int, int] = {}  # local rank -> global rank, this attempt
        self.attempt = 0  # the job-wide attempt the workers run in (see _start_workers)
        self._started: int | None = None  # the attempt this agent's last workers ran in

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        self._wait_for_exit(self._monitor_wait_s)
        self._note_early_exits()
        if self._sweeper is not None:
            self._sweeper.reap(owned=self._worker_pids())
        self._hung = self._end_a_hang()
        if not self._hung:
            self._settle()
        result: RunResult = super()._monitor_workers(worker_group)
        if self._hung and result.is_failed():
            self._count_hang()
        if self._hangs is not None and result.state is not WorkerState.HEALTHY:
            self._hangs.ended()  # the group's last progress
        if result.is_failed():
            self._note_early_exits()  # the failure torch saw may have come since the last look
        if result.is_failed() and self._on_failure is not None:
            try:
                known = {**self._early, **self._hung}
                error = self._on_failure(result, self.attempt, known)
            except SignalException:
                raise  # a stop: torch's run() must see it
            except OSError as exc:  # the job folder refused it: one line, the job goes on
                path = exc.filename if isinstance(exc.filename, str) else "the job folder"
                said = "the supervisor reads the others, and srun's status"
                log.error("%s", unwritten.line("the failure record", path, exc, said))
                error = None
            except Exception:  # a record is worth less than the job: log and go on
                log.exception("could not write the failure record")
                error = None
            restarts_left = error is not None and self._remaining_restarts > 0
            if restarts_left and self._same_everywhere(worker_group, str(error)):
                log.error(
                    "every worker of attempt %d failed with the same error (%s): a bug "
                    "in the script, which restarting would not mend; not restarting",
                    self.attempt,
                    error,
                )
                self._remaining_restarts = 0
        return result

    def _note_early_exits(self) -> None:
        """Once a rank of the node failed, note each rank that had exited 0
        (failures.exited_early), with the step its progress shows; not one that did every
        step its script announced (progress.report(total=...)): that one finished."""
        for local in exited_early(self._exit_codes()):
            rank = self._ranks.get(local, local)
            if rank in self._early:
                continue
            seen = self._progress_of(local)
            if seen is not None and seen.total is not None and seen.step >= seen.total:
                continue
            self._early[rank] = early_exit(seen.step if seen is not None else None)
            log.warning("rank %d %s", rank, self._early[rank])

    def _progress_of(self, local_rank: int) -> progress.Progress | None:
        """What ``local_rank``'s progress file of this attempt says, if there is one."""
        if self._hangs is None:
            return None
        return progress.read(str(self._hangs.folder(self.attempt) / f"local-{local_rank}.progress"))

    def _end_a_hang(self) -> dict[int, str]:
        """When the hang watch finds the workers hung: their stacks and the report in the
        job folder, then every worker killed (a hung rank cannot save anything); the
        failure record's message of each rank. Empty while they progress."""
        if self._hangs is None or self._pcontext is None:
            return {}
        ended = self._exit_codes()
        if ended:  # failed: torch ends the attempt as after a crash; or some are done
            return {}
        pids = self._pcontext.pids()
        hang = self._hangs.check(pids)
        if hang is None:
            return {}
        log.error("the workers hung: %s; reading their stacks, then restarting them", hang.reason)
        report = self._hangs.diagnose(hang)
        log.error(
            "hang report in %s (named: %s, %s)",
            report.stacks,
            ",".join(map(str, report.culprits)) or "none",
            report.how,
        )
        self._workers_ended(DEFER_S)  # the other nodes read their stacks meanwhile
        killed = {s.rank for s in hang.seen if s.local_rank not in self._exit_codes()}
        for pid in pids.values():
            procs.kill_group(pid, signal.SIGKILL)
        self._workers_ended(LOST_PEER_GRACE_S)
        self._blamed = self._hangs.began_here(report)
        # A rank that ended by itself meanwhile keeps its own message.
        return {rank: m for rank, m in report.messages(self._blamed).items() if rank in killed}

    def _count_hang(self) -> None:
        """The second hang that began on this node: no more in-place restarts."""
        if not self._blamed:
            return
        self._hung_first += 1
        if self._hung_first >= HANGS_TO_BAD_NODE and self._remaining_restarts > 0:
            log.error(
                "hangs began on this node %d times: not restarting its workers again; "
                "the job is requeued without this node where the supervisor can",
                self._hung_first,
            )
            self._remaining_restarts = 0

    def _same_everywhere(self, group: WorkerGroup, error: str) -> bool:
        """Whether every node's workers failed with ``error`` in this attempt: each node
        that can say so puts it into the rendezvous store (hpclaunch.node.failfast)."""
        nodes = group.group_world_size or 1
        world = group.workers[0].world_size if group.workers else 0
        if group.store is None or group.group_rank is None or (world or 0) < 2:
            return False
        keys = [failfast.key(self.attempt, node) for node in range(nodes)]
        try:
            group.store.set(keys[group.group_rank], error.encode())
            group.store.wait(keys, timedelta(seconds=failfast.PEERS_WAIT_S))
            put = group.store.multi_get(keys)
        except SignalException:
            raise
        except Exception:  # not every node put one in time: restart, as before
            return False
        return failfast.everywhere(error, put)

    def _settle(self) -> None:
        """When a worker has failed, give the others SETTLE_S seconds to end by
        themselves before torch stops them, so that the failure record shows whether
        they failed too (hpclaunch.node.failfast)."""
        context = self._pcontext
        if context is None or not self._running_workers() or not self._some_failed():
            return
        deadline = time.monotonic() + SETTLE_S
        while self._running_workers() and time.monotonic() < deadline:
            self._wait_for_exit(max(0.0, min(0.05, deadline - time.monotonic())))

    def _some_failed(self) -> bool:
        codes = getattr(self._pcontext, "_returncodes", None)  # the warm context's
        if codes is not None:
            return any(code != 0 for code in codes().values())
        handlers = getattr(self._pcontext, "subprocess_handlers", {})
        return any(h.proc.returncode not in (None, 0) for h in handlers.values())

    def _worker_pids(self) -> set[int]:
        """The pids of the current worker group (torch reads their exit status: the
        sweeper must not reap them)."""
        context = self._pcontext
        return set(context.pids().values()) if context is not None else set()

    def _wait_for_exit(self, timeout: float) -> None:
        """Return when a worker exits, or after ``timeout`` s: through the zygote's
        reports for warm workers, else through a pidfd per worker."""
        context = self._pcontext
        warm_wait = getattr(context, "wait_for_exit", None)
        if warm_wait is not None:
            warm_wait(timeout)
            return
        self._pidfds.follow(context, self._worker_pids())
        self._pidfds.wait(timeout)

    def run(self, role: str = "default") -> RunResult:
        # A node that stood by until the job ended leaves the rendezvous gracefully,
        # and torch 2.13's run() then returns None, which its launcher cannot take.
        result: RunResult | None = super().run(role)
        if result is None:
            return RunResult(state=WorkerState.SUCCEEDED)
        return result

    def _invoke_run(self, role: str = "default") -> RunResult:
        try:
            result: RunResult = super()._invoke_run(role)
        except SignalException as exc:  # ours or torch's handler (during the start)
            _received.append(exc.sigval)
            raise
        except RendezvousError as exc:
            # torch asks the rendezvous about new nodes while the workers run; where it
            # cannot be reached (etcd gone longer than its outage timeout) after they
            # finished, training is done: the node ends as its workers did.
            finished = self._finished_anyway(exc)
            if finished is None:
                raise
            return finished
        return result

    def _finished_anyway(self, exc: BaseException) -> RunResult | None:
        """The group's result when every worker ended with 0 by itself (waiting up to
        FINISHING_S for those still leaving); None otherwise."""
        if self._pcontext is None or self._worker_group.state is not WorkerState.HEALTHY:
            return None
        self._workers_ended(FINISHING_S)
        codes = self._exit_codes()
        workers = self._worker_group.spec.local_world_size
        if len(codes) < workers or any(code != 0 for code in codes.values()):
            return None
        result: RunResult = super()._monitor_workers(self._worker_group)
        if result.state is not WorkerState.SUCCEEDED:
            return None
        self._worker_group.state = WorkerState.SUCCEEDED
        log.warning(
            "every worker of this node finished, but the rendezvous could not be reached "
            "afterwards: %s; not waiting for the other nodes' agents",
            _first_line(exc),
        )
        return result

    def _exit_barrier(self) -> None:
        """torch 2.13's wait for the other agents once the workers finished, its failure
        one line, not a traceback: a store that cannot be reached then (etcd gone after
        the last step) changes nothing for the job."""
        self._in_exit_barrier = True
        try:
            store_util.barrier(
                store=self._store,
                world_size=self._worker_group.group_world_size or 1,
                key_prefix=_TERMINAL_STATE_SYNC_ID,
                barrier_timeout=self._exit_barrier_timeout,
            )
        except SignalException:
            raise
        except Exception as exc:
            log.warning(
                "every worker of this node finished; not waiting for the other nodes' agents: %s",
                _first_line(exc),
            )
        finally:
            self._in_exit_barrier = False

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        """Stop the workers, as torch does; but a stop signal that SLURM sent to every
        process of the step (the agent is a task of a job step: scancel, a requeue, a
        preemption, srun passing the supervisor's signals on) is not sent again. The
        workers got it once, as every framework's handler expects; they get ``timeout``
        seconds to end, and what is left is killed. Their progress is noted first: SLURM
        may kill the step (the agent too) before they end."""
        if self._hangs is not None:
            self._hangs.stopping()
        if (
            death_sig in _received
            and self._pcontext is not None
            and step_signals.slurm_signals_step()
        ):
            if not self._workers_ended(timeout):
                log.warning(
                    "workers still running %d s after %s; sending SIGKILL", timeout, death_sig.name
                )
            stop_notes.killed_by(death_sig, self._exit_codes())
            death_sig = signal.SIGKILL  # reaches only the workers still running
        super()._shutdown(death_sig, timeout)
        if self._hangs is not None:  # a stop signal's group ends here: its last progress
            self._hangs.ended()

    def _exit_codes(self) -> dict[int, int]:
        """local rank -> returncode of the current workers that ended."""
        context = self._pcontext
        exit_codes = getattr(context, "exit_codes", None)  # the warm context's
        if exit_codes is not None:
            return dict(exit_codes())
        handlers = getattr(context, "subprocess_handlers", {})
        codes = {rank: handler.proc.poll() for rank, handler in handlers.items()}
        return {rank: code for rank, code in codes.items() if code is not None}

    def _workers_ended(self, timeout: float) -> bool:
        """Whether every worker of the group ended within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self._running_workers():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._wait_for_exit(min(left, 0.1))
        return True

    def _running_workers(self) -> list[int]:
        context = self._pcontext
        alive = getattr(context, "_alive", None)  # the warm context knows its own
        if alive is not None:
            return list(alive())
        handlers = getattr(context, "subprocess_handlers", {})
        return [rank for rank, handler in handlers.items() if handler.proc.poll() is None]

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        take = getattr(worker_group.spec.rdzv_handler, "take_lost_peer", None)
        if take is not None and take():
            log.info("a node left the round: workers get %d s to exit", LOST_PEER_GRACE_S)
            self._shutdown(timeout=LOST_PEER_GRACE_S)
        else:
            super()._stop_workers(worker_group)
        if self._sweeper is not None:  # before the next group starts, if one does
            self._sweeper.sweep("after the worker group stopped", owned=self._worker_pids())

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        """torch 2.13's LocalElasticAgent._start_workers, owned: hpclaunch's worker
        environment and attempt added, the process context from ``start_processes``."""
        spec = worker_group.spec
        restart_count = spec.max_restarts - self._remaining_restarts
        # The rendezvous round is the job-wide attempt (hpclaunch's handlers say it);
        # static rendezvous has only this agent's restart count.
        round_joined = getattr(spec.rdzv_handler, "attempt", None)
        if round_joined is None:
            self.attempt = restart_count
        else:
            # An agent whose workers never ran (its first start, or a spare's) has no
            # attempt of its own to number on from: the run's logs say (next_attempt).
            first = self._hangs is not None and self._started is None
            logged = self._hangs.highest_attempt() if first and self._hangs else None
            self.attempt = next_attempt(int(round_joined), self._started, logged)
            if self.attempt != int(round_joined):
                log.warning(
                    "the rendezvous round went back to %s after attempt %s (its state was "
                    "lost: an etcd that came back empty?); these workers run as attempt %d, "
                    "so that no attempt's rank logs or records are overwritten",
                    round_joined,
                    self._started if self._started is not None else logged,
                    self.attempt,
                )
        self._started = self.attempt
        self._early = {}
        self._ranks = {w.local_rank: w.global_rank for w in worker_group.workers}
        envs, args, prefixes = self._worker_envs(worker_group, restart_count)
        self._setup_local_watchdog(envs=envs)
        self._setup_healthcheck()
        self._handle_signals()
        if spec.entrypoint is None:
            raise AssertionError("the worker spec has no entrypoint")
        self._pcontext = self._start_processes(
            name=spec.role,
            entrypoint=spec.entrypoint,
            args=args,
            envs=envs,
            logs_specs=self._logs_specs,
            log_line_prefixes=prefixes,
            start_method=self._start_method,
            numa_options=spec.numa_options,
            duplicate_stdout_filters=spec.duplicate_stdout_filters,
            duplicate_stderr_filters=spec.duplicate_stderr_filters,
        )
        self._handle_signals()  # again: torch's process context put its own in at start
        return self._pcontext.pids()

    def _worker_envs(
        self, worker_group: WorkerGroup, restart_count: int
    ) -> tuple[dict[int, dict[str, str]], dict[int, tuple[Any, ...]], dict[int, str] | None]:
        """Each worker's environment (torch's variables, then hpclaunch's), its
        arguments, and its output line prefix (None without a template)."""
        spec = worker_group.spec
        use_agent_store: bool = spec.rdzv_handler.use_agent_store
        ours = dict(self._worker_env(self.attempt))
        ours[SIGNALS_VAR] = ",".join(sig.name for sig in self._signals)
        if not use_agent_store:  # the workers' own store, as torch's variable asks
            ours[SEPARATE_STORE] = "1"
        envs: dict[int, dict[str, str]] = {}
        args: dict[int, tuple[Any, ...]] = {}
        prefixes: dict[int, str] | None = {} if self._log_line_prefix_template else None
        node_ranks = [worker.global_rank for worker in worker_group.workers]
        if self._hangs is not None:
            self._hangs.begin(
                self.attempt, {w.local_rank: w.global_rank for w in worker_group.workers}
            )
        for worker in worker_group.workers:
            local_rank = worker.local_rank
            env: dict[str, str | None] = {
                "RANK": str(worker.global_rank),
                "GROUP_RANK": str(worker_group.group_rank),
                "ROLE_RANK": str(worker.role_rank),
                "ROLE_NAME": spec.role,
                "LOCAL_WORLD_SIZE": str(spec.local_world_size),
                "WORLD_SIZE": str(worker.world_size),
                "GROUP_WORLD_SIZE": str(worker_group.group_world_size),
                "ROLE_WORLD_SIZE": str(worker.role_world_size),
                "MASTER_ADDR": worker_group.master_addr,
                "MASTER_PORT": str(worker_group.master_port),
                "TORCHELASTIC_RESTART_COUNT": str(restart_count),
                "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
                "TORCHELASTIC_RUN_ID": spec.rdzv_handler.get_run_id(),
                "TORCHELASTIC_USE_AGENT_STORE": str(use_agent_store),
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv(
                    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"
                ),
            }
            self._set_local_rank_env(env, local_rank, spec)
            env.update(
                slurm_task_view(
                    os.environ,
                    rank=worker.global_rank,
                    local_rank=local_rank,
                    world_size=worker.world_size or 0,
                    local_world_size=spec.local_world_size,
                    node_rank=worker_group.group_rank or 0,
                    nodes=worker_group.group_world_size or 1,
                    node_ranks=node_ranks,
                )
            )
            env.update(
                lightning_size(
                    os.environ,
                    nodes=worker_group.group_world_size or 1,
                    local_world_size=spec.local_world_size,
                )
            )
            if "OMP_NUM_THREADS" in os.environ:
                env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
            if prefixes is not None:
                prefixes[local_rank] = Template(
                    self._log_line_prefix_template or ""
                ).safe_substitute(
                    role_name=spec.role, rank=worker.global_rank, local_rank=local_rank
                )
            envs[local_rank] = {**cast(dict[str, str], env), **ours}
            if self._hangs is not None:
                envs[local_rank].update(self._hangs.worker_env(self.attempt, local_rank))
            args[local_rank] = tuple(macros.substitute(list(spec.args), str(local_rank)))
        return envs, args, prefixes

    def _handle_signals(self) -> None:
        """Stop the workers on ``signals``, as torch's process context does on the ones
        its launcher names (it reads them from the agent's environment)."""
        if threading.current_thread() is not threading.main_thread():
            return  # torch's process context warns of it
        for sig in self._signals:
            signal.signal(sig, _raise_signal)


def next_attempt(joined: int, last: int | None, logged: int | None = None) -> int:
    """The attempt workers that joined rendezvous round ``joined`` run in: that round,
    but never at or below ``last``, the attempt this agent's workers last ran in. Rounds
    only grow while the rendezvous state lives; one that was lost (an etcd that came
    back wiped) counts from 0 again, and the new attempt's rank logs and failure records
    would overwrite the first ones. Every agent that ran the same attempts takes the
    same number. An agent whose workers never ran (a spare joining after the loss) has
    no ``last``: it goes by ``logged``, the highest attempt in the run's attempts logs,
    when the round is below it: one past it. (Where the others began theirs first it is
    one past theirs: a number of its own, never one already used.) Pure."""
    if last is None:
        return logged + 1 if logged is not None and joined < logged else joined
    return joined if joined > last else last + 1


# The stop signal this agent got, if any (a worker group that then exits 0 was stopped).
_received: list[signal.Signals] = []


def received() -> signal.Signals | None:
    """The first stop signal this agent got; None when none came."""
    return _received[0] if _received else None


def _raise_signal(signum: int, frame: Any) -> None:
    """What torch's process context does on a stop signal: raise SignalException,
    which the agent answers by stopping the workers."""
    sigval = signal.Signals(signum)
    _received.append(sigval)
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)


def _first_line(exc: BaseException) -> str:
    """``exc`` as one line: its message's first line, else its type's name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
