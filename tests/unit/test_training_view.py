"""The training's view in status and --follow (hpclaunch.ops.training, follow.progress_due)
and the work a run loses (hpclaunch.jobdir.lost_work), from plain notes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpclaunch import progress
from hpclaunch.jobdir import failures, goodput, lost_work, saves
from hpclaunch.jobdir.hangs import NodeProgress, RankProgress, write_progress
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.ops import training
from hpclaunch.ops.follow import PROGRESS_EVERY_S, progress_due


def note(
    node: str,
    step: int,
    rate: float | None,
    *,
    attempt: int = 0,
    idle: float = 0.1,
    total: int | None = None,
    metrics: dict[str, float] | None = None,
    job_steps: bool = True,
) -> NodeProgress:
    ranks = (RankProgress(0, step, rate, 0.3, idle, job_steps),)
    return NodeProgress(node, attempt, 100.0, ranks, total, metrics or {}, 0 if metrics else None)


def test_the_line_has_the_step_out_of_the_total_the_rate_the_eta_and_the_metrics() -> None:
    found = training.of_notes(
        [note("n1", 120, 2.0, total=1000, metrics={"loss": 0.31234})], now=103.0
    )
    assert found is not None and found.eta_s == pytest.approx(440.0)
    assert training.line(found, now=103.0) == (
        "step 120 of 1000 (12 %), 2.00 steps/s, ETA 7 min 20 s; loss 0.3123 "
        "(attempt 0, noted 3 s ago)"
    )
    # No total: no share, no ETA; stopped stepping: no ETA either.
    bare = training.of_notes([note("n1", 5, None)], now=100.0)
    assert (
        bare is not None and training.line(bare, now=100.0) == "step 5 (attempt 0, noted 0 s ago)"
    )
    idle = training.of_notes([note("n1", 120, 2.0, total=1000, idle=40.0)], now=100.0)
    assert idle is not None and idle.eta_s is None
    assert "no step for 40 s" in training.line(idle, now=100.0)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.4, "0 s"),
        (59.6, "1 min 00 s"),
        (258, "4 min 18 s"),
        (7500, "2 h 05 min"),
        (3 * 86400 + 4 * 3600, "3 d 04 h"),
    ],
)
def test_durations_read_as_a_person_says_them(seconds: float, text: str) -> None:
    assert goodput.duration(seconds) == text


def test_follow_prints_progress_when_it_says_something_new_never_a_flood() -> None:
    def look(
        step: int,
        *,
        attempt: int = 0,
        rate: float | None = 2.0,
        idle: float = 0.1,
        total: int | None = 100,
    ) -> training.Training:
        found = training.of_notes(
            [note("n1", step, rate, attempt=attempt, idle=idle, total=total)], now=100.0
        )
        assert found is not None
        return found

    assert progress_due(None, look(1, rate=None), at=0.0)
    assert progress_due((0.0, look(1, rate=None)), look(3), at=2.0)  # the first ETA
    assert not progress_due((2.0, look(3)), look(9), at=2.0 + PROGRESS_EVERY_S - 1)
    assert progress_due((2.0, look(3)), look(9), at=2.0 + PROGRESS_EVERY_S)
    assert not progress_due((2.0, look(9)), look(9), at=100.0)  # no new step
    assert progress_due((2.0, look(9)), look(1, attempt=1), at=3.0)  # a new attempt
    assert progress_due((2.0, look(9)), look(9, idle=31.0), at=3.0)  # it stopped: once
    assert not progress_due((3.0, look(9, idle=31.0)), look(9, idle=90.0), at=200.0)


def test_lost_work_counts_the_steps_past_the_last_checkpoint_committed_before_the_end() -> None:
    known = [
        lost_work.Saved(20, 10.0, "step 19"),
        lost_work.Saved(40, 20.0, "step 39"),
        lost_work.Saved(60, 50.0, "step 59"),
    ]
    loss = lost_work.run_loss([note("n1", 47, 2.0), note("n2", 46, 2.0)], 0, 0.0, 30.0, known)
    assert loss is not None and (loss.steps, loss.repeats) == (47, 7)
    assert loss.text() == (
        "run 0 did 47 steps; its last checkpoint (step 39) holds 40: the next run repeats 7 steps"
    )
    none = lost_work.run_loss([note("n1", 12, 2.0)], 0, 0.0, 5.0, known)
    assert none is not None and none.text() == (
        "run 0 did 12 steps and no checkpoint was written: the next run starts from step 0 "
        "and repeats 12 steps"
    )
    # Counted from 0 after resuming without hpclaunch knowing: not the job's steps, so
    # nothing is said rather than a wrong number. The same for a job that saves its own way.
    assert lost_work.run_loss([note("n1", 5, 2.0, job_steps=False)], 1, 15.0, 30.0, known) is None
    # The same for an in-place restart that counted from 0 with a checkpoint to resume from.
    restarted = [note("n1", 5, 2.0, attempt=1, job_steps=False)]
    assert lost_work.run_loss(restarted, 0, 0.0, 30.0, known) is None
    assert lost_work.run_loss([note("n1", 47, 2.0)], 0, 0.0, 30.0, known, own_way=True) is None
    assert lost_work.run_loss([], 0, 0.0, 30.0, known) is None


def test_the_batch_log_warns_once_when_the_script_never_checkpoints(tmp_path: Path) -> None:
    job = JobFolder(tmp_path)
    write_progress(job, 0, note("n1", 12, 2.0))
    write_progress(job, 1, note("n1", 9, 2.0))
    first = lost_work.batch_lines(job, job.checkpoints, [(0, 0.0, None)])
    assert first[0].startswith("lost work: run 0 did 12 steps and no checkpoint was written")
    assert first[1].startswith("warning: 12 steps done and no checkpoint written: a requeue")
    again = lost_work.batch_lines(job, job.checkpoints, [(0, 0.0, 5.0), (1, 6.0, None)])
    assert again == [
        "lost work: run 1 did 9 steps and no checkpoint was written: the next run starts "
        "from step 0 and repeats 9 steps"
    ]
    # A save's record counts as a checkpoint (step 4 holds 5 steps), pruned or not.
    saves.append(job.saves, saves.SaveRecord(4, False, False, 0.1, 0.2, 10, 1, 1.0))
    assert lost_work.batch_lines(job, job.checkpoints, [(0, 0.0, None)]) == [
        "lost work: run 0 did 12 steps; its last checkpoint (step 4) holds 5: the next run "
        "repeats 7 steps"
    ]


def test_a_restart_says_which_rank_on_which_node_and_why(tmp_path: Path) -> None:
    job = JobFolder(tmp_path)
    for attempt in (0, 1):
        job.attempt(0, "0", attempt).path.mkdir(parents=True)
    echo = failures.WorkerFailure(1, -15, "Signals.SIGTERM")
    own = failures.WorkerFailure(3, 3, "rank 3: crashing at step 12")
    failures.write(tmp_path, failures.NodeRecord("n1", 0, 0, 0, 5.0, (echo,)))
    failures.write(tmp_path, failures.NodeRecord("n2", 1, 0, 0, 6.0, (own,)))
    assert training.restarts(job, 0) == [
        "attempt 1 began after attempt 0 failed: rank 3 on n2: rank 3: crashing at step 12"
    ]


def test_report_takes_a_total_and_numbers_and_refuses_anything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "local-0.progress"
    monkeypatch.setattr(progress, "_board", progress._Board(str(path)))
    monkeypatch.setattr(progress, "_opened", True)
    progress.report(total=50, loss=0.5, metrics={"lr": 0.01})
    read = progress.read(str(path))
    assert read is not None and read.total == 50
    assert progress.read_metrics(str(path)) == {"loss": 0.5, "lr": 0.01}
    written = json.loads(Path(progress.metrics_path(str(path))).read_text())
    assert written == {"loss": 0.5, "lr": 0.01}
    with pytest.raises(TypeError, match=r"metric loss='high' is not a number"):
        progress.report(loss="high")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"total=-1 is not a step count"):
        progress.report(total=-1)


def test_follow_says_the_lost_work_once_the_run_has_left_its_nodes() -> None:
    from hpclaunch.ops.follow import changes
    from hpclaunch.ops.status import JobStatus, RunSummary

    loss = lost_work.RunLoss(0, 61, lost_work.Saved(60, 5.0, "step 59"), 1)
    run0 = RunSummary(0, ["n1", "n2"], 0.0, None, "requeued by SLURM", "SLURM requeues")
    ending = JobStatus(7, state="COMPLETING", requeues=1, runs=[run0], lost_work=[loss])
    assert not [line for line in changes(None, ending) if line.startswith("lost work")]
    pending = JobStatus(7, state="PENDING", requeues=1, runs=[run0], lost_work=[loss])
    said = [line for line in changes(ending, pending) if line.startswith("lost work")]
    assert said == [f"lost work: {loss.text()}"]
    assert not [line for line in changes(pending, pending) if line.startswith("lost work")]


def test_metrics_held_back_by_the_rate_are_written_by_the_next_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr(progress, "_monotonic", lambda: clock[0])
    path = str(tmp_path / "local-0.progress")
    board = progress._Board(path)
    board.report(None, {"loss": 1.0})
    board.report(None, {"loss": 2.0})  # within the second: held back
    assert progress.read_metrics(path) == {"loss": 1.0}
    clock[0] += progress.METRICS_EVERY_S
    board.beat(None)
    assert progress.read_metrics(path) == {"loss": 2.0}
    board.beat(step=9)  # the script's index of the step just done: 10 steps done
    seen = progress.read(path)
    assert seen is not None and seen.step == 10 and seen.job_steps is False


def test_a_checkpoint_after_the_last_note_is_said_without_a_made_up_count() -> None:
    known = [lost_work.Saved(120, 20.0, "step 119")]
    loss = lost_work.run_loss([note("n1", 75, 2.0)], 0, 0.0, 30.0, known)
    assert loss is not None and loss.repeats is None
    assert loss.text() == (
        "run 0's progress was last noted at step 75, before its last checkpoint (step 119), "
        "which holds 120: the next run repeats the steps it did after that checkpoint, which "
        "no note counted"
    )
