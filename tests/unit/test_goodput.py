"""The goodput split (hpclaunch.record.goodput) from plain data: each part where it
belongs, training whose fate hpclaunch did not see as ``unknown`` rather than ``lost``,
and the parts adding up to the wall time whatever the clocks say."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from hpclaunch.jobdir import attempts as events
from hpclaunch.jobdir.history import History, Run
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.record import goodput
from hpclaunch.record.attempts import Attempt
from hpclaunch.record.checkpoints import Kind, Saved
from hpclaunch.record.goodput import RunTimes
from hpclaunch.record.job_record import JobRecord


def attempt(
    requeue: int,
    number: int,
    began: float,
    first: float | None,
    ended: float | None = None,
    last: float | None = None,
    *,
    steps: tuple[int, int] = (1, 5),
    resumed: int | None = None,
    job_count: bool = True,
    samples: tuple[tuple[float, int], ...] = (),
) -> Attempt:
    """An attempt that did steps ``steps[0]..steps[1]`` (steps done) from ``first`` to
    ``last``, at an even rate unless ``samples`` say otherwise."""
    if first is not None and last is not None and not samples:
        samples = ((first, steps[0]), (last, steps[1]))
    return Attempt(
        requeue,
        number,
        began,
        first,
        steps[0] if first is not None else None,
        last,
        steps[1] if last is not None else None,
        ended,
        resumed,
        "checkpoint" if resumed is not None else None,
        job_count,
        samples,
    )


def save(called: float, blocked: float, steps: int | None = None) -> Saved:
    return Saved(Kind.HPCLAUNCH, f"step {steps}", called + blocked, steps, called, blocked)


def parts(found: goodput.Timeline | None) -> dict[str, float]:
    assert found is not None
    split = found.split
    stretches = sum(s.end - s.start for s in found.segments)
    assert stretches == pytest.approx(split.wall_s, abs=0.01)
    assert sum(split.parts().values()) == pytest.approx(split.wall_s, abs=0.01)
    return {k: v for k, v in split.parts().items() if v}


def test_one_run_that_completed() -> None:
    runs = [RunTimes(0, 10, 100, "completed", "none")]
    found = {0: [attempt(0, 0, 12, 20, 95, 90)]}
    split = goodput.timeline(runs, found, [], set(), submitted=0, now=500, final=True)
    assert parts(split) == {"queue": 10, "startup": 10, "productive": 70, "shutdown": 10}
    assert split is not None and split.split.ratio == 0.7 and split.split.wall_s == 100
    assert split.split.line() == (
        "70.0 % of 1 min 40 s: queue 10 s, startup 10 s, productive 1 min 10 s, shutdown 10 s"
    )


def test_the_next_run_s_resume_point_tells_what_was_lost() -> None:
    """Run 0 did steps 1..41 from 20 to 60 s; run 1 showed it resumed from step 21, which
    run 0 passed at 40 s: 40 -> 60 was done twice."""
    runs = [RunTimes(0, 10, 65, "bad nodes", "requeue"), RunTimes(1, 70, 120, "completed")]
    found = {
        0: [attempt(0, 0, 12, 20, 62, 60, steps=(1, 41))],
        1: [attempt(1, 0, 72, 80, 118, 115, steps=(22, 60), resumed=21)],
    }
    split = goodput.timeline(runs, found, [], set(), submitted=0, now=500, final=True)
    assert parts(split) == {
        "queue": 15,
        "startup": 20,
        "productive": 20 + 35,
        "lost": 20,
        "restarts": 5,
        "shutdown": 5,
    }


def test_a_run_resumed_from_an_unseen_step_has_its_training_unknown_not_lost() -> None:
    """A script that checkpoints its own way and restores no count hpclaunch sees: what
    run 0 did is neither productive nor lost as far as hpclaunch knows."""
    runs = [
        RunTimes(0, 10, 65, "requeued by SLURM", "SLURM requeues"),
        RunTimes(1, 70, 120, "completed"),
    ]
    found = {
        0: [attempt(0, 0, 12, 20, 62, 60, steps=(1, 41))],
        1: [attempt(1, 0, 72, 80, 118, 115, steps=(1, 36), job_count=False)],
    }
    split = goodput.timeline(runs, found, [], set(), submitted=0, now=500, final=True)
    got = parts(split)
    assert got["unknown"] == 40 and "lost" not in got and got["productive"] == 35
    assert split is not None and split.split.ratio_max == pytest.approx(75 / 120, abs=1e-3)
    assert split.split.line().startswith("29.2 % to 62.5 % of 2 min 00 s: ")
    assert "unknown 40 s" in split.split.line()


def test_hpclaunch_saves_tell_while_the_next_run_has_not_resumed() -> None:
    runs = [RunTimes(0, 10, 60, "bad nodes", "requeue")]
    found = {0: [attempt(0, 0, 12, 20, 55, 50)]}
    saved = [save(called=30, blocked=2, steps=11)]
    split = goodput.timeline(runs, found, saved, set(), submitted=0, now=100, final=False)
    assert parts(split) == {
        "queue": 10 + 40,
        "startup": 10,
        "productive": 10,
        "checkpoint": 2,
        "lost": 18,
        "restarts": 10,
    }


def test_a_next_run_that_stepped_without_resuming_through_hpclaunch_makes_its_saves_no_proof() -> (
    None
):
    runs = [RunTimes(0, 10, 60, "bad nodes", "requeue"), RunTimes(1, 70, 120, "completed")]
    found = {
        0: [attempt(0, 0, 12, 20, 55, 50)],
        1: [attempt(1, 0, 72, 80, 118, 115, job_count=False)],
    }
    saved = [save(called=30, blocked=2, steps=11)]
    got = parts(goodput.timeline(runs, found, saved, set(), submitted=0, now=500, final=True))
    assert got["unknown"] == 30 and "lost" not in got


def test_a_file_matching_the_pattern_tells_by_its_time() -> None:
    runs = [RunTimes(0, 10, 60, "bad nodes", "requeue"), RunTimes(1, 70, 120, "completed")]
    found = {
        0: [attempt(0, 0, 12, 20, 55, 50)],
        1: [attempt(1, 0, 72, 80, 118, 115, job_count=False)],
    }
    own = [Saved(Kind.PATTERN, "/w/snapshot.pt", 44.0, None, 44.0)]
    got = parts(goodput.timeline(runs, found, own, set(), submitted=0, now=500, final=True))
    assert got["lost"] == 6 and "unknown" not in got


def test_an_in_place_restart_after_a_hang() -> None:
    runs = [RunTimes(0, 0, 100, "completed", "none")]
    found = {
        0: [
            attempt(0, 0, 2, 10, 50, 40, steps=(1, 30)),
            attempt(0, 1, 52, 60, 97, 95, steps=(1, 30), resumed=0),
        ]
    }
    split = goodput.timeline(runs, found, [], {(0, 0)}, submitted=None, now=500, final=True)
    assert parts(split) == {
        "startup": 10,
        "lost": 30,
        "hangs": 10,
        "restarts": 10,
        "productive": 35,
        "shutdown": 5,
    }
    assert split is not None and not split.split.submit_known
    assert "submit time unknown" in split.split.line()


def test_a_running_job_trains_until_now() -> None:
    runs = [RunTimes(0, 50, None)]
    found = {0: [attempt(0, 0, 52, 60)]}
    split = goodput.timeline(
        runs, found, [], set(), submitted=40, now=200, final=False, running=True
    )
    assert parts(split) == {"queue": 10, "startup": 10, "productive": 140}


def test_a_run_that_recorded_no_end_ends_where_it_was_last_seen() -> None:
    """Its batch host lost (no supervisor to record the end), SLURM requeued the job: not
    running, so its training stopped at its last step, not now; ended, it still shows."""
    runs = [RunTimes(0, 10, None)]
    found = {0: [attempt(0, 0, 12, 20, None, 60, steps=(1, 41))]}
    pending = goodput.timeline(runs, found, [], set(), submitted=0, now=500, final=False)
    got = parts(pending)
    assert got["productive"] == 40 and got["queue"] == 10 + 440
    ended = goodput.timeline(runs, found, [], set(), submitted=0, now=500, final=True)
    assert parts(ended) == {"queue": 10, "startup": 10, "productive": 40}
    assert ended is not None and ended.split.wall_s == 60


def test_a_requeued_job_waiting_for_its_next_run_has_unknown_training_without_checkpoints() -> None:
    runs = [RunTimes(0, 10, 100, "requeued by SLURM", "SLURM requeues")]
    found = {0: [attempt(0, 0, 12, 20, 90, 80)]}
    split = goodput.timeline(runs, found, [], set(), submitted=0, now=150, final=False)
    assert parts(split) == {"queue": 60, "startup": 10, "unknown": 60, "restarts": 20}


def test_a_job_that_never_showed_a_step_has_no_ratio() -> None:
    runs = [RunTimes(0, 10, 40, "completed", "none")]
    found = {0: [attempt(0, 0, 12, None, 30)]}
    split = goodput.timeline(runs, found, [], set(), 5, 99, True)
    assert parts(split) == {"queue": 5, "unknown": 30}
    assert split is not None and split.split.ratio is None
    assert split.split.line().startswith("unknown: no training step was seen in 35 s")


def test_no_run_no_split() -> None:
    assert goodput.timeline([], {}, [], set(), 0, 10, False) is None


@pytest.mark.parametrize("seed", range(200))
def test_the_parts_add_up_whatever_the_clocks_say(seed: int) -> None:
    rng = random.Random(seed)

    def t() -> float:
        return rng.uniform(0, 1000)

    runs = [
        RunTimes(
            q,
            t(),
            rng.choice([None, t()]),
            rng.choice(["completed", "failed"]),
            rng.choice([None, "none", "requeue"]),
        )
        for q in range(rng.randint(1, 3))
    ]
    found = {
        r.requeue: [
            attempt(
                r.requeue,
                a,
                t(),
                rng.choice([None, t()]),
                t(),
                t(),
                steps=(rng.randint(1, 9), rng.randint(9, 99)),
                resumed=rng.choice([None, rng.randint(0, 120)]),
                job_count=rng.random() < 0.5,
            )
            for a in range(rng.randint(0, 3))
        ]
        for r in runs
    }
    saved = sorted(
        [save(t(), rng.uniform(0, 50), rng.choice([None, 7])) for _ in range(rng.randint(0, 4))],
        key=lambda s: s.time,
    )
    hung = {(0, 0)} if rng.random() < 0.5 else set()
    split = goodput.timeline(
        runs,
        found,
        saved,
        hung,
        rng.choice([None, t()]),
        now=t(),
        final=rng.random() < 0.5,
        running=rng.random() < 0.5,
    )
    parts(split)
    assert split is not None and all(v >= 0 for v in split.split.parts().values())


def test_durations_read_as_people_say_them() -> None:
    assert [goodput.duration(s) for s in (4.4, 185, 7440)] == ["4 s", "3 min 05 s", "2 h 04 min"]


def test_a_lightning_checkpoint_keeps_the_steps_before_it(tmp_path: Path) -> None:
    """StopCheckpoint notes no save record: its checkpoint file's time holds the steps."""
    job = JobFolder(tmp_path)
    runs = [
        Run(0, "n1", 10.0, 60.0, reason="bad nodes", action="requeue"),
        Run(1, "n1", 70.0, 120.0, reason="completed", action="none"),
    ]
    History(7, 3, runs).save(tmp_path)
    rows = {
        0: [
            (events.BEGIN, 12.0, None, None),
            (events.FIRST, 20.0, 1, None),
            (events.STEP, 45.0, 40, None),
            (events.END, 55.0, 50, 50.0),
        ],
        1: [
            (events.BEGIN, 72.0, None, None),
            (events.FIRST, 80.0, 41, None),
            (events.END, 118.0, 80, 115.0),
        ],
    }
    for requeue, found in rows.items():
        for event, at, step, step_time in found:
            # Run 1 resumed from the Lightning checkpoint of global step 40.
            resumed, how = (
                (40, "lightning") if requeue == 1 and event == events.FIRST else (None, None)
            )
            row = events.AttemptEvent("n1", 0, event, at, step, step_time, resumed, how)
            events.append(job, requeue, row)
    lightning = job.checkpoints / "lightning"
    lightning.mkdir(parents=True)
    ckpt = lightning / "step-000000000040.ckpt"
    ckpt.write_bytes(b"x")
    os.utime(ckpt, (45.0, 45.0))
    found = parts(goodput.of_record(JobRecord.read(tmp_path, 7), 0.0, now=500.0, final=True))
    assert found["lost"] == pytest.approx(5.0)  # 45 -> 50, not the whole run's 20 -> 50


def test_a_save_after_the_last_noted_step_keeps_the_training_before_it() -> None:
    """A lost node's run notes no end: its last note (here at 40) is older than its last
    save (called at 50), so training went on at least until the save."""
    runs = [
        RunTimes(0, 10, 60, "requeued by SLURM", "SLURM requeues"),
        RunTimes(1, 70, 120, "completed", "none"),
    ]
    found = {
        0: [attempt(0, 0, 12, 20, None, 40, steps=(1, 30))],
        1: [attempt(1, 0, 72, 80, 118, 115, steps=(41, 60), resumed=40)],
    }
    saved = [save(called=50, blocked=1, steps=40)]
    split = goodput.timeline(runs, found, saved, set(), submitted=0, now=500, final=True)
    got = parts(split)
    assert got["productive"] == pytest.approx(30 + 35) and got["checkpoint"] == 1
    assert "lost" not in got  # the last step known is the save's: nothing after it noted
