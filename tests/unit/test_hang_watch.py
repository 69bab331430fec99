"""The hang watch's pure parts: the timeout, the judgement of one node's workers, the
evidence against a rank, the verdict of the failure records, and what status says."""

from __future__ import annotations

import os
import struct
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hpclaunch import progress
from hpclaunch.contract.values import (
    LOAD_MULTIPLE,
    PAUSE_S,
    STRETCH_FLOOR_S,
    STRETCH_MULTIPLE,
    UNSEEN_SAVE_S,
    TimeoutField,
)
from hpclaunch.errors import SpecError
from hpclaunch.jobdir import attempts, hangs, saves
from hpclaunch.jobdir.failures import (
    HUNG,
    NOT_BLAMED,
    WAITED_FOR_HANG,
    NodeRecord,
    Verdict,
    WorkerFailure,
    classify,
)
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.node.hangs import (
    FLOOR_S,
    MULTIPLE,
    STRETCH_WORDS,
    Bounds,
    HangTimeout,
    Learned,
    Seen,
    Watch,
    evidence,
    first_step_bound,
    judge,
    learn,
    stretch_bound,
)
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


# The stretches between steps (hpclaunch.node.hangs.Bounds): saves, loads, pauses, and
# an attempt's first step.
SAVE, LOAD, PAUSE = progress.SAVE, progress.LOAD, progress.PAUSE


def in_stretch(rank: int, kind: progress.Stretch | None, since: float, *, count: int = 5) -> Seen:
    """A worker in the stretch ``kind`` since ``since`` (out of one: the end of its last)."""
    done = Progress(count, count, 1.0 if count else 0.0, 50.0 if count else 0.0, 0.2, True)
    within = frozenset() if kind is None else frozenset({kind})
    read = replace(done, stretch=kind, within=within, since=since)
    return Seen(rank, rank, 100 + rank, "S", read, 0.0)


def test_each_stretch_has_its_bound_learned_given_or_off() -> None:
    auto, learned = Bounds(), Learned(slowest_save_s=40.0)
    assert stretch_bound(SAVE, auto, Learned()) == UNSEEN_SAVE_S  # no save seen yet
    assert stretch_bound(SAVE, auto, learned) == STRETCH_MULTIPLE * 40.0
    assert stretch_bound(LOAD, auto, Learned(slowest_save_s=2.0)) == STRETCH_FLOOR_S
    # Every rank may read the file one rank wrote: a load gets more than a save.
    assert stretch_bound(LOAD, auto, learned) == LOAD_MULTIPLE * 40.0 > STRETCH_MULTIPLE * 40.0
    assert stretch_bound(PAUSE, auto, learned) == PAUSE_S
    given = Bounds(HangTimeout(30.0), HangTimeout(off=True), HangTimeout(20.0))
    assert stretch_bound(SAVE, given, learned) == stretch_bound(LOAD, given, learned) == 30.0
    assert stretch_bound(PAUSE, given, learned) is None


def test_the_first_step_is_watched_once_the_node_has_stepped_unless_told() -> None:
    auto = Bounds()
    assert first_step_bound(auto, Learned()) is None  # never stepped: any start is fine
    # The attempt may resume through the script's own load: never less than a load's bound
    # (before any save is recorded, the unseen save's).
    assert first_step_bound(auto, Learned(first_step_s=0.0)) == UNSEEN_SAVE_S
    assert first_step_bound(auto, Learned(first_step_s=45.0)) == UNSEEN_SAVE_S
    assert first_step_bound(auto, Learned(1.0, first_step_s=0.0)) == STRETCH_FLOOR_S
    assert first_step_bound(auto, Learned(1.0, first_step_s=45.0)) == STRETCH_MULTIPLE * 45.0
    assert first_step_bound(auto, Learned(40.0, first_step_s=45.0)) == LOAD_MULTIPLE * 40.0
    # Loads unbounded: so is the first step that may load.
    unbounded = Bounds(checkpoint=HangTimeout(off=True))
    assert first_step_bound(unbounded, Learned(1.0, first_step_s=45.0)) is None
    assert first_step_bound(Bounds(first_step=HangTimeout(15.0)), Learned()) == 15.0
    assert (
        first_step_bound(Bounds(first_step=HangTimeout(off=True)), Learned(first_step_s=9.0))
        is None
    )


