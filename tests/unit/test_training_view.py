"""The training's view in status and --follow (hpclaunch.record.training,
follow.progress_due, follow.changes) and the work a run loses (hpclaunch.record.lost_work),
from records built in memory; and the progress board's total and metrics."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hpclaunch import progress
from hpclaunch.jobdir import failures
from hpclaunch.jobdir.attempts import STEP, AttemptEvent
from hpclaunch.jobdir.layout import AttemptFolder
from hpclaunch.jobdir.progress_notes import NodeProgress, RankProgress
from hpclaunch.ops.follow import PROGRESS_EVERY_S, changes, progress_due
from hpclaunch.ops.status import JobStatus, RunSummary
from hpclaunch.record import goodput, lost_work, training
from hpclaunch.record.attempts import Attempt
from hpclaunch.record.checkpoints import Kind, Saved
from hpclaunch.record.job_record import RunRecord


def note(
    node: str,
    step: int,
    rate: float | None,
    *,
    attempt: int = 0,
    idle: float = 0.1,
    total: int | None = None,
    metrics: dict[str, float] | None = None,
    at: float = 100.0,
) -> NodeProgress:
    ranks = (RankProgress(0, step, rate, 0.3, idle, True),)
    return NodeProgress(node, attempt, at, ranks, total, metrics or {}, 0 if metrics else None)


def view(
    notes: list[NodeProgress],
    now: float,
    *,
    job_count: bool = True,
    events: tuple[AttemptEvent, ...] = (),
) -> training.Training | None:
    """The progress line's numbers, as status works them out for run 0 (each attempt's
    first step noted as 1 step done)."""
    merged = [
        Attempt(0, a, 0.0, 1.0, 1, None, None, None, job_count=job_count)
        for a in sorted({n.attempt for n in notes})
    ]
    return training.of_run(RunRecord(0, tuple(notes), events), merged, now)


def test_the_line_has_the_step_out_of_the_total_the_rate_the_eta_and_the_metrics() -> None:
    found = view([note("n1", 120, 2.0, total=1000, metrics={"loss": 0.31234})], now=103.0)
    assert found is not None and found.eta_s == pytest.approx(440.0)
    assert training.line(found, now=103.0) == (
        "step 120 of 1000 (12 %), 2.00 steps/s, ETA 7 min 20 s; loss 0.3123 "
        "(attempt 0, noted 3 s ago)"
    )
    # No total: no share, no ETA; stopped stepping: no ETA either.
    bare = view([note("n1", 5, None)], now=100.0)
    assert (
        bare is not None and training.line(bare, now=100.0) == "step 5 (attempt 0, noted 0 s ago)"
    )
    idle = view([note("n1", 120, 2.0, total=1000, idle=40.0)], now=100.0)
    assert idle is not None and idle.eta_s is None
    assert "no step for 40 s" in training.line(idle, now=100.0)


def test_an_attempt_that_resumed_from_an_unseen_step_says_so_and_gives_no_eta() -> None:
    found = view([note("n1", 30, 2.0, total=1000)], now=100.0, job_count=False)
    assert found is not None and found.step is None and found.eta_s is None
    assert training.line(found, now=100.0) == (
        "30 steps since attempt 0 began, from a step hpclaunch did not see (of 1000), "
        "2.00 steps/s (attempt 0, noted 0 s ago)"
    )


def samples(node: str, *points: tuple[float, int]) -> tuple[AttemptEvent, ...]:
    """A node's progress samples in the attempts log: (time, steps done)."""
    return tuple(AttemptEvent(node, 0, STEP, when, done) for when, done in points)


