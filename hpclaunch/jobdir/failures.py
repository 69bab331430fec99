"""Failure records: what each node's agent saw fail, and what the supervisor makes of
them. Pure: no torch, no SLURM calls.

Every time a node's worker group fails, its agent writes one record::

    JOB_DIR/failures/requeue-Q/attempt-A/node-HOST.json   (see hpclaunch.jobdir.layout)

with the failed workers' ranks, exit codes and one-line messages (the last line of
each traceback, else of the rank's stderr). When the job step has failed, the
supervisor reads the records of its run and ``classify`` tells a bug in the script
(the same error on every node) from bad nodes (errors of their own on some nodes,
only symptoms of a lost peer on the others), from a shared folder that cannot be
written (no node is to blame), and from a hang (collectives that timed out).
"""

from __future__ import annotations

import enum
import json
import re
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from hpclaunch.jobdir import typed
from hpclaunch.jobdir.atomic import write_bytes_atomic
from hpclaunch.jobdir.errortext import SharedFolder, StorageFault, storage_fault, timed_out
from hpclaunch.jobdir.joblogs import Failure, describe_exit, traceback_of
from hpclaunch.jobdir.layout import JobFolder

# What a worker reports when a *peer* died: it failed because another one did. gloo,
# NCCL and the c10d store word it differently; the agent's own SIGTERM is one too.
SYMPTOMS = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited"
    r"|NCCL communicator was aborted|DistNetworkError|Socket Timeout|failed to recv",
    re.IGNORECASE,
)


# The messages of a hang that hpclaunch's hang detector stopped (hpclaunch.jobdir.hangs):
# the rank a node names as hung (an error of that node's own), and the ranks that waited.
HUNG = "hung:"
WAITED_FOR_HANG = "stopped by the hang detector while it waited for a hung rank:"
# A node on which hangs began this many times is a bad node (its agent restarts no more).
HANGS_TO_BAD_NODE = 2
# A rank its node named while the hang could not be put on one node: not its own error.
NOT_BLAMED = "hung, with no node to blame:"
# A rank that exited 0 while the others of its group had not ended (see early_exit).
EXITED_EARLY = "exited 0"


def early_exit(step: int | None) -> str:
    """The message of a rank that exited 0 while its peers went on: torch's agent waits
    for the rest of the group and reports only the peers, which then fail waiting for
    it (``Connection closed by peer``)."""
    at = f" at step {step}" if step is not None else ""
    return f"{EXITED_EARLY}{at} while the others trained on"


def exited_early(ended: Mapping[int, int]) -> tuple[int, ...]:
    """The local ranks of a node to name as exited early, from the exit codes of its
    workers that ended (local rank -> code): those that exited 0, once another rank of
    the node failed. Ranks that exit 0 while others still run are not early yet: at a
    training's end they finish milliseconds apart, and a rank 0 saves alone after the
    others. A node whose ranks all exit 0 is not named either (it finished, as far as
    it can tell: with one rank per node an early exit is not told apart). Pure."""
    if not any(code != 0 for code in ended.values()):
        return ()
    return tuple(sorted(local for local, code in ended.items() if code == 0))


@dataclass(frozen=True)
class WorkerFailure:
    rank: int
    exitcode: int
    message: str

    @property
    def symptom(self) -> bool:
        """Whether this failure is the echo of another worker's (see SYMPTOMS)."""
        return self.exitcode == -signal.SIGTERM or bool(SYMPTOMS.search(self.message))

    @property
    def early(self) -> bool:
        """Whether this worker did not fail but exited 0 before its peers (early_exit)."""
        return self.exitcode == 0

    @property
    def waited(self) -> bool:
        """Whether this worker failed waiting for a peer that never answered (a
        collective's timeout): the echo of a hang elsewhere, not an error of its own."""
        return timed_out(self.message) or self.message.startswith((WAITED_FOR_HANG, NOT_BLAMED))


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
        return [w for w in self.workers if not w.symptom and not w.waited]


def message_of(failure: Failure) -> str:
    """One line for a failed worker: its traceback's or stderr's last line, else its exit;
    but a collective's timeout in the last lines of its stderr, when that line is not
    one (NCCL's watchdog aborts the process: its stderr ends in C++ frames and
    ``terminate called``, which would read as an error of the rank's own)."""
    text, _ = traceback_of(failure)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = _LOG_PREFIX.sub("", lines[-1]) if lines else ""
    if not timed_out(last):
        last = _timeout_line(failure.stderr_file) or last
    return last or describe_exit(failure.exitcode)


