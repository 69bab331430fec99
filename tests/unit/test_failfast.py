"""A bug fails at once (hpclaunch.node.failfast): which node's failures are one error of
its own, and when the errors every node put in the rendezvous store agree."""

from __future__ import annotations

import signal

from hpclaunch.jobdir.failures import WorkerFailure
from hpclaunch.node import failfast

BUG = "ValueError: bad value at step 3"
STOPPED = -int(signal.SIGTERM)


def test_every_worker_failing_by_itself_with_one_error_is_the_nodes_error() -> None:
    assert failfast.own_error([WorkerFailure(0, 1, BUG), WorkerFailure(1, 1, BUG)]) == BUG
    # Errors that differ only in pids, ports and addresses are one error.
    a = WorkerFailure(0, 1, "RuntimeError: bind failed on 10.0.0.1:29500 (pid 4242)")
    b = WorkerFailure(1, 1, "RuntimeError: bind failed on 10.0.0.2:29511 (pid 977)")
    assert failfast.own_error([a, b]) is not None


def test_a_crash_of_one_rank_is_no_nodes_error() -> None:
    # Its peers were stopped by the agent, not failed: the node puts nothing in the
    # store, so no node decides and there is no wait.
    crashed = [WorkerFailure(2, 3, "exit code 3"), WorkerFailure(3, STOPPED, "exit code -15")]
    assert failfast.own_error(crashed) is None


def test_other_errors_symptoms_signals_and_timeouts_are_no_nodes_error() -> None:
    assert (
        failfast.own_error([WorkerFailure(0, 1, BUG), WorkerFailure(1, 1, "KeyError: 'lr'")])
        is None
    )
    assert (
        failfast.own_error([WorkerFailure(0, 1, "RuntimeError: Connection reset by peer")]) is None
    )
    waited = (
        "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
        "1800000ms for recv operation to complete"
    )
    assert failfast.own_error([WorkerFailure(0, 1, waited)]) is None
    assert failfast.own_error([WorkerFailure(0, -11, "killed by SIGSEGV")]) is None
    assert failfast.own_error([]) is None


def test_a_bug_only_when_every_node_put_the_same_error() -> None:
    assert failfast.everywhere(BUG, [BUG.encode(), BUG.encode()])
    assert not failfast.everywhere(BUG, [BUG.encode(), b"KeyError: 'lr'"])
    assert not failfast.everywhere(BUG, [])
    assert failfast.key(2, 1) != failfast.key(3, 1) != failfast.key(2, 0)