def test_a_rank_past_its_stretchs_bound_is_a_hang_named_by_the_stretch() -> None:
    bounds = Bounds(checkpoint=HangTimeout(30.0))
    workers = [in_stretch(0, SAVE, 70.5), in_stretch(1, SAVE, 69.0)]
    assert judge(workers, now=98.5, timeout=HangTimeout(5.0), bounds=bounds) is None
    hang = judge(workers, now=100.0, timeout=HangTimeout(5.0), bounds=bounds)
    assert hang is not None and hang.reason == "rank 1 in checkpoint save for 31 s (bound 30 s)"
    assert hang.stretch == "in checkpoint save for 31 s (bound 30 s)" and hang.limit_s == 30.0
    hang = judge(workers, now=101.0, timeout=HangTimeout(5.0), bounds=bounds)
    assert hang is not None and hang.reason.startswith("ranks 0, 1 in checkpoint save for 32 s")
    loading = [in_stretch(0, LOAD, 0.0, count=0), in_stretch(1, None, 0.0, count=0)]
    hang = judge(loading, now=1801.0, timeout=HangTimeout())
    assert hang is not None and hang.reason == (
        "rank 0 in checkpoint load for 1801 s (bound 1800 s: no save of this job was recorded "
        "yet; give --checkpoint-timeout if its saves take longer)"
    )
    pausing = [in_stretch(0, PAUSE, 0.0)]
    assert judge(pausing, now=3599.0, timeout=HangTimeout(5.0)) is None
    hang = judge(pausing, now=3601.0, timeout=HangTimeout(5.0))
    assert hang is not None and "in a pause (hpclaunch.progress.paused) for 3601 s" in hang.reason
    off = Bounds(pause=HangTimeout(off=True))
    assert judge(pausing, now=99999.0, timeout=HangTimeout(5.0), bounds=off) is None


def test_a_stretch_within_its_bound_is_no_hang_and_the_time_since_it_ended_counts() -> None:
    """A save between two steps is judged by its own bound; after it, the time without a
    step counts from its end, not from the step before it."""
    saving = [in_stretch(0, SAVE, 60.0), in_stretch(1, None, 0.0)]  # last step at 50
    assert judge(saving, now=100.0, timeout=HangTimeout(10.0)) is None
    saved = [in_stretch(0, None, 95.0), in_stretch(1, None, 0.0)]  # the save ended at 95
    assert judge(saved, now=100.0, timeout=HangTimeout(10.0)) is None
    hang = judge(saved, now=106.0, timeout=HangTimeout(10.0))
    assert hang is not None and hang.reason == "no progress for 11 s (limit 10 s)"
    assert hang.stretch is None


def test_a_stopped_worker_is_a_hang_in_a_stretch_too() -> None:
    workers = [in_stretch(0, SAVE, 90.0), replace(in_stretch(1, SAVE, 90.0), stopped_s=12.0)]
    hang = judge(workers, now=100.0, timeout=HangTimeout(10.0))
    assert hang is not None and hang.reason == "rank 1 stopped (SIGSTOP) for 12 s"


