"""Failure records and their classification: plain values and files in tmp_path."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hpclaunch.jobdir import failures
from hpclaunch.jobdir.failures import Finding, NodeRecord, Verdict, WorkerFailure, classify
from hpclaunch.jobdir.history import Action, Reason
from hpclaunch.jobdir.joblogs import Failure
from hpclaunch.recovery.policy import Decision, Situation, decide

PEER = "RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.2]:3344."
BAD = "rank 2: node n2 is bad"
BUG = "ValueError: bad value at step 3"


def rec(node: str, attempt: int, *workers: tuple[int, int, str]) -> NodeRecord:
    return NodeRecord(node, int(node[1:]) - 1, 0, attempt, float(attempt),
                      tuple(WorkerFailure(*w) for w in workers))  # fmt: skip


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([], Finding(Verdict.UNKNOWN)),
        # one node's own errors, symptoms elsewhere: that node is bad
        ([rec("n1", 0, (0, 1, PEER), (1, -15, PEER)), rec("n2", 0, (2, 4, BAD), (3, 4, BAD)),
          rec("n1", 1, (0, 1, PEER)), rec("n2", 1, (2, 4, BAD))],
         Finding(Verdict.BAD_NODES, ("n2",), BAD)),
        # the same error on every node: a bug
        ([rec("n1", 0, (0, 1, BUG)), rec("n2", 0, (2, 1, BUG))], Finding(Verdict.BUG, (), BUG)),
        # a node with errors and one with no record at all (stopped for the new round)
        ([rec("n2", 0, (2, 4, BAD)), rec("n2", 1, (2, 4, BAD))],
         Finding(Verdict.BAD_NODES, ("n2",), BAD)),
        # only symptoms: nothing to go on
        ([rec("n1", 0, (0, 1, PEER)), rec("n2", 0, (2, -int(signal.SIGTERM), "x"))],
         Finding(Verdict.UNKNOWN)),
    ],
)  # fmt: skip
def test_classify(records: list[NodeRecord], expected: Finding) -> None:
    assert classify(records, ["n1", "n2"]) == expected


def test_records_round_trip_and_messages(tmp_path: Path) -> None:
    err = tmp_path / "rank-2.err"
    err.write_text("warning: numpy\n[rank2]: Traceback (most recent call last):\n"
                   "[rank2]:   File 'x.py'\n[rank2]: ValueError: bad\n")  # fmt: skip
    quiet = Failure(3, 1, -9, 11, 0.0)
    record = failures.record_of("n2", 1, 0, 2, [Failure(2, 0, 1, 10, 0.0, "", str(err)), quiet])
    assert [(w.rank, w.message) for w in record.workers] == [
        (2, "ValueError: bad"),
        (3, "killed by SIGKILL (exit code -9)"),
    ]
    path = failures.write(tmp_path, record)
    assert path == tmp_path / "failures" / "requeue-0" / "attempt-2" / "node-n2.json"
    (path.parent / "node-n9.json").write_text("{broken")  # skipped, not fatal
    assert failures.read(tmp_path, 0) == [record]
    assert failures.read(tmp_path, 1) == []


def test_decide_with_findings() -> None:
    bad = Finding(Verdict.BAD_NODES, ("n2",), BAD)
    assert decide(Situation(1, None, 0, None, 3, bad)) == Decision(
        Action.REQUEUE, Reason.BAD_NODES, 0, ("n2",)
    )
    spent = Situation(1, None, 0, None, 3, bad, failure_requeues=2, max_failure_requeues=2)
    assert decide(spent) == Decision(Action.GIVE_UP, Reason.BAD_NODES, 4, ("n2",))
    assert decide(Situation(1, None, 3, None, 3, bad)).action is Action.GIVE_UP
    bug = Finding(Verdict.BUG, (), BUG)
    assert decide(Situation(143, None, 0, None, 3, bug)) == Decision(Action.NONE, Reason.BUG, 143)
    unknown = Situation(1, None, 0, None, 3, Finding(Verdict.UNKNOWN))
    assert decide(unknown) == Decision(Action.NONE, Reason.FAILED, 1)


def test_an_error_that_follows_its_rank_is_a_bug() -> None:
    bad = Finding(Verdict.BAD_NODES, ("n3",), BUG)
    again = Situation(1, None, 1, None, 3, bad, failure_requeues=1, earlier_errors=(BUG,))
    assert decide(again) == Decision(Action.NONE, Reason.BUG, 1)
