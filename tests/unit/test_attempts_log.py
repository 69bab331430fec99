"""A node's hang watch logs each attempt's begin, first step, progress samples and end
into the job folder (hpclaunch.jobdir.attempts), and writes where each rank resumed into
its progress note (hpclaunch.jobdir.progress_notes), from the workers' real progress
files; and the job record merges them into attempts (hpclaunch.record.attempts)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpclaunch import progress
from hpclaunch.jobdir.attempts import FIRST, STEP
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.node.hangs import HangTimeout, Watch
from hpclaunch.record import attempts
from hpclaunch.record.job_record import read_run


def test_the_watch_logs_begin_first_step_and_end_of_each_attempt(tmp_path: Path) -> None:
    job = JobFolder(tmp_path / "job")
    watch = Watch(tmp_path / "local", job, node="n1", node_rank=0, requeue=2, timeout=HangTimeout())
    before = time.time()
    watch.begin(0, {0: 0, 1: 1})
    boards = [progress._Board(str(watch.folder(0) / f"local-{r}.progress")) for r in (0, 1)]
    for board in boards:
        board.beat(step=None)
    assert watch.note()
    assert watch.note()  # the first step is logged once
    boards[0].beat(step=None)
    watch.ended()
    watch.begin(1, {0: 0, 1: 1})
    found = read_run(job.root, 2).events
    assert [(e.attempt, e.event) for e in found] == [
        (0, "begin"),
        (0, "first"),
        (0, "step"),  # a sample with each note whose step changed: not with the second
        (0, "end"),
        (1, "begin"),
    ]
    begin, first, sample, end, _ = found
    assert round(before, 3) <= begin.time <= first.time <= end.time <= time.time() + 0.01
    assert (first.step, sample.step, end.step) == (1, 1, 1)  # the lowest: rank 1 did one
    assert first.time <= sample.time <= end.time
    assert end.step_time is not None and first.time <= end.step_time <= end.time + 0.01
    merged = attempts.of_run(read_run(job.root, 2), first_of_job=False)
    assert [a.attempt for a in merged] == [0, 1] and merged[1].first is None
    assert merged[0].samples[0] == (first.time, 1) and not merged[0].job_count


def test_each_note_says_where_the_ranks_resumed_and_when_the_node_passed_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr(progress, "_monotonic", lambda: clock[0])
    job = JobFolder(tmp_path / "job")
    watch = Watch(
        tmp_path / "local",
        job,
        node="n1",
        node_rank=0,
        requeue=1,
        timeout=HangTimeout(),
        clock=lambda: clock[0],
    )
    watch.begin(0, {0: 4, 1: 5})
    boards = [progress._Board(str(watch.folder(0) / f"local-{r}.progress")) for r in (0, 1)]
    boards[0].resume(40, progress.BY_CHECKPOINT)  # rank 4 loaded a checkpoint; rank 5 did not
    boards[0].beat(None)  # rank 4: step 41 at 100
    clock[0] = 101.0
    boards[1].beat(None)  # rank 5: step 1 at 101 (its count is not the job's)
    clock[0] = 104.0
    boards[0].beat(None)  # rank 4: step 42
    clock[0] = 110.0
    noted = time.time()
    assert watch.note()
    [note] = read_run(job.root, 1).notes
    assert [(r.rank, r.step, r.resumed, r.resumed_by) for r in note.ranks] == [
        (4, 42, 40, "checkpoint"),
        (5, 1, None, None),
    ]
    assert watch.note()  # the same step: no new sample
    clock[0] = 112.0
    boards[1].beat(None)  # rank 5: step 2 at 112
    clock[0] = 115.0
    assert watch.note()
    events = read_run(job.root, 1).events
    [first] = [e for e in events if e.event == FIRST]  # where the ranks that saw it resumed
    assert (first.step, first.resumed, first.resumed_by) == (1, 40, "checkpoint")
    samples = [e for e in events if e.event == STEP]
    assert [(e.node, e.attempt, e.step) for e in samples] == [("n1", 0, 1), ("n1", 0, 2)]
    # When the node's lowest step was done: rank 5's steps, 9 s and 3 s before the notes.
    assert samples[0].time == pytest.approx(noted - 9.0, abs=0.5)
    assert samples[1].time == pytest.approx(noted - 3.0, abs=0.5)


def test_ranks_that_disagree_on_where_they_resumed_say_nothing_of_it(tmp_path: Path) -> None:
    job = JobFolder(tmp_path / "job")
    watch = Watch(tmp_path / "local", job, node="n1", node_rank=0, requeue=0, timeout=HangTimeout())
    watch.begin(3, {0: 0, 1: 1})
    boards = [progress._Board(str(watch.folder(3) / f"local-{r}.progress")) for r in (0, 1)]
    boards[0].resume(40, progress.BY_CHECKPOINT)
    boards[1].resume(35, progress.BY_OPTIMIZER)
    for board in boards:
        board.beat(None)
    assert watch.note()
    [first] = [e for e in read_run(job.root, 0).events if e.event == FIRST]
    assert (first.attempt, first.resumed, first.resumed_by) == (3, None, None)


def test_an_attempt_whose_nodes_noted_no_end_ends_at_its_newest_note() -> None:
    """A lost node's last note (step 3) is older than the survivor's (step 10, written at
    the stop signal): the survivor's says what the ranks, stepping together, had done."""
    from hpclaunch.jobdir.progress_notes import NodeProgress, RankProgress
    from hpclaunch.record.job_record import RunRecord

    notes = (
        NodeProgress("n1", 0, 116.0, (RankProgress(0, 10, 4.0, 0.3, 0.1, True),)),
        NodeProgress("n2", 0, 110.0, (RankProgress(2, 3, 4.0, 0.3, 0.2, True),)),
    )
    first = attempts.of_run(RunRecord(0, notes), first_of_job=True)[0]
    assert (first.last_step, first.last, first.ended) == (10, 115.9, None)


def test_a_stop_signal_logs_the_count_then_as_the_attempt_s_last(tmp_path: Path) -> None:
    """SLURM may kill the agent after its stop signal, before it logs the end: the count
    when the signal came is logged first, and it is the attempt's last known step."""
    job = JobFolder(tmp_path / "job")
    watch = Watch(tmp_path / "local", job, node="n1", node_rank=0, requeue=0, timeout=HangTimeout())
    watch.begin(0, {0: 0})
    board = progress._Board(str(watch.folder(0) / "local-0.progress"))
    for _ in range(7):
        board.beat(step=None)
    watch.stopping()  # the agent is killed here: no end
    run = read_run(job.root, 0)
    assert [e.event for e in run.events][-1] == "stop"
    [merged] = attempts.of_run(run, first_of_job=True)
    assert merged.last_step == 7 and merged.end_known and merged.ended is None
    watch.ended()  # it lived: the end follows
    assert [e.event for e in read_run(job.root, 0).events][-2:] == ["stop", "end"]
