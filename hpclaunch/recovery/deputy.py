"""When a ``--no-kill`` job loses its batch host, or when the supervisor stops answering
(its heartbeat stands still for the watch bound, hpclaunch.recovery.watch: a stopped or
stuck process), one agent takes the supervisor's role, so that the job still ends, or
is requeued, by itself.

The supervisor and ``srun`` live on the batch host (the job's first node). SLURM takes
a lost node out of a ``--no-kill`` job and keeps the job RUNNING on the others, the
batch host too: then nothing is left that would end the job. So each agent of such a
job, when its own run ends, notes its exit status in the job folder and asks SLURM
whether the batch host is still in the job. When it is not (SLURM took it out, or marks
it down or not responding), the agents race to create ``agents/requeue-Q/deputy.json``
(``O_EXCL``: exactly one wins, on every shared filesystem), and the winner, the deputy:

- waits (at most a minute) for the other survivors' agents to note their ends;
- when the training finished (every status 0), records the run as completed and ends
  the job COMPLETED through libslurm (``hpclaunch.slurm.libslurm``);
- else requeues the job without the lost host (as the supervisor would, within
  ``--max-requeues``), or ends it FAILED when the budget is spent.

What it does goes into the batch log (its ``srun`` is gone, and with it the agents'
output) and into ``history.json``. A supervisor that comes back (a healed partition)
finds the deputy's note and does nothing more. A silent supervisor is dealt with the
same way, but its host is not kept out of the next run (nothing says the node is bad)
and the reason recorded is "supervisor silent". No torch.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.contract.supervisor import DEFAULT_SLURM_PATIENCE_S, DEFAULT_SUPERVISOR_GRACE_S
from hpclaunch.errors import HpclaunchError, SlurmError
from hpclaunch.jobdir import history_store
from hpclaunch.jobdir.atomic import write_bytes_atomic
from hpclaunch.jobdir.history import History, finish
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.record.job_record import read_run
from hpclaunch.recovery import policy
from hpclaunch.recovery.job_commands import requeue_job
from hpclaunch.recovery.watch import supervisor_silent
from hpclaunch.slurm import libslurm
from hpclaunch.slurm.commands import NodeState, Slurm
from hpclaunch.slurm.hostlist import expand
from hpclaunch.slurm.retry import Patience, describe, persist

log = logging.getLogger(__name__)

OTHERS_WAIT_S = 60.0  # for the other survivors' agents to note their ends
_POLL_S = 0.5
LOST_STATES = ("down", "fail", "failing")
# How long an agent whose batch host's slurmd does not answer waits for SLURM to say
# whether the host is lost (SLURM does after SlurmdTimeout, 300 s by default).
VERDICT_WAIT_S = 600.0
VERDICT_POLL_S = 5.0
PROBE_TIMEOUT_S = 3.0
SLURMD_PORT = 6818


@dataclass(frozen=True)
class JobView:
    """What the deputy needs of ``scontrol show job``."""

    state: str
    nodes: tuple[str, ...]
    batch_host: str
    batch_log: str | None

    @classmethod
    def of(cls, fields: Mapping[str, str]) -> JobView:
        """From ``scontrol show job``'s fields. Pure; raises ValueError (a node list
        that is not one)."""
        listed = fields.get("NodeList", "")
        nodes = tuple(expand(listed)) if listed and listed != "(null)" else ()
        out = fields.get("StdOut", "")
        return cls(
            fields.get("JobState", ""),
            nodes,
            fields.get("BatchHost", ""),
            out if out.startswith("/") else None,
        )


def lost_batch_host(job: JobView, states: Mapping[str, NodeState]) -> str | None:
    """The batch host when SLURM says the job has lost it (took it out of the RUNNING
    job, or marks it down or failed); else None. "Not responding" alone is no verdict:
    a busy host may answer late (see watch_batch_host). Pure."""
    host = job.batch_host
    if job.state != "RUNNING" or not host or host == "(null)":
        return None
    if host not in job.nodes or (host in states and states[host].state in LOST_STATES):
        return host
    return None


def silent(job: JobView, states: Mapping[str, NodeState]) -> bool:
    """Whether SLURM has not heard from the batch host lately (a ``*`` in sinfo). Pure."""
    return job.batch_host in states and not states[job.batch_host].responding


def why_lost(job: JobView, host: str) -> str:
    if host not in job.nodes:
        return f"SLURM took it out of the job, which runs on {','.join(job.nodes)}"
    return "SLURM marks it down or no longer hears from it, and its slurmd does not answer"


def claim(folder: JobFolder, requeue: int, node: str, lost: str, why: str = "lost") -> str | None:
    """Take the supervisor's role for run ``requeue``: None when this node has it now,
    else the node that took it first. The note is written whole under a name of this
    node's, then linked into place: ``link`` fails when the name exists (atomic on NFS
    too), and a reader never sees a half-written note. Raises OSError."""
    path = folder.deputy(requeue)
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = path.with_name(f".{path.name}.{node}.{os.getpid()}")
    note = {"node": node, "pid": os.getpid(), "lost": lost, "why": why, "at": time.time()}
    write_bytes_atomic(mine, json.dumps(note).encode() + b"\n")
    try:
        os.link(mine, path)
    except FileExistsError:
        if linked_by_us(mine, path, note):
            return None
        return taken_by(folder.root, requeue) or "another node"
    finally:
        mine.unlink(missing_ok=True)
    return None


def linked_by_us(mine: Path, path: Path, note: Mapping[str, object]) -> bool:
    """Whether the link that said EEXIST was this agent's own: on NFSv3 a LINK whose
    reply was lost is sent again, and the server answers the retry EEXIST to the very
    client that made the link (its duplicate-request cache may have dropped the first
    reply): the note then has a second name (``mine``'s link count is 2), and the note
    in place is this agent's. Without this, no agent would act."""
    try:
        if os.stat(mine).st_nlink >= 2:
            return True
        there = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(there, dict) and (there.get("node"), there.get("pid"), there.get("at")) == (
        note["node"],
        note["pid"],
        note["at"],
    )


def taken_by(job_dir: Path, requeue: int) -> str | None:
    """The node whose agent took run ``requeue``'s supervision over, if one did."""
    try:
        return str(json.loads(JobFolder(job_dir).deputy(requeue).read_text())["node"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return "an agent"  # there, but not readable: taken all the same


def stood_down(job_dir: Path, requeue: int) -> bool:
    """For the supervisor of run ``requeue`` when its step has ended: True (and one line
    saying why) when an agent took this run over, so that the supervisor does nothing
    more; its host was lost from the job and came back, or it stopped answering."""
    holder = taken_by(job_dir, requeue)
    if holder is not None:
        why = (
            "this supervisor stopped answering"
            if _why(job_dir, requeue) == SILENT
            else "this host was lost from the job"
        )
        log.warning(
            "supervisor: the agent on %s took over this run (%s); this supervisor does "
            "nothing more",
            holder,
            why,
        )
    return holder is not None


SILENT = "silent"  # a deputy note's "why" when the supervisor stopped answering


def deputy_status(job_dir: Path, job_id: int, requeue: int, status: int) -> int:
    """The exit status of run ``requeue``'s supervisor that stood down: the one it would
    have had for the deputy's decision (SLURM takes the batch script's status as the
    job's exit code, even after the deputy ended the job); ``status`` when the history
    does not say."""
    try:
        history = History.load(job_dir, job_id)
    except (OSError, HpclaunchError):
        return status
    run = next((r for r in reversed(history.runs) if r.requeue_count == requeue), None)
    if run is None or run.action is None:
        return status
    if run.action == policy.Action.GIVE_UP.value:
        return policy.GAVE_UP_STATUS
    if run.action == policy.Action.REQUEUE.value or run.reason == policy.Reason.COMPLETED.value:
        return 0
    return run.step_status if run.step_status is not None else status


def _why(job_dir: Path, requeue: int) -> str:
    try:
        return str(json.loads(JobFolder(job_dir).deputy(requeue).read_text()).get("why", "lost"))
    except (OSError, ValueError, AttributeError):
        return "lost"


def after_agent(
    status: int,
    *,
    job_id: int,
    requeue: int,
    node: str,
    job_dir: Path,
    slurm: Slurm,
    env: Mapping[str, str],
    no_kill: bool = True,
) -> int:
    """What a supervised agent does when its run has ended with ``status`` (and is
    noted, hpclaunch.jobdir.agent_ends): take the supervisor's role if no other agent
    has and, in a ``no_kill`` job, the batch host is lost, or the supervisor's heartbeat
    does not move for the bound it names. Returns the agent's exit status."""
    folder = JobFolder(job_dir)
    if status in policy.STOPPED_STATUSES:
        return status  # a signal the supervisor passed on: it was there to act
    # torch's handler would raise at any point of this: SLURM's SIGKILL follows anyway.
    with sigterm_ignored():
        silent_s: float | None = None
        try:
            job, lost = watch_batch_host(job_id, node, slurm) if no_kill else (None, None)
            if lost is None:
                silent_s = supervisor_silent(job_dir, requeue)
                if silent_s is None:
                    return status
                window = Patience(DEFAULT_SUPERVISOR_GRACE_S, DEFAULT_SLURM_PATIENCE_S).window()
                job = JobView.of(persist(lambda s: s.job_fields(job_id), slurm, window))
                if job.state != "RUNNING":
                    return status  # ended meanwhile: nothing is left to do
                lost = job.batch_host
            holder = claim(folder, requeue, node, lost, SILENT if silent_s else "lost")
        except (OSError, ValueError, SlurmError) as exc:
            log.warning("could not check whether the supervisor is still there: %s", exc)
            return status
        assert job is not None  # both ways above found it
        deputy = Deputy(job_id, requeue, node, folder, slurm, env, job, lost, silent_s)
        if holder is not None:
            deputy.say(f"{deputy.what()}; the agent on {holder} has its role")
            return status
        try:
            return deputy.act(status)
        except Exception as exc:  # the role is this agent's alone: the job must still end
            deputy.say(f"the deputy failed ({type(exc).__name__}: {exc}); ending the job FAILED")
            return deputy.end(status or 1)


def watch_batch_host(
    job_id: int, node: str, slurm: Slurm, wait_s: float = VERDICT_WAIT_S
) -> tuple[JobView, str | None]:
    """The job, and its batch host when the job has lost it. While the host's slurmd
    does not answer and SLURM has not yet said that the host is lost, wait for SLURM's
    verdict, at most ``wait_s``. Raises SlurmError, ValueError."""
    deadline, said = time.monotonic() + wait_s, False
    window = Patience(DEFAULT_SUPERVISOR_GRACE_S, DEFAULT_SLURM_PATIENCE_S).window()
    while True:
        job = JobView.of(persist(lambda s: s.job_fields(job_id), slurm, window))
        if job.state != "RUNNING" or job.batch_host in ("", "(null)", node):
            return job, None
        states = persist(lambda s: s.node_states(), slurm, window)
        lost = lost_batch_host(job, states)
        if lost is not None:
            return job, lost
        # slurmd answers slurmd (SLURM's messages fan out through the nodes), so a batch
        # host whose slurmd takes a connection is alive; one SLURM no longer hears from,
        # whose slurmd does not answer, is lost.
        if slurmd_answers(slurm, job.batch_host):
            return job, None
        if silent(job, states):
            return job, job.batch_host
        if time.monotonic() > deadline:
            log.warning(
                "the batch host %s did not answer for %g s, and SLURM still counts "
                "it in the job; leaving the job to it",
                job.batch_host,
                wait_s,
            )
            return job, None
        if not said:
            log.warning(
                "the batch host %s does not answer; waiting (at most %g s) for SLURM "
                "to say whether it is lost",
                job.batch_host,
                wait_s,
            )
            said = True
        time.sleep(VERDICT_POLL_S)


def slurmd_answers(slurm: Slurm, host: str) -> bool:
    """Whether ``host``'s slurmd takes a connection; True where that cannot be told."""
    try:
        fields = slurm.node_fields(host)
        addr, port = fields.get("NodeAddr") or host, int(fields.get("Port") or slurmd_port(slurm))
    except (SlurmError, ValueError):
        return True
    try:
        socket.create_connection((addr, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError:
        return False
    return True


def slurmd_port(slurm: Slurm) -> int:
    """SlurmdPort from ``scontrol show config`` (6818 where it is not said)."""
    try:
        for line in slurm.config().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "SlurmdPort":
                return int(value.strip())
    except (SlurmError, ValueError):
        pass
    return SLURMD_PORT


@contextmanager
def sigterm_ignored() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class Deputy:
    """The agent that ends or requeues the job in its lost batch host's place."""

    job_id: int
    requeue: int
    node: str
    folder: JobFolder
    slurm: Slurm
    env: Mapping[str, str]
    job: JobView
    lost: str  # the batch host
    silent_s: float | None = None  # how long its supervisor's heartbeat stood still

    def what(self) -> str:
        """What happened to the supervisor, in a few words."""
        if self.silent_s is not None:
            return (
                f"the supervisor on {self.lost} has not answered for {self.silent_s:.0f} s "
                "(its heartbeat stood still)"
            )
        return f"the batch host {self.lost} is lost"

    @property
    def reason(self) -> policy.Reason:
        if self.silent_s is not None:
            return policy.Reason.SUPERVISOR_SILENT
        return policy.Reason.BATCH_HOST_LOST

    @property
    def keep_out(self) -> tuple[str, ...]:
        """The node kept out of the next run: a lost host, not a silent supervisor's."""
        return () if self.silent_s is not None else (self.lost,)

    def note(self, did: str) -> str:
        """The history's line for what this deputy ``did``."""
        if self.silent_s is not None:
            return (
                f"the supervisor on {self.lost} stopped answering; the agent on {self.node} {did}"
            )
        return f"the batch host {self.lost} was lost; the agent on {self.node} {did}"

    def say(self, line: str) -> None:
        """Put ``line`` in the batch log, which srun no longer feeds (its host is lost)
        or feeds through the stopped supervisor; logged where it cannot be (logged
        always, it would come twice from a supervisor that is continued)."""
        if self.job.batch_log is None:
            log.warning("%s", line)
            return
        try:
            with open(self.job.batch_log, "a") as out:
                out.write(f"hpclaunch[job {self.job_id} node {self.node}]: {line}\n")
        except OSError as exc:
            log.warning("%s", line)
            log.warning("could not write to the batch log %s: %s", self.job.batch_log, exc)

    def act(self, status: int) -> int:
        if self.silent_s is not None:
            self.say(f"{self.what()}, so the agent on {self.node} takes its role")
        else:
            self.say(
                f"the batch host {self.lost} is lost ({why_lost(self.job, self.lost)}): its "
                f"supervisor and srun are gone, so the agent on {self.node} takes their role"
            )
        statuses = self.wait_others(status)
        failed = {node: s for node, s in statuses.items() if s != 0}
        history = History.load(self.folder.root, self.job_id)
        if not failed:
            return self.complete(history)
        nodes = ", ".join(f"{n} (exit {s})" for n, s in sorted(failed.items()))
        self.say(f"the training did not finish: the agents on {nodes} failed")
        if policy.over_budget(self.requeue + 1, history.max_requeues):
            return self.end_failed(history, status or 1)
        return self.requeue_without_lost(history, status or 1)

    def wait_others(self, status: int) -> dict[str, int]:
        """Every survivor's status, as their agents note them (within OTHERS_WAIT_S)."""
        others = tuple(n for n in self.job.nodes if n not in (self.node, *self.keep_out))
        deadline = time.monotonic() + OTHERS_WAIT_S
        found = read_run(self.folder.root, self.requeue).ended(others)
        while len(found) < len(others) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
            found = read_run(self.folder.root, self.requeue).ended(others)
        missing = sorted(set(others) - set(found))
        if missing:
            self.say(
                f"no end noted by the agents on {', '.join(missing)} "
                f"within {OTHERS_WAIT_S:g} s; going by the others"
            )
        return {**found, self.node: status}

    def complete(self, history: History) -> int:
        done = policy.Decision(policy.Action.NONE, policy.Reason.COMPLETED, 0)
        self.record(history, 0, done, self.note("ended the job"))
        try:
            libslurm.complete_job(self.job_id, 0)
        except SlurmError as exc:
            self.say(
                f"the training finished, but the job could not be ended COMPLETED "
                f"({exc}); requeueing it: its next run finds the training done at its "
                "latest checkpoint"
            )
            return self.requeue_without_lost(history, 0)
        self.say("the training finished: the job ends COMPLETED")
        return 0

    def requeue_without_lost(self, history: History, status: int) -> int:
        excluded = list(dict.fromkeys([*history.excluded_nodes, *self.keep_out]))
        decision = policy.Decision(policy.Action.REQUEUE, self.reason, status, self.keep_out)
        without = f" without {','.join(excluded)}" if excluded else ""
        self.say(
            f"requeueing the job{without} (requeue {self.requeue + 1} of at most "
            f"{history.max_requeues}); the next run resumes from the latest checkpoint"
        )
        self.record(history, status, decision, self.note("requeued the job"))
        patience = Patience(DEFAULT_SUPERVISOR_GRACE_S, DEFAULT_SUPERVISOR_GRACE_S)
        try:
            requeue_job(self.slurm, self.job_id, excluded, patience.window(), self.requeue)
        except SlurmError as exc:
            self.say(f"the job could not be requeued ({describe(exc)}); ending it FAILED")
            failed = policy.Decision(policy.Action.REQUEUE_FAILED, decision.reason, status)
            self.record(history, status, failed, self.note("could not requeue the job"))
            return self.end(status)
        return status

    def end_failed(self, history: History, status: int) -> int:
        gave_up = policy.Decision(policy.Action.GIVE_UP, self.reason, policy.GAVE_UP_STATUS)
        self.say(
            f"the job has been requeued {self.requeue} times (--max-requeues "
            f"{history.max_requeues}); giving up: the job ends FAILED"
        )
        self.record(history, status, gave_up, self.note("ended the job"))
        return self.end(policy.GAVE_UP_STATUS)

    def end(self, status: int) -> int:
        """End the job FAILED with ``status``; where libslurm cannot, cancel it."""
        try:
            libslurm.complete_job(self.job_id, status)
        except SlurmError as exc:
            self.say(f"could not end the job FAILED ({exc}); cancelling it instead")
            try:
                self.slurm.cancel(self.job_id)
            except SlurmError as cancel:
                self.say(
                    f"could not cancel it either ({describe(cancel)}): scancel "
                    f"{self.job_id} by hand"
                )
        return status

    def record(self, history: History, status: int, decision: policy.Decision, note: str) -> None:
        """Close this run's entry in ``history.json`` (the supervisor opened it)."""
        run = next((r for r in reversed(history.runs) if r.requeue_count == self.requeue), None)
        if run is None or run.token is None:
            run = history.start(self.env, self.requeue)
        error = note if decision.reason is self.reason else None
        finish(run, status, None, decision, error, verdict=note)
        try:
            history_store.save_run(self.folder.root, history, run)
        except (OSError, HpclaunchError) as exc:
            self.say(f"could not record the run in {self.folder.history}: {exc}")
