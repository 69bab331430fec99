"""Failure records and their classification: plain values and files in tmp_path."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hpclaunch.jobdir import failures
from hpclaunch.jobdir.failures import Finding, NodeRecord, Verdict, WorkerFailure, classify
from hpclaunch.jobdir.history import Action, Reason
from hpclaunch.jobdir.joblogs import Failure
from hpclaunch.record.job_record import read_run
from hpclaunch.recovery.policy import Decision, Situation, decide

PEER = "RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.2]:3344."
BAD = "rank 2: node n2 is bad"
BUG = "ValueError: bad value at step 3"


def rec(node: str, attempt: int, *workers: tuple[int, int, str]) -> NodeRecord:
    return NodeRecord(
        node,
        int(node[1:]) - 1,
        0,
        attempt,
        float(attempt),
        tuple(WorkerFailure(*w) for w in workers),
    )


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([], Finding(Verdict.UNKNOWN)),
        # one node's own errors, symptoms elsewhere: that node is bad
        (
            [
                rec("n1", 0, (0, 1, PEER), (1, -15, PEER)),
                rec("n2", 0, (2, 4, BAD), (3, 4, BAD)),
                rec("n1", 1, (0, 1, PEER)),
                rec("n2", 1, (2, 4, BAD)),
            ],
            Finding(Verdict.BAD_NODES, ("n2",), BAD),
        ),
        # the same error on every node: a bug
        ([rec("n1", 0, (0, 1, BUG)), rec("n2", 0, (2, 1, BUG))], Finding(Verdict.BUG, (), BUG)),
        # a node with errors and one with no record at all (stopped for the new round)
        (
            [rec("n2", 0, (2, 4, BAD)), rec("n2", 1, (2, 4, BAD))],
            Finding(Verdict.BAD_NODES, ("n2",), BAD),
        ),
        # only symptoms: nothing to go on
        (
            [rec("n1", 0, (0, 1, PEER)), rec("n2", 0, (2, -int(signal.SIGTERM), "x"))],
            Finding(Verdict.UNKNOWN),
        ),
    ],
)
def test_classify(records: list[NodeRecord], expected: Finding) -> None:
    assert classify(records, ["n1", "n2"]) == expected


def test_records_round_trip_and_messages(tmp_path: Path) -> None:
    err = tmp_path / "rank-2.err"
    err.write_text(
        "warning: numpy\n[rank2]: Traceback (most recent call last):\n"
        "[rank2]:   File 'x.py'\n[rank2]: ValueError: bad\n"
    )
    quiet = Failure(3, 1, -9, 11, 0.0)
    record = failures.record_of("n2", 1, 0, 2, [Failure(2, 0, 1, 10, 0.0, "", str(err)), quiet])
    assert [(w.rank, w.message) for w in record.workers] == [
        (2, "ValueError: bad"),
        (3, "killed by SIGKILL (exit code -9)"),
    ]
    path = failures.write(tmp_path, record)
    assert path == tmp_path / "failures" / "requeue-0" / "attempt-2" / "node-n2.json"
    (path.parent / "node-n9.json").write_text("{broken")  # skipped, not fatal
    assert read_run(tmp_path, 0).failures == (record,)
    assert read_run(tmp_path, 1).failures == ()


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


# How a rank's stderr ends when NCCL's watchdog aborts it (torch 2.x, ProcessGroupNCCL):
# the timeout, then C++'s terminate and the frames of the watchdog thread.
NCCL_ABORT = """\
[rank{rank}]:[E1124 17:25:49.509000 {pid} ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog \
caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1024, \
NumelOut=1024, Timeout(ms)=600000) ran for {ran} milliseconds before timing out.
[rank{rank}]:[E1124 17:25:49.510000 {pid} ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID \
0(default_pg) Rank {rank}] Exception (either an error before or timeout detected): \
[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, \
OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) \
ran for {ran} milliseconds before timing out.
[rank{rank}]:[E1124 17:25:49.511000 {pid} ProcessGroupNCCL.cpp:630] [Rank {rank}] Some NCCL \
operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, \
subsequent GPU operations might run on corrupted/incomplete data.
terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG ID 0 PG GUID 0(default_pg) Rank {rank}] Process group watchdog thread \
terminated with exception: [Rank {rank}] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) \
ran for {ran} milliseconds before timing out.
Exception raised from checkTimeout at \
/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:618 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f3a9c001e40 in \
/opt/venv/lib/python3.11/site-packages/torch/lib/libc10.so)
frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration\
<long, std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f3a4c2a1b52 in \
/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so)
frame #2: <unknown function> + 0xdc253 (0x7f3ab5a4d253 in /lib/x86_64-linux-gnu/libstdc++.so.6)
frame #3: <unknown function> + 0x94ac3 (0x7f3ab7e94ac3 in /lib/x86_64-linux-gnu/libc.so.6)
"""


def test_an_nccl_watchdog_abort_is_a_timeout_not_an_error_of_its_own(tmp_path: Path) -> None:
    """Every rank's stderr ends in C++ frames; the line that says what happened is the
    watchdog's timeout, above them: the records then say a hang, not a bug."""
    records = []
    for node, rank, seq, ran, pid in (("n1", 0, 41, 600005, 3301), ("n2", 1, 42, 600017, 9120)):
        err = tmp_path / f"rank-{rank}.err"
        err.write_text("warning: numpy\n" + NCCL_ABORT.format(rank=rank, seq=seq, ran=ran, pid=pid))
        failure = Failure(rank, 0, -int(signal.SIGABRT), pid, 0.0, "", str(err))
        records.append(failures.record_of(node, rank, 0, 0, [failure]))
    (w0,), (w1,) = (r.workers for r in records)
    assert w0.message == (
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=41, "
        "OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600005 "
        "milliseconds before timing out."
    )
    assert w0.waited and w1.waited and not records[0].own_errors
    assert classify(records, ["n1", "n2"]) == Finding(Verdict.HANG, (), w0.message)
    # an error of the rank's own stays its own, and a log with no timeout changes nothing
    err = tmp_path / "own.err"
    err.write_text("[rank0]: Traceback (most recent call last):\n[rank0]: ValueError: bad\n")
    own = failures.message_of(Failure(0, 0, 1, 1, 0.0, "", str(err)))
    assert own == "ValueError: bad"


