"""What ``hpclaunch stacks`` does: ask the agents of a running job for the live stacks
of their ranks, through the job folder, and read the answers back.

The login node only writes the request and reads; each node's agent reads its own
ranks' stacks (py-spy, else the workers' faulthandler signal) when its hang watch next
looks for requests, about every 2 s (hpclaunch.node.hangs; the files are
hpclaunch.jobdir.hangs'). The nodes asked are those of the job's latest attempt, by the
rank lists the agents note beside the rank logs. No click, no torch.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.errors import ExitCode, HpclaunchError
from hpclaunch.jobdir import hangs as protocol
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.node.stacks import grouped, ranks_text
from hpclaunch.ops.status import JobNotFound, JobStatus, find
from hpclaunch.slurm.commands import Slurm
from hpclaunch.slurm.hostlist import compress
from hpclaunch.slurm.states import JobState

TIMEOUT_S = protocol.ANSWER_WAIT_S
POLL_S = 0.2  # between two looks for answers


class NotRunning(HpclaunchError):
    """The job has no running workers whose stacks could be read."""


class NoAnswer(HpclaunchError):
    """No node's agent answered in time."""


@dataclass(frozen=True)
class Workers:
    """Whom a request goes to: the job's latest attempt, its nodes and their ranks."""

    job: JobFolder
    label: str  # "requeue Q, step S, attempt A"
    nodes: Mapping[str, list[int]]  # node -> the global ranks it runs


@dataclass(frozen=True)
class LiveStacks:
    """What the nodes answered: every rank's raw stack text, and who did not answer."""

    job_id: int
    workers: Workers
    stacks: Mapping[int, str]  # rank -> its stack as its agent read it
    answered: tuple[str, ...]  # nodes, in name order
    waited_s: float
    timeout_s: float

    @property
    def silent(self) -> dict[str, list[int]]:
        """The nodes asked that did not answer in time -> their ranks."""
        return {n: r for n, r in sorted(self.workers.nodes.items()) if n not in self.answered}

    @property
    def unread(self) -> dict[str, list[int]]:
        """Nodes that answered without some of their ranks (a worker that had exited)."""
        out = {}
        for node in self.answered:
            left = [r for r in self.workers.nodes.get(node, []) if r not in self.stacks]
            if left:
                out[node] = left
        return out


def current_workers(status: JobStatus) -> Workers:
    """The nodes and ranks of a running job's latest attempt. Raises NotRunning (exit
    code SLURM's when SLURM could not be asked) naming the state and what to do."""
    if status.job_state is not JobState.RUNNING:
        error = NotRunning(not_running(status))
        if status.slurm_unreachable:
            error.exit_code = ExitCode.SLURM
        raise error
    if status.job_dir is None:
        raise JobNotFound(f"job {status.job_id}'s folder is unknown: " + "; ".join(status.notes))
    folder = JobFolder(Path(status.job_dir))
    attempts = folder.attempts()
    latest = attempts[-1] if attempts else None
    nodes = latest.node_ranks() if latest is not None else {}
    behind = latest is not None and status.requeues is not None and latest.requeue < status.requeues
    if latest is None or behind or not nodes:
        raise NotRunning(
            f"job {status.job_id} is RUNNING, but its workers have not started yet (no "
            f"node's rank list for this run under {folder.logs}); try again in a few seconds"
        )
    return Workers(folder, latest.label, nodes)


def not_running(status: JobStatus) -> str:
    """Why a job that is not RUNNING has no stacks to read, and what to do."""
    job = status.job_id
    if status.job_state is JobState.PENDING:
        why = f" ({status.pending_reason})" if status.pending_reason else ""
        return (
            f"job {job} is PENDING{why}: it has no workers yet, so no stacks; ask again "
            f"once `hpclaunch status {job}` says RUNNING"
        )
    if status.ended:
        saved = f" in {Path(status.job_dir) / 'hangs'}" if status.job_dir else ""
        return (
            f"job {job} has ended ({status.state}): its workers are gone, so there are no "
            f"live stacks; the stacks read at a hang, if there was one, are kept{saved} "
            f"(`hpclaunch status {job}` names them)"
        )
    if status.state is None:
        return f"job {job}'s state is unknown, so it cannot be asked: " + "; ".join(status.notes)
    return (
        f"job {job} is {status.state}, not RUNNING: only a running job's agents read "
        f"stacks; ask again once `hpclaunch status {job}` says RUNNING"
    )


