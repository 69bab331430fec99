"""The supervisor's verdict on a failed step, beyond the failure records: a test write
into the job's shared folders (a full or read-only filesystem may have left no record
that says so), and the one message a person reads when the job ends for a reason no
requeue can help (storage, a hang)."""

from __future__ import annotations

import errno as errnos
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hpclaunch.contract.worker_env import CHECKPOINT_DIR
from hpclaunch.errors import SlurmError
from hpclaunch.jobdir import failures
from hpclaunch.jobdir.errortext import SharedFolder, StorageErrno, StorageFault
from hpclaunch.jobdir.failures import Finding, NodeRecord, Verdict
from hpclaunch.jobdir.history import Reason
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.slurm.commands import NodeState, Slurm

log = logging.getLogger(__name__)

# The reasons a job ends with a verdict (``explain``) in its history, by verdict.
REASON_OF = {
    Verdict.STORAGE: Reason.STORAGE,
    Verdict.HANG: Reason.HANG,
    Verdict.EARLY_EXIT: Reason.EARLY_EXIT,
}
REASONS = frozenset(REASON_OF.values())
# A test write this large is refused by a filesystem with no block left.
_PROBE_BYTES = 4096
_PROBED = {getattr(errnos, e.name): e for e in StorageErrno if e.is_errno}
# How long the test write may take: a hung mount (a lost NFS or Lustre server) would
# hold it, and the supervisor with it, forever.
PROBE_TIMEOUT_S = 30.0


def shared(env: Mapping[str, str], job_dir: Path) -> tuple[SharedFolder, ...]:
    """The job's shared folders: ``HPCLAUNCH_CHECKPOINT_DIR`` and the job folder."""
    return failures.shared_folders(job_dir, env.get(CHECKPOINT_DIR) or None)


def examine(
    records: Sequence[NodeRecord],
    step_nodes: Sequence[str],
    folders: Sequence[SharedFolder],
    probe_timeout_s: float = PROBE_TIMEOUT_S,
    write: Callable[[Path], OSError | None] | None = None,
) -> Finding:
    """What the failure records say (``failures.classify``); a storage fault when they
    do not name one but a test write (``write``, else ``probe``) into a shared folder
    is refused now, or gets no answer in ``probe_timeout_s``."""
    finding = failures.classify(records, step_nodes, folders)
    if finding.verdict is Verdict.STORAGE:
        return finding
    for folder in folders:
        refused = probe_in_time(Path(folder.path), probe_timeout_s, write or probe)
        if refused is None:
            continue
        if isinstance(refused, TimeoutError):
            message = f"a test write into {folder.path} {refused}"
            errno = StorageErrno.HUNG
        else:
            message = f"a test write into {folder.path} failed: {refused}"
            errno = _PROBED[refused.errno]
        return Finding(
            Verdict.STORAGE,
            message=message,
            storage=StorageFault(folder, errno),
            seen_on=(socket.gethostname(),),
        )
    return finding


def probe_in_time(
    folder: Path, timeout_s: float, write: Callable[[Path], OSError | None]
) -> OSError | TimeoutError | None:
    """``write(folder)`` (see ``probe``) in a daemon thread; a TimeoutError when it has
    not returned in ``timeout_s`` (the thread stays blocked in the filesystem and ends
    with the process)."""
    done: list[OSError | None] = []
    thread = threading.Thread(
        target=lambda: done.append(write(folder)), name="hpclaunch-probe", daemon=True
    )
    thread.start()
    thread.join(timeout_s)
    if not done:
        return TimeoutError(f"did not answer in {timeout_s:g} s")
    return done[0]


def probe(folder: Path) -> OSError | None:
    """The storage error (see StorageErrno) a small file written into ``folder`` gets,
    if any; None when it is written (and removed again), or fails otherwise (a folder
    that does not exist yet is no verdict)."""
    path = folder / f".hpclaunch-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"\0" * _PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)
    except OSError as exc:
        return exc if exc.errno in _PROBED else None
    return None


def stands(finding: Finding | None, reason: Reason) -> bool:
    """Whether the policy ended the job for ``finding``'s verdict (``reason``): only
    then is its message (``explain``) true (a cancelled job was not ended by it)."""
    return finding is not None and REASON_OF.get(finding.verdict) is reason


def hang_or_lost(finding: Finding, slurm: Slurm, step_nodes: Sequence[str]) -> Finding:
    """``unless_lost`` with the node states SLURM gives now; the hang stands when SLURM
    cannot be asked."""
    if finding.verdict is not Verdict.HANG:
        return finding
    try:
        states = slurm.node_states()
    except SlurmError as exc:
        log.warning("supervisor: could not ask SLURM whether a node is lost: %s", exc)
        return finding
    return unless_lost(finding, states, step_nodes)