# What torch puts before a line of a rank's log: [rank1]:, glog's [E1124 17:25:49.5 12 x.cpp:616]
_LOG_PREFIX = re.compile(r"^(?:\[rank\d+\]:\s*)?(?:\[[EWIF]\d{4} [^\]]*\]\s*)?")
_TIMEOUT_TAIL_LINES = 80


def _timeout_line(stderr_file: str) -> str:
    """The first line among the last lines of ``stderr_file`` that says a collective
    timed out (see errortext.timed_out); "" when none does or it cannot be read."""
    if not stderr_file:
        return ""
    try:
        tail = Path(stderr_file).read_text(errors="replace").splitlines()[-_TIMEOUT_TAIL_LINES:]
    except OSError:
        return ""
    found = (_LOG_PREFIX.sub("", line.strip()) for line in tail if timed_out(line))
    return next(found, "")


def write(job_dir: Path, record: NodeRecord) -> Path:
    """Write ``record`` atomically; returns its path. Raises OSError."""
    path = JobFolder(job_dir).failure_record(record.requeue_count, record.attempt, record.node)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, (json.dumps(asdict(record), indent=2) + "\n").encode())
    return path


def record_of(
    node: str,
    node_rank: int,
    requeue_count: int,
    attempt: int,
    failures: Iterable[Failure],
    messages: Mapping[int, str] | None = None,
) -> NodeRecord:
    """The record of one failed attempt; ``messages`` (rank -> message) says what the
    agent knows better than the worker's output (a hang it stopped). A rank in
    ``messages`` that did not fail exited 0 while the others went on: it is recorded
    with exit code 0 (see early_exit)."""
    given = messages or {}
    failed = {f.rank: f for f in failures}
    workers = tuple(
        WorkerFailure(f.rank, f.exitcode, given.get(f.rank) or message_of(f))
        if (f := failed.get(rank)) is not None
        else WorkerFailure(rank, 0, given[rank])
        for rank in sorted({*failed, *given})
    )
    return NodeRecord(node, node_rank, requeue_count, attempt, time.time(), workers)


RECORD_PREFIX, RECORD_SUFFIX = "node-", ".json"  # failures/requeue-Q/attempt-A/node-HOST.json
BLOCK_PREFIX, BLOCK_SUFFIX = "root-cause-", ".txt"  # failures/requeue-Q/root-cause-HOST.txt


def is_record(name: str) -> bool:
    """Whether ``name`` (in ``failures/requeue-Q/attempt-A/``) is a node's record."""
    return name.startswith(RECORD_PREFIX) and name.endswith(RECORD_SUFFIX)


def block_node(name: str) -> str | None:
    """The node whose root-cause block ``name`` (in ``failures/requeue-Q/``) is; None
    for another file."""
    if name.startswith(BLOCK_PREFIX) and name.endswith(BLOCK_SUFFIX):
        return name[len(BLOCK_PREFIX) : -len(BLOCK_SUFFIX)]
    return None


def parse(text: str) -> NodeRecord:
    """A record from its file's text. Raises ValueError (a torn or foreign file)."""
    return typed.load(NodeRecord, json.loads(text))


def write_block(job_dir: Path, requeue_count: int, node: str, block: str) -> Path:
    """Leave ``block`` where the supervisor looks for ``node``'s root cause; returns its
    path. Raises OSError."""
    path = JobFolder(job_dir).root_cause(requeue_count, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, (block + "\n").encode())
    return path


def shared_folders(
    job_dir: Path | str | None, checkpoint_dir: Path | str | None
) -> tuple[SharedFolder, ...]:
    """The folders every node of a job writes to: its checkpoint folder (first: it is
    often inside the job folder) and its job folder."""
    folders = []
    if checkpoint_dir:
        folders.append(SharedFolder("checkpoint folder", str(checkpoint_dir), "--checkpoint-dir"))
    if job_dir:
        folders.append(SharedFolder("job folder", str(job_dir), "--log-dir"))
    return tuple(folders)


def culprit(records: Sequence[NodeRecord], finding: Finding) -> str | None:
    """The node whose root-cause block tells the story: the first bad node, else the
    node with the earliest error of its own; for a shared folder that cannot be
    written, the node that said so; None for a hang (every block there is a waiting
    rank's, not the one that hung)."""
    if finding.verdict is Verdict.HANG:
        return None
    if finding.verdict is Verdict.STORAGE:
        said = [r for r in records if any(w.message == finding.message for w in r.workers)]
        return min(said, key=lambda r: (r.attempt, r.node_rank)).node if said else None
    if finding.nodes:
        return finding.nodes[0]
    own = [r for r in records if r.own_errors]
    return min(own, key=lambda r: (r.attempt, r.time)).node if own else None