def ask(
    job_id: int,
    slurm: Slurm | None,
    env: Mapping[str, str],
    job_dir: Path | None = None,
    timeout_s: float = TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> LiveStacks:
    """Ask job ``job_id``'s agents for their ranks' stacks and wait until every node of
    its latest attempt answered, or ``timeout_s``. The request and the answers are
    removed afterwards. Raises JobNotFound, NotRunning; HpclaunchError when the request
    cannot be written; NoAnswer when no node answered in time."""
    found = find(job_id, slurm, env, job_dir)
    workers = current_workers(found)
    job = workers.job
    start = clock()
    try:
        request = protocol.request_stacks(job)
    except OSError as exc:
        raise HpclaunchError(
            f"cannot leave the stacks request for job {job_id}'s agents in {job.stacks}: "
            f"{exc.strerror or exc} (is it your job? the agents read requests from there)"
        ) from None
    try:
        answers = wait_answers(job, request, workers.nodes, timeout_s, clock, sleep)
    finally:
        # Printed here, and a request left would be answered by every agent that
        # starts later (a restart, a requeue): nothing of it is kept.
        withdraw(job, request)
    stacks = {rank: text for answer in answers.values() for rank, text in answer.items()}
    found_stacks = LiveStacks(
        job_id, workers, stacks, tuple(sorted(answers)), clock() - start, timeout_s
    )
    if not answers:
        raise NoAnswer(
            f"no node of job {job_id} answered in {timeout_s:g} s (asked: "
            f"{compress(sorted(workers.nodes))}, {workers.label}): {_silent(job_id)}; ask again, "
            "or give a longer --timeout"
        )
    return found_stacks


def wait_answers(
    job: JobFolder,
    request: str,
    nodes: Mapping[str, list[int]],
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, dict[int, str]]:
    """node -> its answer (rank -> stack text), once each of ``nodes`` answered
    ``request`` or ``timeout_s`` passed; answers of other nodes are taken too."""
    deadline = clock() + timeout_s
    answers: dict[str, dict[int, str]] = {}
    while True:
        answers.update(read_answers(job, request, skip=answers))
        if set(nodes) <= set(answers) or clock() >= deadline:
            return answers
        sleep(max(0.0, min(POLL_S, deadline - clock())))


def read_answers(
    job: JobFolder, request: str, skip: Collection[str] = ()
) -> dict[str, dict[int, str]]:
    """node -> its answer to ``request`` (rank -> text): the answers there now, but
    those of the nodes in ``skip``. An agent writes its answer whole (a rename), so one
    that is there is complete."""
    out = {}
    for path in sorted(_answers(job, request).glob("node-*.txt")):
        node = path.name.removeprefix("node-").removesuffix(".txt")
        if node in skip:
            continue
        try:
            out[node] = protocol.from_sections(path.read_text(errors="replace"))
        except OSError:
            continue  # removed under us: not an answer
    return out


def withdraw(job: JobFolder, request: str) -> None:
    """Remove ``request``, so that no agent answers it any more, then its answers.
    Never raises: what cannot be removed stays."""
    with contextlib.suppress(OSError):
        (job.stacks / f"request-{request}").unlink(missing_ok=True)
    shutil.rmtree(_answers(job, request), ignore_errors=True)


def _answers(job: JobFolder, request: str) -> Path:
    """The folder of the answers to ``request`` (where protocol.answer_path puts them)."""
    return protocol.answer_path(job, request, "any").parent


def render(found: LiveStacks, raw: bool = False) -> str:
    """The report ``hpclaunch stacks`` prints: a line naming the job and attempt, then
    each distinct stack once under the ranks that share it (most ranks first), or with
    ``raw`` each rank's text as read; then the nodes and ranks missing. Pure."""
    nodes = compress(sorted(found.workers.nodes))
    count = len(found.stacks)
    lines = [
        f"job {found.job_id}: stacks of {count} rank{'s' if count != 1 else ''} on {nodes} "
        f"({found.workers.label}), read in {found.waited_s:.1f} s"
    ]
    if raw:
        lines += ["", protocol.sections(found.stacks).rstrip()]
    else:
        for ranks, text in grouped(found.stacks):
            lines += ["", f"{group_header(ranks)}:", _indent(text)]
    missing = missing_lines(found)
    if missing:
        lines += ["", *missing]
    return "\n".join(lines)


def group_header(ranks: list[int]) -> str:
    """ "ranks 0-3 (4 ranks)", or "rank 5" alone."""
    return _ranks(ranks) + (f" ({len(ranks)} ranks)" if len(ranks) > 1 else "")


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)}"


def missing_lines(found: LiveStacks) -> list[str]:
    """One line per node that did not answer, or answered without some of its ranks."""
    lines = [
        f"no answer from {node} ({_ranks(ranks)}) in {found.timeout_s:g} s: {_silent(found.job_id)}"
        for node, ranks in found.silent.items()
    ]
    lines += [
        f"{node} answered without {_ranks(ranks)} (its worker had exited)"
        for node, ranks in found.unread.items()
    ]
    return lines


def _silent(job_id: int) -> str:
    return (
        "an agent looks for requests every 2 s while its workers run, so it may be "
        f"restarting them, still reading a stack, or gone (`hpclaunch logs {job_id}` says)"
    )


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" if line else line for line in text.splitlines())
