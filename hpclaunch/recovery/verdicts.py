"""The supervisor's verdict on a failed step, beyond the failure records: a test write
into the job's shared folders (a full or read-only filesystem may have left no record
that says so), and the one message a person reads when the job ends for a reason no
requeue can help (storage, a hang)."""

from __future__ import annotations

import errno as errnos
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from hpclaunch.jobdir import failures
from hpclaunch.jobdir.errortext import SharedFolder, StorageErrno, StorageFault
from hpclaunch.jobdir.failures import Finding, NodeRecord, Verdict
from hpclaunch.jobdir.history import Reason
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.node.worker_env import CHECKPOINT_DIR

# The reasons a job ends with a verdict (``explain``) in its history.
REASONS = frozenset({Reason.STORAGE, Reason.HANG})
# A test write this large is refused by a filesystem with no block left.
_PROBE_BYTES = 4096
_PROBED = {getattr(errnos, e.name): e for e in StorageErrno}


def shared(env: Mapping[str, str], job_dir: Path) -> tuple[SharedFolder, ...]:
    """The job's shared folders: ``HPCLAUNCH_CHECKPOINT_DIR`` and the job folder."""
    return failures.shared_folders(job_dir, env.get(CHECKPOINT_DIR) or None)


def examine(
    records: Sequence[NodeRecord], step_nodes: Sequence[str], folders: Sequence[SharedFolder]
) -> Finding:
    """What the failure records say (``failures.classify``); a storage fault when they
    do not name one but a test write into a shared folder is refused now."""
    finding = failures.classify(records, step_nodes, folders)
    if finding.verdict is Verdict.STORAGE:
        return finding
    for folder in folders:
        refused = probe(Path(folder.path))
        if refused is not None:
            message = f"a test write into {folder.path} failed: {refused}"
            return Finding(Verdict.STORAGE, message=message,
                           storage=StorageFault(folder, _PROBED[refused.errno]))  # fmt: skip
    return finding


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


def explain(finding: Finding | None, job_id: int, job_dir: Path | None) -> str | None:
    """The one message for a job that ends because of ``finding`` where no node is to
    blame (storage, a hang): what happened, what hpclaunch did, and the fix. None for
    the other verdicts (the root-cause block says it)."""
    if finding is None:
        return None
    if finding.verdict is Verdict.STORAGE and finding.storage is not None:
        return storage_message(finding.storage, job_id)
    if finding.verdict is Verdict.HANG:
        logs = f" (their logs: {JobFolder(job_dir).logs})" if job_dir is not None else ""
        return (
            f"every rank that failed timed out in a collective, waiting for a rank that "
            f"stopped answering: a hang, not an error in the script ({finding.message}). "
            "Which rank hung the failure records cannot tell, so no node is kept out and "
            f"the job is not requeued{logs}. Find the rank that never reached the "
            f"collective (`py-spy dump` of a rank's pid shows where it is), then "
            f"`scontrol requeue {job_id}` resumes the job from its last checkpoint"
        )
    return None


def storage_message(fault: StorageFault, job_id: int) -> str:
    """What a person reads when a shared folder refused the job's files."""
    folder = fault.folder
    return (
        f"the {folder.role} {folder.path} cannot be written: {fault.errno.value} "
        f"({fault.errno.name}). That is the shared filesystem, not a node: no node is kept "
        f"out, and the job is not requeued (it would fail the same way). Fix: "
        f"{fault.errno.fix}, then `scontrol requeue {job_id}` resumes the job from its last "
        f"checkpoint; or submit it again with {folder.option} on another filesystem"
    )