def test_an_attempt_with_no_first_step_is_a_hang_past_the_first_step_bound() -> None:
    starting = [in_stretch(0, None, 0.0, count=0), in_stretch(1, None, 0.0, count=0)]
    # An earlier attempt stepped 2 s after its start; saves take 1 s.
    stepped = Learned(slowest_save_s=1.0, first_step_s=2.0)
    bounds = Bounds()
    assert judge(starting, 10_000.0, HangTimeout(), bounds=bounds, began=100.0) is None
    assert judge(starting, 399.0, HangTimeout(), learned=stepped, began=100.0) is None
    hang = judge(starting, 401.0, HangTimeout(), learned=stepped, began=100.0)
    assert hang is not None and hang.reason == "no first step for 301 s (bound 300 s)"
    assert hang.stretch == "with no first step for 301 s (bound 300 s)"
    # Not before the attempt is known to have begun, nor while a rank is in a stretch
    # (its own bound holds), and counted from that stretch's end.
    assert judge(starting, 401.0, HangTimeout(), learned=stepped) is None
    loading = [in_stretch(0, LOAD, 150.0, count=0), in_stretch(1, None, 0.0, count=0)]
    assert judge(loading, 401.0, HangTimeout(), learned=stepped, began=100.0) is None
    loaded = [in_stretch(0, None, 250.0, count=0), in_stretch(1, None, 0.0, count=0)]
    assert judge(loaded, 549.0, HangTimeout(), learned=stepped, began=100.0) is None
    assert judge(loaded, 551.0, HangTimeout(), learned=stepped, began=100.0) is not None
    # A user's bound watches even the job's very first attempt.
    told = Bounds(first_step=HangTimeout(15.0))
    assert judge(starting, 116.0, HangTimeout(), bounds=told, began=100.0) is not None


def event(
    node: str, attempt: int, kind: str, at: float, node_rank: int | None = 0
) -> attempts.AttemptEvent:
    return attempts.AttemptEvent(node, attempt, kind, at, node_rank=node_rank)


def record_of_save(total_s: float) -> saves.SaveRecord:
    return saves.SaveRecord(9, True, False, total_s, total_s, 1024, 4, 1000.0)


def test_the_bounds_learn_the_jobs_slowest_recent_save_and_longest_start() -> None:
    assert learn([], []) == Learned(None, None)
    runs = [
        (0, event("n1", 0, attempts.BEGIN, 100.0)),
        (0, event("n2", 0, attempts.BEGIN, 101.0, 1)),
        (0, event("n1", 0, attempts.FIRST, 104.0)),
        (0, event("n2", 0, attempts.FIRST, 108.0, 1)),  # n2's start took 7 s
        (0, event("n1", 0, attempts.END, 200.0)),
        (1, event("n1", 0, attempts.BEGIN, 300.0)),
        (1, event("n1", 0, attempts.FIRST, 306.0)),  # another run: timed on its own
        (1, event("n1", 1, attempts.BEGIN, 400.0)),  # begun, never stepped
    ]
    found = learn([record_of_save(3.5), record_of_save(12.25)], runs, node_rank=0)
    assert found == Learned(slowest_save_s=12.25, first_step_s=7.0)
    # A first step whose begin is not in the log: the job stepped, its start untimed.
    assert learn([], [(0, event("n1", 2, attempts.FIRST, 5.0))], 0) == Learned(None, 0.0)
    # Only the recent saves count: a slow first save long ago no longer holds.
    recent = [record_of_save(500.0), *(record_of_save(2.0) for _ in range(5))]
    assert learn(recent, []).slowest_save_s == 2.0