def test_a_node_is_named_slow_only_when_its_count_falls_behind_not_for_its_rate_alone() -> None:
    def line(notes: list[NodeProgress], now: float, *events: AttemptEvent) -> str | None:
        found = view(notes, now, events=events)
        return training.line(found, now) if found else None

    # Ranks that step together: a note written early in the attempt shows a lower rate,
    # yet at the same moments both nodes had done the same steps: nobody is slow.
    together = (
        *samples("n1", (60.0, 10), (80.0, 30), (99.9, 40)),
        *samples("n2", (60.0, 10), (80.0, 30)),
    )
    notes = [note("n1", 40, 4.0), note("n2", 30, 2.0, at=80.1)]
    assert training.slowest(notes, together) is None
    assert "slowest" not in (line(notes, 102.0, *together) or "")
    # Its rate alone, with no samples to compare counts at the same moment: nobody either.
    assert training.slowest([note("n1", 40, 4.0), note("n2", 20, 2.0)]) is None
    # A node really behind: half the steps at each moment, the gap growing.
    apart = (
        *samples("n1", (60.0, 10), (80.0, 30), (99.9, 40)),
        *samples("n2", (60.0, 5), (80.0, 15), (99.9, 20)),
    )
    slow = line([note("n1", 40, 4.0), note("n2", 20, 2.0)], 102.0, *apart)
    assert slow is not None and slow.endswith("; slowest node n2 (0.500 s/step, the others 0.250)")
    assert line([], now=1.0) is None
    stuck = line([note("n1", 40, 4.0)], now=135.0)  # idle 0.1 s + noted 35 s ago
    assert stuck == "step 40, no step for 35 s, 4.00 steps/s (attempt 0, noted 35 s ago)"


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
        found = view([note("n1", step, rate, attempt=attempt, idle=idle, total=total)], now=100.0)
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


def attempt(
    requeue: int,
    last_step: int | None,
    *,
    first_step: int = 1,
    resumed: int | None = None,
    by: str | None = None,
    job_count: bool = True,
    number: int = 0,
) -> Attempt:
    stepped = last_step is not None
    return Attempt(
        requeue,
        number,
        0.0,
        10.0 if stepped else None,
        first_step if stepped else None,
        50.0 if stepped else None,
        last_step,
        60.0,
        resumed,
        by if resumed is not None else None,
        job_count or resumed is not None,
        end_known=stepped,  # its nodes logged its end
    )


def hpclaunch_save(step: int, holds: int | None, time: float) -> Saved:
    return Saved(Kind.HPCLAUNCH, f"step {step}", time, holds, time - 0.5, 0.1)


