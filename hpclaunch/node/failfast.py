"""A bug in the script fails the job at once: when every worker of an attempt failed
with the same error of its own, restarting in place would only print it again (three
more times with the default ``--max-restarts``). No torch.

After its workers failed, each agent writes its failure record (``hpclaunch.jobdir.
failures``, for the supervisor) and asks ``own_error``: did every worker of this node
fail by itself with one error? Only then does it put that error into the rendezvous
store under ``key(attempt, node)`` and wait, a few seconds at most, for every other
node's (``PEERS_WAIT_S``). When all nodes put the same error there, no agent restarts:
the job ends with the root cause, once. A node whose workers did not all fail so (a
crash of one rank: its peers were stopped) puts nothing, so no node decides, and all
restart as before; an ordinary crash costs no wait at all. A world of one worker never
decides: one rank cannot tell a bug from a blip. The store, not the job folder, carries
this: a shared filesystem may show another host's new files only seconds later.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpclaunch.jobdir.errortext import normalise
from hpclaunch.jobdir.failures import WorkerFailure

PEERS_WAIT_S = 5.0  # for the other nodes' errors of the attempt
_PREFIX = "hpclaunch/same-error"


def own_error(workers: Sequence[WorkerFailure]) -> str | None:
    """The one error every worker of ``workers`` failed with by itself, normalised; None
    when any was stopped, waited for a peer, died of a signal, exited 0 early (the
    others failed without it), or failed otherwise. Pure."""
    if not workers or any(w.symptom or w.waited or w.exitcode <= 0 for w in workers):
        return None
    forms = {normalise(w.message) for w in workers}
    return forms.pop() if len(forms) == 1 else None


def key(attempt: int, node_rank: int) -> str:
    """Where node ``node_rank`` puts its error of ``attempt`` in the rendezvous store."""
    return f"{_PREFIX}/{attempt}/{node_rank}"


def everywhere(error: str, put: Sequence[bytes]) -> bool:
    """Whether every node ``put`` this node's ``error``. Pure."""
    return bool(put) and all(value.decode(errors="replace") == error for value in put)