def test_a_first_save_cut_by_the_unseen_bound_doubles_it_for_the_next_attempt() -> None:
    """A job whose first save takes longer than UNSEEN_SAVE_S: each attempt cut in a save
    or load (its nodes' hang reports) doubles the bound, so that a later attempt can
    finish it, instead of cutting it until the restarts run out; a recorded save, or the
    user's bound, ends the guessing."""
    words = "in checkpoint save for 1801 s (bound 1800 s)"
    cut = replace(report("n1", (at_hang(0, False),), (0,)), stretch=words, stretch_kind="save")
    other_node = replace(cut, node="n2", node_rank=1)
    next_attempt = replace(cut, attempt=1)
    first_step = replace(cut, attempt=2, stretch_kind=None)
    found = learn([], [], 0, [cut, other_node])
    assert found.cut_saves == 1
    assert stretch_bound(SAVE, Bounds(), found) == 2 * UNSEEN_SAVE_S
    found = learn([], [], 0, [cut, other_node, next_attempt, first_step])
    assert stretch_bound(LOAD, Bounds(), found) == 4 * UNSEEN_SAVE_S
    assert stretch_bound(SAVE, Bounds(), replace(found, slowest_save_s=40.0)) == 400.0
    assert stretch_bound(SAVE, Bounds(checkpoint=HangTimeout(30.0)), found) == 30.0
    # The hang names the guess and the option; a user's bound is no guess.
    saving = [in_stretch(0, SAVE, 0.0)]
    hang = judge(saving, 2 * UNSEEN_SAVE_S + 1, HangTimeout(), learned=found)
    assert hang is None
    hang = judge(saving, 4 * UNSEEN_SAVE_S + 1, HangTimeout(), learned=found)
    assert (
        hang is not None
        and hang.kind == SAVE
        and hang.stretch
        == (
            "in checkpoint save for 7201 s (bound 7200 s: no save of this job was recorded yet; "
            "give --checkpoint-timeout if its saves take longer)"
        )
    )
    told = Bounds(checkpoint=HangTimeout(30.0))
    hang = judge(saving, 31.0, HangTimeout(), bounds=told, learned=found)
    assert hang is not None and hang.stretch == "in checkpoint save for 31 s (bound 30 s)"


def test_the_first_step_is_armed_only_on_a_node_that_stepped_before() -> None:
    """Node rank 0 steps (``if rank == 0: beat()``), node rank 1 never does: a restarted
    attempt watches the first step on node rank 0 only, whatever the hosts are called
    after a requeue; a log without node ranks (an older hpclaunch) arms nothing."""
    runs = [
        (0, event("n1", 0, attempts.BEGIN, 100.0, 0)),
        (0, event("n2", 0, attempts.BEGIN, 100.0, 1)),
        (0, event("n1", 0, attempts.FIRST, 104.0, 0)),
    ]
    assert learn([], runs, node_rank=0).first_step_s == 4.0
    assert learn([], runs, node_rank=1).first_step_s is None
    assert first_step_bound(Bounds(), learn([], runs, node_rank=1)) is None
    older = [(0, event("n1", 0, attempts.FIRST, 104.0, None))]
    assert learn([], older, node_rank=0).first_step_s is None
    # The log's lines carry the node rank, and a line without one still reads.
    line = '{"node": "n1", "attempt": 0, "event": "first", "time": 5.0}'
    assert attempts.parse([line]) == [attempts.AttemptEvent("n1", 0, attempts.FIRST, 5.0)]


def test_status_names_the_stretch_the_hang_was_in() -> None:
    ranks = (at_hang(0, True), at_hang(1, False))
    words = "in checkpoint save for 31 s (bound 30 s)"
    named = replace(report("n1", ranks, (1,)), stretch=words)
    [first] = hangs.first_hung([named, report("n2", (at_hang(2, True), at_hang(3, True)), ())])
    assert hangs.describe(first).startswith(
        "attempt 0: rank 1 on n1 hung in checkpoint save for 31 s (bound 30 s), after step 12 "
        "(not waiting in a collective at f (t.py:1)); 3 of the 4 ranks read waited"
    )
    nobody = replace(report("n1", (at_hang(0, True),), ()), stretch=words)
    [first] = hangs.first_hung([nobody])
    assert hangs.describe(first).startswith(
        f"attempt 0: the workers hung {words}, no rank named (no rank was seen outside"
    )