@pytest.mark.parametrize(
    ("case", "following", "saved", "over", "repeats", "final", "text"),
    [
        (
            "own checkpoint, SGD: the next run shows no resume point",
            [attempt(1, 36, job_count=False)],
            [],
            False,
            None,
            True,
            "run 0 did 45 steps; run 1 did not show which step it resumed from (hpclaunch "
            "sees it in its own checkpoints, in an Adam-family optimizer's restored state, in "
            "hpclaunch.progress.beat(step=...) and in Lightning's StopCheckpoint): the steps it "
            "repeated are unknown",
        ),
        (
            "own checkpoint, AdamW: the optimizer's count shows it",
            [attempt(1, 60, first_step=41, resumed=40, by="optimizer")],
            [],
            False,
            5,
            True,
            "run 0 did 45 steps; run 1 resumed from step 40 (the optimizer's restored step "
            "count): it repeated 5 steps",
        ),
        (
            "hpclaunch's checkpoint, before the next run resumed",
            [],
            [
                hpclaunch_save(29, 30, 20.0),
                hpclaunch_save(39, 40, 40.0),
                hpclaunch_save(49, 50, 90.0),
            ],
            False,
            5,
            False,
            "run 0 did 45 steps; its last checkpoint (step 39) holds 40: a run that resumes "
            "from it repeats 5 steps",
        ),
        (
            "a per-epoch label is not a count of steps",
            [],
            [hpclaunch_save(3, 45, 50.0)],
            False,
            0,
            False,
            "run 0 did 45 steps; its last checkpoint (step 3) holds 45: nothing is repeated",
        ),
        (
            "no checkpoint seen, the next run not started",
            [],
            [],
            False,
            None,
            False,
            "run 0 did 45 steps: the step the next run resumes from is unknown until it "
            "resumes (hpclaunch sees it in its own checkpoints, in an Adam-family optimizer's "
            "restored state, in hpclaunch.progress.beat(step=...) and in Lightning's "
            "StopCheckpoint)",
        ),
        (
            "a file of its own, found by pattern",
            [],
            [Saved(Kind.PATTERN, "/w/snapshot.pt", 40.0, None, 40.0)],
            False,
            None,
            False,
            "run 0 did 45 steps; its last checkpoint of its own is /w/snapshot.pt: the step "
            "the next run resumes from is unknown until it resumes (hpclaunch sees it in its own "
            "checkpoints, in an Adam-family optimizer's restored state, in "
            "hpclaunch.progress.beat(step=...) and in Lightning's StopCheckpoint)",
        ),
        (
            "a checkpoint after the last note: no made-up count",
            [],
            [hpclaunch_save(119, 120, 55.0)],
            False,
            None,
            False,
            "run 0's progress was last noted at step 45, before its last checkpoint (step 119), "
            "which holds 120: a run that resumes from it repeats the steps it did after that "
            "checkpoint, which no note counted",
        ),
        (
            "the next run found no checkpoint and started over",
            [attempt(1, 45, resumed=0, by="checkpoint")],
            [],
            False,
            45,
            True,
            "run 0 did 45 steps; run 1 started from step 0 (hpclaunch found no checkpoint): it "
            "repeated 45 steps",
        ),
        (
            "the next run resumed past the last note: the note is older than the end",
            [attempt(1, 80, first_step=51, resumed=50, by="checkpoint")],
            [],
            False,
            None,
            True,
            "run 0 did 45 steps; run 1 resumed from step 50 (its hpclaunch checkpoint), after "
            "the last step noted: the steps it repeated are unknown",
        ),
    ],
)
def test_lost_work_says_only_what_is_known(
    case: str,
    following: list[Attempt],
    saved: list[Saved],
    over: bool,
    repeats: int | None,
    final: bool,
    text: str,
) -> None:
    loss = lost_work.run_loss(0, [attempt(0, 45)], following, saved, 60.0, over)
    assert loss is not None, case
    assert (loss.repeats, loss.final, loss.text) == (repeats, final, text), case
    # "from step 0" only where a run showed it started there.
    assert "from step 0" not in loss.text or "found no checkpoint" in loss.text


def test_a_file_of_its_own_tells_the_time_not_the_steps_when_the_next_run_showed_nothing() -> None:
    own = Saved(Kind.PATTERN, "/w/snapshot.pt", 40.0, None, 40.0)
    loss = lost_work.run_loss(
        0, [attempt(0, 45)], [attempt(1, 36, job_count=False)], [own], 60.0, False
    )
    assert loss is not None and loss.repeats is None and loss.final
    assert loss.text.endswith(
        "the steps it repeated are unknown; if it resumed from the last checkpoint of its own "
        "(/w/snapshot.pt), they are the steps of run 0's last 10 s"
    )


def test_a_run_whose_nodes_noted_no_end_did_at_least_its_last_note() -> None:
    """Its agents killed before they noted the end (a lost node's step killed by SLURM):
    its last note may be older than its end, so its count is a floor, and so is what the
    next run repeated."""
    unended = replace(attempt(0, 45), ended=None, end_known=False)
    loss = lost_work.run_loss(
        0, [unended], [attempt(1, 60, first_step=41, resumed=40, by="optimizer")], [], 60.0, False
    )
    assert loss is not None and (loss.steps, loss.at_least, loss.repeats) == (None, 45, None)
    assert loss.text == (
        "run 0 did at least 45 steps (no node noted its end: its last note may be older); "
        "run 1 resumed from step 40 (the optimizer's restored step count): it repeated at "
        "least 5 steps"
    )
    forecast = lost_work.run_loss(0, [unended], [], [hpclaunch_save(39, 40, 20.0)], 60.0, False)
    assert forecast is not None and forecast.repeats is None
    assert forecast.text.endswith("holds 40: a run that resumes from it repeats at least 5 steps")