def unless_lost(
    finding: Finding, states: Mapping[str, NodeState], step_nodes: Sequence[str]
) -> Finding:
    """A hang, unless a node of the step is lost (down or not responding, as SLURM
    says in ``states``): the ranks there did not hang, they are gone, and the others
    timed out waiting for them. Then those nodes are bad nodes (kept out of a requeue),
    as SLURM would have it once it notices."""
    if finding.verdict is not Verdict.HANG:
        return finding
    down = tuple(node for node in step_nodes if node in states and states[node].lost)
    if not down:
        return finding
    log.info("supervisor: the ranks timed out, but %s is lost: not a hang", ",".join(down))
    return Finding(Verdict.BAD_NODES, down, f"node lost ({', '.join(down)} down or not responding)")


def explain(
    finding: Finding | None, job_id: int, job_dir: Path | None, step_nodes: Sequence[str] = ()
) -> str | None:
    """The one message for a job that ends because of ``finding`` where no node is to
    blame (storage, a hang): what happened, what hpclaunch did, and the fix. None for
    the other verdicts (the root-cause block says it)."""
    if finding is None:
        return None
    if finding.verdict is Verdict.STORAGE and finding.storage is not None:
        return storage_message(finding.storage, job_id, finding.seen_on, step_nodes)
    if finding.verdict is Verdict.HANG and finding.message.startswith(failures.HUNG):
        where = f" (stacks in {JobFolder(job_dir).root / 'hangs'})" if job_dir is not None else ""
        return (
            f"the workers hung on every node, and restarting them in place did not help "
            f"({finding.message}): no node is to blame, so none is kept out and the job is "
            f"not requeued. `hpclaunch status {job_id}` names the rank each hang began with, "
            f"and where every rank waited{where}; mend the cause, then "
            f"`scontrol requeue {job_id}` resumes the job from its last checkpoint"
        )
    if finding.verdict is Verdict.EARLY_EXIT:
        return (
            f"{finding.message}: its script ended there by itself (sys.exit(0), or a return "
            "from main) before the others were done, and they failed without it. That is "
            "the script's doing, not a node's: none is kept out and the job is not "
            "requeued (it would end the same way). Let every rank run to the same end (a "
            "collective such as dist.barrier() before leaving), then "
            f"`scontrol requeue {job_id}` resumes the job from its last checkpoint"
        )
    if finding.verdict is Verdict.HANG:
        logs = f" (their logs: {JobFolder(job_dir).logs})" if job_dir is not None else ""
        return (
            f"every rank that failed timed out waiting in a collective ({finding.message}): "
            "a rank hung, or the ranks do not call the same collectives in the same order. "
            "The failure records cannot tell which, so no node is kept out and the job "
            f"is not requeued{logs}. Find the rank that never reached the collective "
            f"(`py-spy dump` of a rank's pid shows where it is), then "
            f"`scontrol requeue {job_id}` resumes the job from its last checkpoint"
        )
    return None


def storage_message(
    fault: StorageFault, job_id: int, seen_on: Sequence[str] = (), step_nodes: Sequence[str] = ()
) -> str:
    """What a person reads when a shared folder refused the job's files: which folder,
    how, on which hosts (one node's bad mount looks the same), and the fix."""
    folder, errno = fault.folder, fault.errno
    how = f"{errno.value} ({errno.name})" if errno.is_errno else f"{errno.value} in time"
    where = _where(folder, seen_on, step_nodes)
    return (
        f"the {folder.role} {folder.path} cannot be written: {how}{where}. "
        f"No node is kept out, and the job is not requeued (it would fail the same way). "
        f"Fix: {errno.fix}, then `scontrol requeue {job_id}` resumes the job from its last "
        f"checkpoint; or submit it again with {folder.option} on another filesystem"
    )


def _where(folder: SharedFolder, seen_on: Sequence[str], step_nodes: Sequence[str]) -> str:
    """On which hosts the error was seen; where that is not every node of the step, how
    to tell that node's own mount from the shared filesystem."""
    if not seen_on:
        return ""
    hosts = ", ".join(seen_on)
    if len(set(step_nodes)) <= 1 or set(step_nodes) <= set(seen_on):
        return f", seen on {hosts}"
    return (
        f", seen on {hosts} only (of {len(set(step_nodes))} nodes): where the other nodes "
        f"can write there, it is that node's mount, not the shared filesystem (compare "
        f"`df -h {folder.path}` and `mount` on it and on another node)"
    )