def test_the_board_says_the_stretch_and_since_when(tmp_path: Path) -> None:
    path = str(tmp_path / "local-0.progress")
    board = progress._Board(path)
    assert progress.read(path) == Progress(0, -1, 0.0, 0.0, 0.0, False, pid=board.pid)
    assert board.set_stretch(SAVE)
    saving = progress.read(path)
    assert saving is not None and saving.stretch == SAVE and saving.paused and saving.since > 0
    assert saving.within == {SAVE}
    # A load inside the save: the save's stretch goes on, since its start, both kinds open.
    assert board.set_stretch(LOAD)
    both = progress.read(path)
    assert both == replace(saving, within=frozenset({SAVE, LOAD}))
    board.beat(None)  # a step's write keeps the stretch
    stepped = progress.read(path)
    assert stepped is not None and (stepped.count, stepped.stretch) == (1, SAVE)
    assert not board.set_stretch(LOAD)  # in it already: whoever began it ends it
    assert board.set_stretch(None)  # the load ended: the save's stretch goes on
    inner_ended = progress.read(path)
    assert inner_ended is not None and (inner_ended.stretch, inner_ended.within) == (SAVE, {SAVE})
    assert inner_ended.since == saving.since
    assert board.set_stretch(None) and not board.set_stretch(None)
    ended = progress.read(path)
    assert ended is not None and ended.stretch is None and ended.since >= saving.since
    # The layout before the stretch (its magic, its size) is no progress, never misread.
    before = struct.Struct("<4sIqqdddqqqi").pack(b"HPCr", 0, 3, 3, 1.0, 2.0, 0.5, 1, -1, -1, 0)
    (tmp_path / "old.progress").write_bytes(before + bytes(12 + 8 + 16))
    assert progress.read(str(tmp_path / "old.progress")) is None
    # Nor the one before the write count (b"HPCs").
    stretched = struct.Struct("<4sIqqdddqqqiId").pack(
        b"HPCs", 0, 3, 3, 1.0, 2.0, 0.5, 1, -1, -1, 0, 2, 5.0
    )
    (tmp_path / "old.progress").write_bytes(stretched + bytes(16))
    assert progress.read(str(tmp_path / "old.progress")) is None


def board_bytes(tmp_path: Path, *, stretch: str | None = None, steps: int = 0) -> bytes:
    """A whole board's bytes: ``steps`` steps, then ``stretch`` begun."""
    path = str(tmp_path / "whole.progress")
    board = progress._Board(path)
    for _ in range(steps):
        board.beat(None)
    board.set_stretch(stretch)
    return Path(path).read_bytes()


def test_a_board_read_halfway_through_a_write_is_torn_not_a_reading(tmp_path: Path) -> None:
    """The watch reads while the worker writes: the bytes of a half-written board (a write
    begun, not ended; a stretch whose start is not yet written; the head of one write
    with the tail of another) are torn, and a read that only ever sees torn bytes is no
    reading (None), never "in a save since 0" or "no step yet"."""
    whole = board_bytes(tmp_path, stretch=SAVE, steps=3)
    assert not progress.torn(whole)
    read = progress.parse(whole)
    assert read is not None and (read.count, read.stretch) == (3, SAVE) and read.since > 0
    layout = progress._LAYOUT
    fields = list(layout.unpack(whole))
    seq = fields[1]
    assert seq % 2 == 0 and fields[-1] == seq
    # A write under way: both counts odd, the fields half-written (the stretch set, its
    # start still 0, as struct.pack_into leaves it between the two).
    writing = [*fields[:1], seq + 1, *fields[2:13], 0.0, seq + 1]
    assert progress.torn(layout.pack(*writing))
    # The head of the next write, the tail of this one.
    assert progress.torn(layout.pack(*fields[:1], seq + 2, *fields[2:-1], seq))
    # Counts that agree but fields no whole write leaves: a stretch since 0, a count at 0 s.
    assert progress.torn(layout.pack(*fields[:13], 0.0, seq))
    assert progress.torn(layout.pack(*fields[:5], 0.0, *fields[6:]))
    # Its magic written, its first write not yet ended: still zeroes.
    assert progress.torn(layout.pack(b"HPCt", 0, *(0 for _ in fields[2:12]), 0, 0.0, 0))
    path = tmp_path / "local-0.progress"
    path.write_bytes(layout.pack(*writing))
    assert progress.read(str(path)) is None