def test_a_run_whose_own_count_is_unknown_repeats_an_unknown_number() -> None:
    loss = lost_work.run_loss(
        1,
        [attempt(1, 30, job_count=False)],
        [attempt(2, 50, resumed=40, by="optimizer")],
        [],
        60.0,
        False,
    )
    assert loss is not None and loss.repeats is None and loss.steps is None
    assert loss.text.startswith(
        "run 1 did 30 steps after resuming from a step hpclaunch did not see"
    )
    assert lost_work.run_loss(0, [attempt(0, None)], [], [], 60.0, False) is None  # no step


def test_never_saved_is_said_only_when_nothing_was_seen() -> None:
    found = {0: [attempt(0, 12)]}
    warning = lost_work.never_saved([], found, 12)
    assert warning is not None and warning.startswith(
        "12 steps done and no checkpoint of the job seen"
    )
    assert "--checkpoint-pattern" in warning
    assert lost_work.never_saved([hpclaunch_save(4, 5, 1.0)], found, 12) is None
    resumed = {0: [attempt(0, 12)], 1: [attempt(1, 20, resumed=10, by="optimizer")]}
    assert lost_work.never_saved([], resumed, 20) is None  # it resumed from something


def test_a_restart_says_which_rank_on_which_node_and_why(tmp_path: Path) -> None:
    logs = [AttemptFolder(0, "0", a, tmp_path / f"a{a}") for a in (0, 1)]
    echo = failures.WorkerFailure(1, -15, "Signals.SIGTERM")
    own = failures.WorkerFailure(3, 3, "rank 3: crashing at step 12")
    run = RunRecord(
        0,
        failures=(
            failures.NodeRecord("n1", 0, 0, 0, 5.0, (echo,)),
            failures.NodeRecord("n2", 1, 0, 0, 6.0, (own,)),
        ),
    )
    assert training.restarts(run, logs) == [
        "attempt 1 began after attempt 0 failed: rank 3 on n2: rank 3: crashing at step 12"
    ]


def test_follow_says_each_run_s_lost_work_once_when_nothing_can_change_it() -> None:
    run0 = RunSummary(0, ["n1", "n2"], 0.0, 30.0, "requeued by SLURM", "SLURM requeues")
    run1 = RunSummary(1, ["n1", "n3"], 40.0, None, None, None)
    guess = lost_work.run_loss(0, [attempt(0, 45)], [], [hpclaunch_save(39, 40, 20.0)], 30.0, False)
    known = lost_work.run_loss(
        0,
        [attempt(0, 45)],
        [attempt(1, 60, first_step=41, resumed=40, by="checkpoint")],
        [],
        30.0,
        False,
    )
    assert guess is not None and known is not None and not guess.final and known.final
    pending = JobStatus(7, state="PENDING", requeues=1, runs=[run0], lost_work=[guess])
    assert not [line for line in changes(None, pending) if line.startswith("lost work")]
    stepping = JobStatus(7, state="RUNNING", requeues=1, runs=[run0, run1], lost_work=[known])
    said = [line for line in changes(pending, stepping) if line.startswith("lost work")]
    assert said == [f"lost work: {known.text}"]
    assert not [line for line in changes(stepping, stepping) if line.startswith("lost work")]
    ended = JobStatus(7, state="COMPLETED", requeues=1, runs=[run0, run1], lost_work=[known])
    assert not [line for line in changes(stepping, ended) if line.startswith("lost work")]


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
