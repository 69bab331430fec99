"""The hang watch's pure parts: the timeout, the judgement of one node's workers, the
evidence against a rank, the verdict of the failure records, and what status says."""

from __future__ import annotations

import pytest

from hpclaunch.errors import SpecError
from hpclaunch.jobdir import hangs
from hpclaunch.jobdir.failures import (
    HUNG,
    NOT_BLAMED,
    WAITED_FOR_HANG,
    NodeRecord,
    Verdict,
    WorkerFailure,
    classify,
)
from hpclaunch.node.hangs import FLOOR_S, MULTIPLE, HangTimeout, Seen, evidence, judge
from hpclaunch.progress import Progress


def test_the_timeout_is_auto_off_or_seconds() -> None:
    auto = HangTimeout.parse("auto")
    assert auto.limit(0.0) == FLOOR_S and auto.limit(100.0) == MULTIPLE * 100.0
    assert HangTimeout.parse(" 7.5 ").limit(100.0) == 7.5
    assert HangTimeout.parse("OFF").limit(1.0) is None
    assert str(HangTimeout.parse("30")) == "30" and str(auto) == "auto"


def test_a_timeout_is_written_as_the_agent_reads_it() -> None:
    assert str(HangTimeout.parse("99999999999")) == "99999999999"
    assert str(HangTimeout.parse("2.50")) == "2.5"


@pytest.mark.parametrize("bad", ["0", "0.5", "-3", "soon", "inf", "nan", ""])
def test_a_bad_timeout_is_named_with_what_is_taken(bad: str) -> None:
    with pytest.raises(SpecError) as raised:
        HangTimeout.parse(bad)
    assert repr(bad) in raised.value.message and "'auto'" in raised.value.message


def seen(rank: int, last: float | None, *, state: str = "S", stopped_s: float = 0.0) -> Seen:
    done = None if last is None else Progress(5, 5, 0.0, last, 0.2, True)
    return Seen(rank, rank, 100 + rank, state, done, stopped_s)


def test_no_hang_before_the_first_step_or_while_any_rank_progresses() -> None:
    fixed = HangTimeout(10.0)
    assert judge([seen(0, None), seen(1, None)], now=1000.0, timeout=fixed) is None
    assert judge([seen(0, 95.0), seen(1, 85.0)], now=100.0, timeout=fixed) is None
    assert judge([seen(0, 95.0)], now=100.0, timeout=HangTimeout(off=True)) is None


def test_no_progress_for_the_timeout_is_a_hang() -> None:
    hang = judge([seen(0, 80.0), seen(1, 89.0)], now=100.0, timeout=HangTimeout(10.0))
    assert hang is not None and hang.reason == "no progress for 11 s (limit 10 s)"
    assert hang.limit_s == 10.0 and [s.rank for s in hang.seen] == [0, 1]


def test_a_worker_stopped_for_the_timeout_is_a_hang_even_before_any_step() -> None:
    workers = [seen(0, None), seen(1, None, state="T", stopped_s=12.0)]
    hang = judge(workers, now=100.0, timeout=HangTimeout(10.0))
    assert hang is not None and hang.reason == "rank 1 stopped (SIGSTOP) for 12 s"
    workers[1] = seen(1, None, state="T", stopped_s=9.0)
    assert judge(workers, now=100.0, timeout=HangTimeout(10.0)) is None


def test_the_evidence_is_a_stopped_worker_then_one_outside_a_collective() -> None:
    workers = [seen(0, 1.0), seen(1, 1.0, state="T")]
    assert evidence(workers, {0: True, 1: None}) == (
        (1,),
        "stopped by a signal (SIGSTOP)",
    )
    workers = [seen(0, 1.0), seen(1, 1.0)]
    assert evidence(workers, {0: True, 1: False}) == ((1,), "not waiting in a collective")
    assert evidence(workers, {0: True, 1: True})[0] == ()
    assert evidence(workers, {0: True, 1: None})[0] == ()  # no stack: no evidence


def record(node: str, rank: int, message: str, attempt: int = 0) -> NodeRecord:
    return NodeRecord(node, rank, 0, attempt, float(rank), (WorkerFailure(rank, -9, message),))


