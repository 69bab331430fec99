"""A node's hang watch logs each attempt's begin, first step and end into the job
folder (hpclaunch.jobdir.attempts), from the workers' real progress files, and the
job record merges them into attempts (hpclaunch.record.attempts)."""

from __future__ import annotations

import time
from pathlib import Path

from hpclaunch import progress
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
        (0, "end"),
        (1, "begin"),
    ]
    begin, first, end, _ = found
    assert before <= begin.time <= first.time <= end.time <= time.time() + 0.01
    assert (first.step, end.step) == (1, 1)  # the lowest rank's: rank 1 did one step
    assert end.step_time is not None and first.time <= end.step_time <= end.time + 0.01
    merged = attempts.of_run(read_run(job.root, 2), first_of_job=False)
    assert [a.attempt for a in merged] == [0, 1] and merged[1].first is None
    assert merged[0].samples[0] == (first.time, 1) and not merged[0].job_count