EARLY = failures.early_exit(12)


def test_an_early_clean_exit_is_named_not_its_peers() -> None:
    # Rank 3 exited 0 at step 12; ranks 0-2 then failed on the closed connection.
    records = [
        rec("n1", 0, (0, 1, PEER), (1, 1, PEER)),
        rec("n2", 0, (2, 1, PEER), (3, 0, EARLY)),
    ]
    found = classify(records, ["n1", "n2"])
    assert found == Finding(
        Verdict.EARLY_EXIT, message="rank 3 exited 0 at step 12 while the others trained on"
    )
    assert failures.culprit(records, found) == "n2"
    # Not a bad node to requeue without: the job ends, saying so.
    assert decide(Situation(1, None, 0, None, 3, found)) == Decision(
        Action.NONE, Reason.EARLY_EXIT, 1
    )


def test_an_error_of_a_rank_own_outweighs_an_early_exit() -> None:
    records = [rec("n1", 0, (0, 4, BAD)), rec("n2", 0, (2, 1, PEER), (3, 0, EARLY))]
    assert classify(records, ["n1", "n2"]) == Finding(Verdict.BAD_NODES, ("n1",), BAD)


def test_a_rank_that_exited_early_is_recorded_with_exit_code_0() -> None:
    peer = Failure(2, 0, 1, 10, 0.0)
    record = failures.record_of("n2", 1, 0, 0, [peer], messages={3: failures.early_exit(None)})
    assert [(w.rank, w.exitcode, w.early) for w in record.workers] == [
        (2, 1, False),
        (3, 0, True),
    ]
    assert record.workers[1].message == "exited 0 while the others trained on"


def test_ranks_that_exit_0_are_early_only_once_another_rank_of_the_node_failed() -> None:
    # The end of a training: ranks finish milliseconds apart, or rank 0 saves alone
    # after the others exited 0. None is early while no rank failed.
    assert failures.exited_early({1: 0}) == ()
    assert failures.exited_early({1: 0, 2: 0, 3: 0}) == ()
    assert failures.exited_early({}) == ()
    # Rank 2 then failed (its peers left): the ranks that had exited 0 are named.
    assert failures.exited_early({1: 0, 2: 1, 3: 0}) == (1, 3)
    assert failures.exited_early({2: -9}) == ()


def test_a_hung_rank_outweighs_the_clean_exits_of_its_peers() -> None:
    # Rank 0 hung in a save of its own after ranks 1-3 exited 0 rightly: the verdict is
    # the hang, not an early exit of rank 1.
    hung = f"{failures.HUNG} in a save at step 120; its stack is in hangs/"
    records = [rec("n1", 0, (0, -9, hung), (1, 0, EARLY)), rec("n2", 0, (2, 0, EARLY))]
    found = classify(records, ["n1", "n2"])
    assert found.verdict is Verdict.HANG and found.message == hung
