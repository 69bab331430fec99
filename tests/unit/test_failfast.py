"""A bug fails at once (hpclaunch.node.failfast): which failure records show the same
error of their own on every node of an attempt."""

from __future__ import annotations

import signal
from pathlib import Path

from hpclaunch.jobdir import failures
from hpclaunch.jobdir.failures import NodeRecord, WorkerFailure
from hpclaunch.node import failfast

BUG = "ValueError: bad value at step 3"
STOPPED = -int(signal.SIGTERM)


def record(node: str, *workers: tuple[int, int, str], attempt: int = 0) -> NodeRecord:
    return NodeRecord(node, int(node[1:]), 0, attempt, 0.0,
                      tuple(WorkerFailure(*w) for w in workers))  # fmt: skip


def test_the_same_error_on_every_node_is_a_bug() -> None:
    records = [record("n1", (0, 1, BUG), (1, 1, BUG)), record("n2", (2, 1, BUG), (3, 1, BUG))]
    assert failfast.same_bug(records, 2) == BUG
    # A worker its agent stopped before it failed too does not change that.
    late = [records[0], record("n2", (2, 1, BUG), (3, STOPPED, "exit code -15"))]
    assert failfast.same_bug(late, 2) == BUG


def test_errors_that_differ_only_in_pids_and_ports_are_the_same() -> None:
    a = "RuntimeError: bind failed on 10.0.0.1:29500 (pid 4242)"
    b = "RuntimeError: bind failed on 10.0.0.2:29511 (pid 977)"
    assert failfast.same_bug([record("n1", (0, 1, a)), record("n2", (1, 1, b))], 2) is not None


def test_a_crash_of_one_rank_is_no_bug() -> None:
    crashed = record("n2", (2, 3, "exit code 3"), (3, STOPPED, "exit code -15"))
    assert failfast.same_bug([crashed], 2) is None  # n1 was restarted, not failed
    stopped = record("n1", (0, STOPPED, "exit code -15"), (1, STOPPED, "exit code -15"))
    assert failfast.same_bug([stopped, crashed], 2) is None


def test_other_errors_symptoms_and_timeouts_are_no_bug() -> None:
    other = record("n2", (2, 1, "KeyError: 'lr'"), (3, 1, "KeyError: 'lr'"))
    assert failfast.same_bug([record("n1", (0, 1, BUG)), other], 2) is None
    peer = record("n2", (2, 1, "RuntimeError: Connection reset by peer"))
    assert failfast.same_bug([record("n1", (0, 1, BUG)), peer], 2) is None
    waited = (
        "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
        "1800000ms for recv operation to complete"
    )
    assert failfast.own_error([WorkerFailure(0, 1, waited)]) is None
    assert failfast.own_error([WorkerFailure(0, -11, "killed by SIGSEGV")]) is None
    assert failfast.own_error([]) is None


def test_every_node_must_have_written_its_record(tmp_path: Path) -> None:
    mine = record("n1", (0, 1, BUG), (1, 1, BUG))
    failures.write(tmp_path, mine)
    assert failfast.everywhere(tmp_path, 0, 0, mine, 2, wait_s=0.3) is None  # n2: none
    failures.write(tmp_path, record("n2", (2, 1, BUG), (3, 1, BUG), attempt=1))
    assert failfast.everywhere(tmp_path, 0, 0, mine, 2, wait_s=0.3) is None  # another attempt
    failures.write(tmp_path, record("n2", (2, 1, BUG), (3, 1, BUG)))
    assert failfast.everywhere(tmp_path, 0, 0, mine, 2) == BUG
    # This node's own workers did not all fail with one error: nothing is read.
    mixed = record("n1", (0, 1, BUG), (1, STOPPED, "exit code -15"))
    assert failfast.everywhere(tmp_path, 0, 0, mixed, 2) is None
