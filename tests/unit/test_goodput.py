"""The goodput split (hpclaunch.jobdir.goodput) from plain data: each part where it
belongs, and the parts adding up to the wall time whatever the clocks say."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from hpclaunch.jobdir import attempts, goodput
from hpclaunch.jobdir.goodput import RunTimes, Save
from hpclaunch.jobdir.hangs import NodeProgress, RankProgress


def events(*rows: dict[str, object]) -> list[attempts.AttemptEvent]:
    return attempts.parse(json.dumps(row) for row in rows)


def run_attempts(requeue: int, *rows: dict[str, object]) -> list[goodput.Attempt]:
    return goodput.merge(requeue, events(*rows))


Row = dict[str, object]


def node(
    attempt: int,
    begin: float,
    first: float | None,
    end: float | None = None,
    last: float | None = None,
    host: str = "n1",
    step: int = 5,
) -> list[Row]:
    rows: list[dict[str, object]] = [
        {"node": host, "attempt": attempt, "event": "begin", "time": begin}
    ]
    if first is not None:
        rows.append({"node": host, "attempt": attempt, "event": "first", "time": first, "step": 1})
    if end is not None:
        rows.append(
            {
                "node": host,
                "attempt": attempt,
                "event": "end",
                "time": end,
                "step": step,
                "step_time": last,
            }
        )
    return rows


def parts(found: goodput.Timeline | None) -> dict[str, float]:
    assert found is not None
    split = found.split
    stretches = sum(s.end - s.start for s in found.segments)
    assert stretches == pytest.approx(split.wall_s, abs=0.01)
    assert sum(split.parts().values()) == pytest.approx(split.wall_s, abs=0.01)
    return {k: v for k, v in split.parts().items() if v}


def test_one_run_that_completed() -> None:
    runs = [RunTimes(**{"requeue": 0, "started": 10, "ended": 100, "reason": "completed"})]
    found = {0: run_attempts(0, *node(0, 12, 20, 95, 90))}
    split = goodput.timeline(runs, found, [], set(), submitted=0, now=500, final=True)
    assert parts(split) == {"queue": 10, "startup": 10, "productive": 70, "shutdown": 10}
    assert split is not None and split.split.ratio == 0.7 and split.split.wall_s == 100


def test_a_lost_node_requeues_and_the_steps_after_the_checkpoint_are_lost() -> None:
    runs = [RunTimes(0, 10, 60, "bad nodes"), RunTimes(1, 70, 120, "completed")]
    found = {
        0: run_attempts(0, *node(0, 12, 20, 55, 50), *node(0, 12, 21, host="n2")),
        1: run_attempts(1, *node(0, 72, 80, 118, 115)),
    }
    saved = [Save(step=10, called=30, blocked_s=2)]
    split = goodput.timeline(runs, found, saved, set(), submitted=0, now=500, final=True)
    assert parts(split) == {
        "queue": 20,
        "startup": 20,
        "productive": 45,
        "checkpoint": 2,
        "lost": 18,
        "restarts": 10,
        "shutdown": 5,
    }


def test_an_in_place_restart_after_a_hang() -> None:
    runs = [RunTimes(0, 0, 100, "completed")]
    found = {0: run_attempts(0, *node(0, 2, 10, 50, 40), *node(1, 52, 60, 97, 95))}
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
    found = {0: run_attempts(0, *node(0, 52, 60))}
    split = goodput.timeline(runs, found, [], set(), submitted=40, now=200, final=False)
    assert parts(split) == {"queue": 10, "startup": 10, "productive": 140}


def test_a_requeued_job_waits_in_the_queue_until_now() -> None:
    runs = [RunTimes(0, 10, 100, "requeued by SLURM")]
    found = {0: run_attempts(0, *node(0, 12, 20, 90, 80))}
    split = goodput.timeline(runs, found, [], set(), submitted=0, now=150, final=False)
    # No later attempt yet: the unsaved steps are not (yet) repeated.
    assert parts(split) == {"queue": 60, "startup": 10, "productive": 60, "restarts": 20}


def test_a_run_without_a_step_is_all_start_up() -> None:
    runs = [RunTimes(0, 10, 40, "failed")]
    found = {0: run_attempts(0, *node(0, 12, None, 30))}
    assert parts(goodput.timeline(runs, found, [], set(), 5, 99, True)) == {
        "queue": 5,
        "startup": 30,
    }


def test_no_run_no_split() -> None:
    assert goodput.timeline([], {}, [], set(), 0, 10, False) is None


def test_a_lost_node_s_last_step_comes_from_its_progress_note() -> None:
    found = run_attempts(0, *node(0, 12, 20))
    note = NodeProgress("n1", 0, time=50, ranks=(RankProgress(0, 42, 1.0, 1.0, idle_s=4),))
    merged = goodput.with_notes(found, [note])
    assert (merged[0].last, merged[0].last_step) == (46, 42)
    assert goodput.with_notes(found, [NodeProgress("n1", 3, 50)]) == found


def test_merge_takes_the_earliest_end_and_the_lowest_last_step() -> None:
    found = run_attempts(
        0, *node(0, 12, 20, 55, 50, step=9), *node(0, 11, 21, 57, 52, host="n2", step=8)
    )
    assert found == [goodput.Attempt(0, 0, 11, 20, 1, 52, 8, 55)]
    assert attempts.parse(["not json", '{"node": "n1"}', "[]"]) == []


@pytest.mark.parametrize("seed", range(200))
def test_the_parts_add_up_whatever_the_clocks_say(seed: int) -> None:
    rng = random.Random(seed)

    def t() -> float:
        return rng.uniform(0, 1000)

    runs = [
        RunTimes(q, t(), rng.choice([None, t()]), rng.choice(["completed", "failed"]))
        for q in range(rng.randint(1, 3))
    ]
    found = {
        r.requeue: run_attempts(
            r.requeue,
            *[row for a in range(rng.randint(0, 3)) for row in node(a, t(), t(), t(), t())],
        )
        for r in runs
    }
    saved = [Save(1, t(), rng.uniform(0, 50)) for _ in range(rng.randint(0, 4))]
    hung = {(0, 0)} if rng.random() < 0.5 else set()
    split = goodput.timeline(
        runs,
        found,
        sorted(saved, key=lambda s: s.called),
        hung,
        rng.choice([None, t()]),
        now=t(),
        final=rng.random() < 0.5,
    )
    parts(split)
    assert split is not None and all(v >= 0 for v in split.split.parts().values())


def test_durations_read_as_people_say_them() -> None:
    assert [goodput.duration(s) for s in (4.4, 185, 7440)] == ["4 s", "3 min 05 s", "2 h 04 min"]


def test_a_lightning_checkpoint_keeps_the_steps_before_it(tmp_path: Path) -> None:
    """StopCheckpoint notes no save record: its checkpoint file's time holds the steps."""
    from hpclaunch.jobdir.history import History, Run
    from hpclaunch.jobdir.layout import JobFolder

    job = JobFolder(tmp_path)
    runs = [
        Run(0, "n1", 10.0, 60.0, reason="bad nodes", action="requeue"),
        Run(1, "n1", 70.0, 120.0, reason="completed", action="none"),
    ]
    history = History(7, 3, runs)
    history.save(tmp_path)
    for requeue, rows in ((0, node(0, 12, 20, 55, 50)), (1, node(0, 72, 80, 118, 115))):
        for row in rows:
            attempts.append(job, requeue, attempts.AttemptEvent(**row))  # type: ignore[arg-type]
    lightning = job.checkpoints / "lightning"
    lightning.mkdir(parents=True)
    ckpt = lightning / "step-000000000040.ckpt"
    ckpt.write_bytes(b"x")
    os.utime(ckpt, (45.0, 45.0))
    found = parts(goodput.of_folder(tmp_path, 7, 0.0, now=500.0, final=True))
    assert found["lost"] == pytest.approx(5.0)  # 45 -> 50, not the whole run's 20 -> 50


def test_a_save_after_the_last_noted_step_keeps_the_training_before_it() -> None:
    """A lost node's run notes no end: its last note (here at 40) is older than its last
    save (called at 50), so training went on at least until the save."""
    runs = [RunTimes(0, 10, 60, "requeued by SLURM"), RunTimes(1, 70, 120, "completed")]
    found = {
        0: run_attempts(0, *node(0, 12, 20)),
        1: run_attempts(1, *node(0, 72, 80, 118, 115)),
    }
    found[0] = goodput.with_notes(
        found[0], [NodeProgress("n1", 0, 45.0, (RankProgress(0, 30, 1.0, 0.3, 5.0),))]
    )
    saved = [Save(step=39, called=50, blocked_s=1)]
    split = goodput.timeline(runs, found, saved, set(), submitted=0, now=500, final=True)
    got = parts(split)
    assert got["productive"] == pytest.approx(30 + 35) and got["checkpoint"] == 1
    assert "lost" not in got  # the last step known is the save's: nothing after it noted
