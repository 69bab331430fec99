"""A bug in the script fails the job at once: when every worker of an attempt failed
with the same error of its own, restarting in place would only print it again (three
more times with the default ``--max-restarts``). No torch.

After its workers failed, each agent writes its failure record (``hpclaunch.jobdir.
failures``). When every worker of its own failed by itself with one error, it reads the
other nodes' records of the same attempt (for a few seconds, as they are written) and,
when every node failed that way (each with at least one worker whose error is that one,
the others stopped by their agent), it restarts no more: the job ends with the root
cause, once. A crash of one rank never qualifies: its peers are stopped, not failed.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from hpclaunch.jobdir import failures
from hpclaunch.jobdir.errortext import normalise
from hpclaunch.jobdir.failures import NodeRecord, WorkerFailure

log = logging.getLogger(__name__)

PEERS_WAIT_S = 5.0  # for the other nodes' records of the attempt
_POLL_S = 0.2


def own_error(workers: Sequence[WorkerFailure]) -> str | None:
    """The one error every worker of ``workers`` failed with by itself, normalised; None
    when any was stopped, waited for a peer, or failed otherwise. Pure."""
    if not workers or any(w.symptom or w.waited or w.exitcode < 0 for w in workers):
        return None
    forms = {normalise(w.message) for w in workers}
    return forms.pop() if len(forms) == 1 else None


def same_bug(records: Sequence[NodeRecord], nodes: int) -> str | None:
    """The error, when the records of all ``nodes`` nodes show it on every node, each
    worker either failing with it by itself or stopped by its agent (SIGTERM); else
    None. Pure."""
    if nodes <= 0 or len({r.node for r in records}) < nodes:
        return None
    seen: set[str] = set()
    for record in records:
        own = [w for w in record.workers if w.exitcode != -signal.SIGTERM]
        error = own_error(own)
        if error is None:
            return None
        seen.add(error)
    if len(seen) != 1:
        return None
    return next(w.message for r in records for w in r.workers if w.exitcode != -signal.SIGTERM)


def everywhere(
    job_dir: Path, requeue: int, attempt: int, mine: NodeRecord, nodes: int,
    wait_s: float = PEERS_WAIT_S,
) -> str | None:  # fmt: skip
    """The error of attempt ``attempt`` when every node's workers failed with it by
    themselves (see same_bug), read from the job folder; None otherwise. Waits for the
    other nodes' records only when ``mine`` (this node's) qualifies."""
    if own_error(mine.workers) is None:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        records = [r for r in failures.read(job_dir, requeue) if r.attempt == attempt]
        bug = same_bug(records, nodes)
        if bug is not None or len({r.node for r in records}) >= nodes:
            return bug
        if time.monotonic() > deadline:
            return None
        time.sleep(_POLL_S)