def test_a_node_that_began_two_hangs_is_a_bad_node_and_one_hang_is_not() -> None:
    records = [record("n1", 0, f"{WAITED_FOR_HANG} no progress"), record("n2", 1, f"{HUNG} x")]
    assert classify(records, ["n1", "n2"]).verdict is Verdict.HANG
    records.append(record("n2", 1, f"{HUNG} y", attempt=1))
    finding = classify(records, ["n1", "n2"])
    assert finding.verdict is Verdict.BAD_NODES and finding.nodes == ("n2",)


def test_hangs_begun_on_every_node_or_on_none_are_a_hang_not_a_bug() -> None:
    records = [record("n1", 0, f"{HUNG} a"), record("n2", 1, f"{HUNG} b")]
    records += [record("n1", 0, f"{HUNG} a", 1), record("n2", 1, f"{HUNG} b", 1)]
    assert classify(records, ["n1", "n2"]).verdict is Verdict.HANG
    waited = [record("n1", 0, f"{NOT_BLAMED} no progress"), record("n2", 1, f"{NOT_BLAMED} x")]
    assert classify(waited, ["n1", "n2"]).verdict is Verdict.HANG


def at_hang(rank: int, waiting: bool | None, state: str = "S") -> hangs.RankAtHang:
    return hangs.RankAtHang(rank, rank % 2, 100 + rank, state, 12, 6.0, waiting, "f (t.py:1)")


def report(
    node: str, ranks: tuple[hangs.RankAtHang, ...], culprits: tuple[int, ...]
) -> hangs.HangReport:
    stacks = f"/j/hangs/requeue-0/attempt-0-node-{node}.txt"
    how = "not waiting in a collective"
    return hangs.HangReport(
        node, 0, 0, 0, 1.0, "no progress for 6 s", 5.0, ranks, culprits, how, stacks
    )


def test_the_hang_began_where_a_node_named_ranks_and_every_other_rank_waited() -> None:
    reports = [
        report("n1", (at_hang(0, True), at_hang(1, True)), ()),
        report("n2", (at_hang(2, False), at_hang(3, True)), (2,)),
    ]
    assert hangs.began_on(reports) == "n2"
    [first] = hangs.first_hung(reports)
    assert (first.rank, first.node, first.waiting, first.read) == (2, "n2", 3, 4)
    assert hangs.describe(first) == (
        "attempt 0: rank 2 on n2 hung after step 12, no progress for 6 s (not waiting in a "
        "collective at f (t.py:1)); 3 of the 4 ranks read waited in a collective; stacks: "
        "/j/hangs/requeue-0/attempt-0-node-*.txt"
    )
    assert hangs.began_on(reports[1:]) is None  # no other node's word: no blame


def test_a_stopped_worker_names_its_node_whatever_the_stacks_say() -> None:
    reports = [
        report("n1", (at_hang(0, None, "T"), at_hang(1, False)), (0,)),
        report("n2", (at_hang(2, False), at_hang(3, None)), (2,)),
    ]
    assert hangs.began_on(reports) == "n1"


def test_ranks_named_on_two_nodes_name_no_rank() -> None:
    """Each node saw ranks outside a collective (a rank waiting in work.wait() looks so):
    nobody can tell which began it, and no node is blamed."""
    reports = [
        report("n1", (at_hang(0, False), at_hang(1, True)), (0,)),
        report("n2", (at_hang(2, False), at_hang(3, True)), (2,)),
    ]
    assert hangs.began_on(reports) is None
    [first] = hangs.first_hung(reports)
    assert first.rank is None and "ranks 0,2 were not waiting" in hangs.describe(first)


EXITING = """\
Thread 0x00007f01 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/library.py", line 665 in _del_library
  File "/usr/lib/python3.11/weakref.py", line 590 in __call__
  File "/usr/lib/python3.11/weakref.py", line 666 in _exitfunc
"""


def test_a_rank_on_its_way_out_is_no_evidence_against_it() -> None:
    """Its peers gone, a rank runs the interpreter's exit: not in its script, and not in a
    collective either; taking that for a rank stuck outside one would blame it."""
    from hpclaunch.node import stacks

    threads = stacks.parse(EXITING)
    assert stacks.waiting(threads) is False and not stacks.in_script(threads)
    running = stacks.parse(EXITING.replace("_exitfunc", "<module>"))
    assert stacks.in_script(running)