def test_a_board_rewritten_in_a_loop_is_always_read_whole(tmp_path: Path) -> None:
    """Another process switches stretches and steps in a loop, as fast as it can (a worker
    writes once a step: far less often): every read that gives a reading gives a whole one
    (a stretch with its start, a count with its times); one that caught only half-written
    boards gives None, which the watch takes as no news."""
    import subprocess
    import sys

    path = tmp_path / "local-0.progress"
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from hpclaunch import progress\n"
            "board = progress._Board(sys.argv[1])\n"
            "board.beat(None)\n"
            "print('ready', flush=True)\n"
            "end = time.monotonic() + 3\n"
            "while time.monotonic() < end:\n"
            "    board.set_stretch('save'); board.beat(None); board.set_stretch(None)\n",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    ) as writer:
        try:
            assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
            readings = [progress.read(str(path)) for _ in range(3000)]
        finally:
            writer.kill()
    whole = [r for r in readings if r is not None]
    assert whole, readings[:3]
    assert all(r.count >= 1 and r.last >= r.first > 0 for r in whole)
    assert all(r.stretch is None or r.since > 0 for r in whole)


def test_a_stretch_kind_is_one_the_watch_knows() -> None:
    with pytest.raises(TypeError, match=r"kind=.lunch. is no hpclaunch\.progress\.Stretch; pass"):
        progress.set_paused(True, "lunch")  # type: ignore[arg-type]
    assert set(STRETCH_WORDS) == set(progress.STRETCHES) == set(progress.Stretch)


def test_pausing_without_its_stretch_is_refused_where_it_is_applied() -> None:
    """``@pausing`` alone would make the function a decorator that runs nothing."""

    def save() -> None:
        pass

    with pytest.raises(TypeError, match=r"write @pausing\(hpclaunch.progress.SAVE\)"):
        progress.pausing(save)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"kind=.save. is no hpclaunch\.progress\.Stretch"):
        progress.pausing("save")  # type: ignore[arg-type]
    calls: list[int] = []
    assert progress.pausing(SAVE)(lambda: calls.append(1))() is None and calls == [1]


def test_a_stretch_inside_another_is_bounded_by_the_larger_bound() -> None:
    """A checkpoint save inside the script's pause: the pause's bound (60 s) would cut a
    save of 300 s; the larger of the two holds, named by the outer stretch."""
    bounds = Bounds(checkpoint=HangTimeout(300.0), pause=HangTimeout(60.0))
    pausing = in_stretch(0, PAUSE, 0.0)
    assert pausing.progress is not None
    saving = replace(pausing, progress=replace(pausing.progress, within=frozenset({PAUSE, SAVE})))
    assert judge([saving], now=299.0, timeout=HangTimeout(5.0), bounds=bounds) is None
    hang = judge([saving], now=301.0, timeout=HangTimeout(5.0), bounds=bounds)
    assert hang is not None and hang.reason == (
        "rank 0 in a pause (hpclaunch.progress.paused) for 301 s (bound 300 s)"
    )
    hang = judge([pausing], now=61.0, timeout=HangTimeout(5.0), bounds=bounds)
    assert hang is not None and hang.limit_s == 60.0
    # An unbounded kind open inside: unbounded.
    off = Bounds(checkpoint=HangTimeout(off=True), pause=HangTimeout(60.0))
    assert judge([saving], now=9999.0, timeout=HangTimeout(5.0), bounds=off) is None


@pytest.mark.parametrize("field", list(TimeoutField))
def test_a_bad_stretch_timeout_names_its_option(field: TimeoutField) -> None:
    with pytest.raises(SpecError) as raised:
        HangTimeout.parse("0.1", field)
    assert raised.value.field == field.value and "'0.1'" in raised.value.message
    assert HangTimeout.parse("off", field).off and HangTimeout.parse("12", field).seconds == 12


