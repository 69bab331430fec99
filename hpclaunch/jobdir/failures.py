"""Failure records: what each node's agent saw fail, and what the supervisor makes of
them. Pure: no torch, no SLURM calls.

Every time a node's worker group fails, its agent writes one record::

    JOB_DIR/failures/requeue-Q/attempt-A/node-HOST.json

with the failed workers' ranks, exit codes and one-line messages (the last line of
each traceback, else of the rank's stderr). When the job step has failed, the
supervisor reads the records of its run and ``classify`` tells a bug in the script
(the same error on every node) from bad nodes (errors of their own on some nodes,
only symptoms of a lost peer on the others).
"""

from __future__ import annotations

import enum
import json
import re
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from hpclaunch.checkpoint import write_atomic
from hpclaunch.jobdir.joblogs import Failure, describe_exit, traceback_of

# What a worker reports when a *peer* died: it failed because another one did. gloo,
# NCCL and the c10d store word it differently; the agent's own SIGTERM is one too.
SYMPTOMS = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited"
    r"|NCCL communicator was aborted|DistNetworkError|Socket Timeout|failed to recv",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class WorkerFailure:
    rank: int
    exitcode: int
    message: str

    @property
    def symptom(self) -> bool:
        """Whether this failure is the echo of another worker's (see SYMPTOMS)."""
        return self.exitcode == -signal.SIGTERM or bool(SYMPTOMS.search(self.message))


@dataclass(frozen=True)
class NodeRecord:
    node: str
    node_rank: int
    requeue_count: int
    attempt: int
    time: float
    workers: tuple[WorkerFailure, ...]

    @property
    def own_errors(self) -> list[WorkerFailure]:
        return [w for w in self.workers if not w.symptom]


def message_of(failure: Failure) -> str:
    """One line for a failed worker: its traceback's or stderr's last line, else its exit."""
    text, _ = traceback_of(failure)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = re.sub(r"^\[rank\d+\]:\s*", "", lines[-1]) if lines else ""
    return last or describe_exit(failure.exitcode)


def folder(job_dir: Path, requeue_count: int) -> Path:
    return job_dir / "failures" / f"requeue-{requeue_count}"


def write(job_dir: Path, record: NodeRecord) -> Path:
    """Write ``record`` atomically; returns its path."""
    target = folder(job_dir, record.requeue_count) / f"attempt-{record.attempt}"
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"node-{record.node}.json"
    data = (json.dumps(asdict(record), indent=2) + "\n").encode()
    write_atomic(path, lambda handle: handle.write(data), replace=True)
    return path


def record_of(
    node: str, node_rank: int, requeue_count: int, attempt: int, failures: Iterable[Failure]
) -> NodeRecord:
    workers = tuple(
        WorkerFailure(f.rank, f.exitcode, message_of(f))
        for f in sorted(failures, key=lambda f: f.rank)
    )
    return NodeRecord(node, node_rank, requeue_count, attempt, time.time(), workers)


def read(job_dir: Path, requeue_count: int) -> list[NodeRecord]:
    """Every record of one run of the job; unreadable files are skipped."""
    out = []
    for path in sorted(folder(job_dir, requeue_count).glob("attempt-*/node-*.json")):
        try:
            data = json.loads(path.read_text())
            workers = tuple(WorkerFailure(**w) for w in data.pop("workers"))
            out.append(NodeRecord(**data, workers=workers))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return out


def block_path(job_dir: Path, requeue_count: int, node: str) -> Path:
    """Where a supervised agent leaves its root-cause block for the supervisor."""
    return folder(job_dir, requeue_count) / f"root-cause-{node}.txt"


def write_block(job_dir: Path, requeue_count: int, node: str, block: str) -> Path:
    path = block_path(job_dir, requeue_count, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (block + "\n").encode()
    write_atomic(path, lambda handle: handle.write(data), replace=True)
    return path


def culprit(records: Sequence[NodeRecord], finding: Finding) -> str | None:
    """The node whose root-cause block tells the story: the first bad node, else the
    node with the earliest error of its own."""
    if finding.nodes:
        return finding.nodes[0]
    own = [r for r in records if r.own_errors]
    return min(own, key=lambda r: (r.attempt, r.time)).node if own else None


class Verdict(enum.Enum):
    BUG = "the same error on every node"
    BAD_NODES = "errors on some nodes only"
    UNKNOWN = "no failure records"


@dataclass(frozen=True)
class Finding:
    verdict: Verdict
    nodes: tuple[str, ...] = ()  # the bad nodes (BAD_NODES)
    message: str = ""  # the error (BUG), or the first bad node's


def classify(records: Sequence[NodeRecord], step_nodes: Sequence[str]) -> Finding:
    """What the failure records of a failed step say.

    A node *erred* when one of its workers failed with an error of its own (not a
    symptom of a lost peer) in any attempt. Every node of the step erred: a bug in
    the script. Some nodes erred: those are bad; the others saw only symptoms, or no
    failure at all (torch's agent stops a node's workers for a new round before they
    fail). A bug whose other records were lost (srun stopped their agents first) looks
    like bad nodes once; the supervisor then sees the error follow its rank."""
    erred: dict[str, list[str]] = {}
    for record in sorted(records, key=lambda r: (r.attempt, r.time)):
        for worker in record.own_errors:
            erred.setdefault(record.node, []).append(worker.message)
    if not erred:
        return Finding(Verdict.UNKNOWN)
    first = next(iter(erred.values()))[0]
    if set(erred) >= set(step_nodes):
        return Finding(Verdict.BUG, message=first)
    return Finding(Verdict.BAD_NODES, tuple(sorted(erred)), first)