class Verdict(enum.Enum):
    BUG = "the same error on every node"
    BAD_NODES = "errors on some nodes only"
    STORAGE = "a shared folder cannot be written"
    HANG = "collectives timed out, waiting for a rank that hung"
    # A rank exited 0 (sys.exit(0), a return from main) while the others trained on;
    # they failed without it. The script's choice, not a node's fault.
    EARLY_EXIT = "a rank exited 0 while the others trained on"
    UNKNOWN = "no failure records"


@dataclass(frozen=True)
class Finding:
    verdict: Verdict
    nodes: tuple[str, ...] = ()  # the bad nodes (BAD_NODES)
    message: str = ""  # the error (BUG, STORAGE, HANG), or the first bad node's
    storage: StorageFault | None = None  # the folder and its error (STORAGE)
    seen_on: tuple[str, ...] = ()  # the hosts that saw that error (STORAGE)


def classify(
    records: Sequence[NodeRecord], step_nodes: Sequence[str], shared: Sequence[SharedFolder] = ()
) -> Finding:
    """What the failure records of a failed step say.

    A worker whose error names a storage error (no space, quota, read-only, permission)
    on a path in one of the ``shared`` folders: the storage, not a node, and every
    other failure follows from it. Otherwise a node *erred* when one of its workers
    failed with an error of its own (not a symptom of a lost peer, nor a collective's
    timeout) in any attempt. Every node of the step erred: a bug in the script. Some
    nodes erred: those are bad; the others saw only symptoms, or no failure at all
    (torch's agent stops a node's workers for a new round before they fail). None
    erred, but collectives timed out: a hang (which rank hung, the records cannot
    tell). A bug whose other records were lost (srun stopped their agents first)
    looks like bad nodes once; the supervisor then sees the error follow its rank."""
    ordered = sorted(records, key=lambda r: (r.attempt, r.time))
    # The first attempt's lowest rank that said it: with one writer, rank 0 has the
    # filesystem's own words; the others echo them.
    said = sorted(
        (
            (r.attempt, w.rank, w.message, fault, r.node)
            for r in ordered
            for w in r.workers
            if (fault := storage_fault(w.message, shared)) is not None
        ),
        key=lambda found: found[:2],
    )
    if said:
        seen_on = tuple(sorted({found[4] for found in said}))
        return Finding(Verdict.STORAGE, message=said[0][2], storage=said[0][3], seen_on=seen_on)
    erred: dict[str, list[str]] = {}
    hung: dict[str, dict[int, str]] = {}  # node -> attempt -> the hang it began
    early: list[str] = []  # "rank R exited 0 at step S ...", first first
    for record in ordered:
        for worker in record.own_errors:
            if worker.early:
                early.append(f"rank {worker.rank} {worker.message}")
            elif worker.message.startswith(HUNG):
                hung.setdefault(record.node, {}).setdefault(record.attempt, worker.message)
            else:
                erred.setdefault(record.node, []).append(worker.message)
    if early and not erred and not hung:
        # The others failed because it left: naming them (or their nodes) would be wrong.
        # A hung rank is an error of its own (a rank 0 stuck in a save of its own after
        # the others exited 0 rightly): the hang, not the clean exits, is what happened.
        return Finding(Verdict.EARLY_EXIT, message=early[0])
    again = {
        node: list(began.values())
        for node, began in hung.items()
        if len(began) >= HANGS_TO_BAD_NODE
    }
    if not erred and again and not set(again) >= set(step_nodes):
        # Hangs began on some nodes only, on more than one attempt: those nodes hang.
        return Finding(Verdict.BAD_NODES, tuple(sorted(again)), next(iter(again.values()))[0])
    if not erred:
        waited = [m for began in hung.values() for m in began.values()]
        waited += [w.message for r in ordered for w in r.workers if w.waited]
        return Finding(Verdict.HANG, message=waited[0]) if waited else Finding(Verdict.UNKNOWN)
    first = next(iter(erred.values()))[0]
    if set(erred) >= set(step_nodes):
        return Finding(Verdict.BUG, message=first)
    return Finding(Verdict.BAD_NODES, tuple(sorted(erred)), first)