def test_a_watch_takes_its_bounds_from_the_job_folder(tmp_path: Path) -> None:
    """A node's watch of a requeued run learns from the folder the earlier run wrote: its
    slowest save (40 s: saves get 400 s, loads 800 s) and its longest start on this node
    (45 s: 450 s, but the attempt may load: 800 s), and judges this process as its one
    worker, through the worker's own board."""
    watch, board, me, later = requeued_watch(tmp_path)
    board.set_stretch(LOAD)  # as load_latest does, now: a load's bound holds from its start
    later[0] = 799.0
    assert watch.check(me) is None
    later[0] = 801.0
    hang = watch.check(me)
    assert hang is not None and hang.reason == "rank 0 in checkpoint load for 801 s (bound 800 s)"
    # Another node's start, with no stretch: its first step's bound holds from its start.
    watch, board, me, later = requeued_watch(tmp_path / "other")
    later[0] = 799.0
    assert watch.check(me) is None
    later[0] = 801.0
    hang = watch.check(me)
    assert hang is not None and hang.reason == "no first step for 801 s (bound 800 s)"


def requeued_watch(
    tmp_path: Path, timeout: HangTimeout | None = None
) -> tuple[Watch, progress._Board, dict[int, int], list[float]]:
    """The watch of run 1 on node rank 0, which stepped in run 0 (45 s after its start,
    after a 40 s save), over this process as its one worker; its clock moves by ``later``."""
    job = JobFolder(tmp_path / "job")
    job.root.mkdir(parents=True)
    saves.append(job.saves, record_of_save(40.0))
    attempts.append(job, 0, event("n1", 0, attempts.BEGIN, 100.0))
    attempts.append(job, 0, event("n1", 0, attempts.FIRST, 145.0))
    base, later = time.monotonic(), [0.0]
    watch = Watch(
        tmp_path / "local",
        job,
        node="n1",
        node_rank=0,
        requeue=1,
        timeout=timeout or HangTimeout(),
        clock=lambda: base + later[0],
    )
    watch.begin(0, {0: 0})
    board = progress._Board(watch.worker_env(0, 0)[progress.PROGRESS_FILE])
    return watch, board, {0: os.getpid()}, later


def test_a_read_that_fails_is_no_news_not_a_rank_without_steps(tmp_path: Path) -> None:
    """A one-worker node whose worker has stepped: a read that catches its board
    half-written every time keeps the rank's last reading (the time since its step
    counts), never "no first step" nor a stretch since 0."""
    watch, board, me, later = requeued_watch(tmp_path, HangTimeout(5000.0))
    board.beat(None)
    assert watch.check(me) is None
    path = Path(watch.worker_env(0, 0)[progress.PROGRESS_FILE])
    fields = list(progress._LAYOUT.unpack(path.read_bytes()))
    seq = fields[1] + 1  # a write under way, its stretch set and not yet its start
    path.write_bytes(progress._LAYOUT.pack(*fields[:1], seq, *fields[2:12], 2, 0.0, seq))
    later[0] = 1000.0  # past the first step's bound (800 s), within the hang timeout
    assert watch.check(me) is None
    later[0] = 5001.0
    hang = watch.check(me)
    assert hang is not None and hang.reason.startswith("no progress for 500")
    # The attempt's attempts log names the node's rank.
    logged = attempts.parse(attempts.path(watch._job, 1, "n1").read_text().splitlines())
    assert {e.node_rank for e in logged} == {0}


def test_a_watch_learns_the_cut_saves_from_the_job_folders_hang_reports(tmp_path: Path) -> None:
    """Run 0's attempt was cut in its first save (its report in the job folder, no save
    recorded): run 1's watch gives saves twice the unseen bound."""
    job = JobFolder(tmp_path / "job")
    job.root.mkdir()
    words = "in checkpoint save for 1801 s (bound 1800 s)"
    cut = replace(report("n1", (at_hang(0, False),), (0,)), stretch=words, stretch_kind="save")
    hangs.write_report(job, cut)
    watch = Watch(tmp_path / "local", job, node="n1", node_rank=0, requeue=1, timeout=HangTimeout())
    watch.begin(0, {0: 0})
    assert watch._learned.cut_saves == 1
    assert stretch_bound(SAVE, Bounds(), watch._learned) == 2 * UNSEEN_SAVE_S
