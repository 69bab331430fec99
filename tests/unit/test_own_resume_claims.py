"""The judge of tests/integration/test_own_resume.py (own_resume_claims): fed what
hpclaunch said of a job that resumed at step 40 from its own checkpoint after run 0
did 45 steps, it finds the false claims of the outputs before the job record (issue 29:
"no checkpoint was written: the next run starts from step 0 and repeats 45 steps") and
passes true ones, with the resume point seen and unseen."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.integration.own_resume_claims import (
    Said,
    Truth,
    falsehoods,
    resume_problems,
    seconds,
)

STEP_S = 0.3


def notes(resumed: int = 40, last: int = 45, steps: int = 60, drift: float = 0.0) -> str:
    """A script's steps.jsonl: run 0 from 0 to ``last``, run 1 from ``resumed`` to the
    end; run 1's parameters after a step differ from run 0's by ``drift``."""
    lines: list[dict[str, Any]] = [{"run": 0, "resumed": 0, "world_size": 2, "t": 100.0}]
    lines += [
        {"run": 0, "step": n, "t": 100 + n * STEP_S, "params": [n / 100, 1.0]}
        for n in range(1, last + 1)
    ]
    start = [resumed / 100 + drift, 1.0]
    lines.append({"run": 1, "resumed": resumed, "world_size": 2, "t": 200.0, "params": start})
    lines += [
        {"run": 1, "step": n, "t": 200 + n * STEP_S, "params": [n / 100 + drift, 1.0]}
        for n in range(resumed + 1, steps + 1)
    ]
    lines.append({"run": 1, "done": steps, "params": [steps / 100, 1.0], "t": 300.0})
    return "".join(json.dumps(line) + "\n" for line in lines)


TRUTH = Truth.parse(notes())

# hpclaunch 0.x before the job record, on such a job (issue 29).
BEFORE = (
    "run 0 did 45 steps and no checkpoint was written: the next run starts from step 0 "
    "and repeats 45 steps"
)
KILLED = (
    "run 0: the workers on n1 were killed by SIGTERM, which they do not catch, so they "
    "saved nothing on it"
)
NEVER_SAVED = (
    "45 steps done and no checkpoint written: a requeue or an in-place restart starts "
    "again from step 0; save with hpclaunch.checkpoint.save"
)


def said(text: str, entry: dict[str, Any], goodput: dict[str, float], line: str) -> Said:
    return Said(
        status_json={"lost_work": [entry], "goodput": goodput},
        status_text="\n".join(
            ["job 7 (train): COMPLETED", f"  lost work:       {text}", f"  goodput:         {line}"]
        )
        + "\n",
        follow_text="\n".join(
            ["[10:00:01] job 7: progress: step 45 of 60", f"[10:00:09] job 7: lost work: {text}"]
        )
        + "\n",
        batch_log=f"epoch 1 done\nsupervisor: lost work: {text}\n",
    )


def today() -> Said:
    entry = {"requeue": 0, "steps": 45, "saved": None, "repeats": 45}
    goodput = {"lost_s": 14.0, "productive_s": 20.0}
    out = said(BEFORE, entry, goodput, "62.5 % of 32 s: productive 20 s, lost 14 s")
    return Said(
        {**out.status_json, "notes": [KILLED, NEVER_SAVED]},
        out.status_text + f"  note: {KILLED}\n  note: {NEVER_SAVED}\n",
        out.follow_text + f"[10:00:09] job 7: lost work: {BEFORE}\n",
        out.batch_log + f"supervisor: warning: {NEVER_SAVED}\n",
    )


SEEN = "run 0 did 45 steps; the next run resumed from step 40 and repeated 5 steps"
UNSEEN = "run 0 did 45 steps; where the next run resumed is unknown, and so what it repeats"


def seen() -> Said:
    entry = {
        "requeue": 0,
        "steps": 45,
        "resumed": 40,
        "resumed_by": "optimizer",
        "repeats": 5,
        "text": SEEN,
    }
    goodput = {"lost_s": 1.6, "unknown_s": 0.0}
    out = said(SEEN, entry, goodput, "90.0 % of 32 s: productive 29 s, lost 2 s")
    return replace(out, status_json={**out.status_json, "notes": [KILLED]})


def unseen() -> Said:
    entry = {
        "requeue": 0,
        "steps": 45,
        "resumed": None,
        "resumed_by": None,
        "repeats": None,
        "text": UNSEEN,
    }
    goodput = {"lost_s": 0.0, "unknown_s": 13.5}
    return said(UNSEEN, entry, goodput, "60.0 % of 32 s: productive 19 s, unknown 14 s")


def test_the_truth_is_what_the_script_noted() -> None:
    assert sorted(TRUTH.runs) == [0, 1] and TRUTH.requeued() == [0]
    assert (TRUTH.runs[0].last, TRUTH.resumed_after(0), TRUTH.repeats(0)) == (45, 40, 5)
    assert TRUTH.redone_s(0) == pytest.approx(5 * STEP_S)
    assert TRUTH.step_s() == pytest.approx(STEP_S)


def test_a_note_before_its_runs_start_is_refused() -> None:
    with pytest.raises(ValueError, match="line 1: run 0 noted a step before its start"):
        Truth.parse('{"run": 0, "step": 1, "t": 1.0}\n')
    start = '{"run": 0, "resumed": 0, "t": 1.0}\n'
    with pytest.raises(ValueError, match="line 2: run 0 started twice"):
        Truth.parse(start * 2)


@pytest.mark.parametrize("visible", [True, False])
def test_todays_false_outputs_are_reported_false(visible: bool) -> None:
    wrong = falsehoods(TRUTH, today(), visible=visible)
    joined = "\n".join(wrong)
    # "repeats 45 steps" where 5 were repeated, in each of the four places.
    line = repr(f"lost work: {BEFORE}")
    for where in ("status", "--follow", "batch log"):
        assert f"{where}: {line}: run 0 repeated 5, not 45" in wrong, joined
        assert f"{where}: {line}: the run after 0 resumed from 40" in wrong, joined
    warning = repr(f"warning: {NEVER_SAVED}")
    assert f"batch log: {warning}: the run after 0 resumed from 40" in wrong, joined
    for where in ("status", "status --json"):  # status's note, the same words
        assert f"{where}: {('note: ' + NEVER_SAVED)!r}: the run after 0 resumed from 40" in wrong
    assert not [w for w in wrong if KILLED in w], joined  # true: nothing saved on SIGTERM
    assert any(w.startswith("status --json: lost_work entry") for w in wrong), joined
    assert any(w.startswith("status --json: goodput has no unknown_s: {") for w in wrong)
    assert "goodput: lost 14.0 s where 1.5 s of steps were redone" in joined
    assert any("lost is at most" in w for w in wrong), joined  # the 14 s
    if not visible:
        assert f"status: {line}: the resume point is unknown; it does not say so" in wrong


def test_the_outputs_recorded_on_the_sandbox_are_reported_false() -> None:
    """What hpclaunch said before the job record of a plain SGD script that resumed
    from its own snapshot of step 10 after run 0 did 13 steps."""
    recorded = json.loads(Path(__file__).with_name("own_resume_recorded.json").read_text())
    out = Said(**{k: v for k, v in recorded.items() if k != "recorded"})
    truth = Truth.parse(notes(resumed=10, last=13, steps=30))
    wrong = falsehoods(truth, out, visible=False)
    said = repr(
        "lost work: run 0 did 13 steps and no checkpoint was written: the next run starts "
        "from step 0 and repeats 13 steps"
    )
    for where in ("status", "--follow", "batch log"):
        assert f"{where}: {said}: run 0 repeated 3, not 13" in wrong, wrong
        assert f"{where}: {said}: the run after 0 resumed from 10" in wrong
        assert f"{where}: {said}: the resume point is unknown; it does not say so" in wrong
    assert "goodput: lost 3.1 s where 0.9 s of steps were redone and the resume point is " in (
        "\n".join(wrong)
    )
    note = repr(f"note: {recorded['status_json']['notes'][1]}")  # 20 steps ... from step 0
    assert [w for w in wrong if "note: 20 steps done" in w] == [
        f"{where}: {note}: the run after 0 resumed from 10" for where in ("status", "status --json")
    ]


def test_true_outputs_pass() -> None:
    assert falsehoods(TRUTH, seen(), visible=True) == []
    assert falsehoods(TRUTH, unseen(), visible=False) == []


def test_a_number_where_none_can_be_known_is_false() -> None:
    wrong = falsehoods(TRUTH, seen(), visible=False)
    assert (
        f"--follow: {('lost work: ' + SEEN)!r}: states a number where it cannot know one" in wrong
    )
    assert "status --json: run 0's repeats is 5: not seen" in wrong
    assert any(w.startswith("goodput: lost 1.6 s") for w in wrong), wrong


def test_unknown_where_the_resume_point_is_seen_is_missing_the_count() -> None:
    wrong = falsehoods(TRUTH, unseen(), visible=True)
    assert f"status: {('lost work: ' + UNSEEN)!r}: does not say the 5 repeated steps" in wrong
    assert "status --json: run 0's repeats is null; it is 5" in wrong


def test_a_wrong_count_or_a_missing_line_is_reported() -> None:
    wrong_count = SEEN.replace("repeated 5 steps", "repeated 6 steps")
    out = said(
        wrong_count,
        {**seen().status_json["lost_work"][0], "repeats": 6},
        {"lost_s": 1.6, "unknown_s": 0.0},
        "lost 2 s",
    )
    wrong = falsehoods(TRUTH, out, visible=True)
    assert f"batch log: {('lost work: ' + wrong_count)!r}: run 0 repeated 5, not 6" in wrong
    assert "status --json: run 0's repeats is 6, not 5" in wrong
    quiet = replace(seen(), follow_text="")
    assert falsehoods(TRUTH, quiet, visible=True) == ["--follow: no lost work: line"]


def test_a_line_said_before_the_resume_is_true_when_the_count_follows() -> None:
    """The batch log says at the next run's start that its resume point is not known yet,
    and once it is, the count: both true. Only the first is not enough."""
    forecast = (
        "supervisor: lost work: run 0 did 45 steps: the step the next run resumes from is "
        "unknown until it resumes (...)"
    )
    both = replace(seen(), batch_log=f"{forecast}\n{seen().batch_log}")
    assert falsehoods(TRUTH, both, visible=True) == []
    alone = replace(seen(), batch_log=forecast)
    assert falsehoods(TRUTH, alone, visible=True) == [
        "batch log: only says the lost work is not known yet, never the count"
    ]


def test_redone_time_counted_as_kept_is_false() -> None:
    kept = {**seen().status_json, "goodput": {"lost_s": 0.0, "unknown_s": 0.0}}
    out = replace(seen(), status_json=kept)
    wrong = falsehoods(TRUTH, out, visible=True)
    assert wrong == [
        "goodput: lost + unknown is 0.0 s: 1.5 s of steps were redone, which the rest "
        "counts as kept"
    ]


def test_durations_read_as_goodput_writes_them() -> None:
    assert seconds("45 s") == 45 and seconds("4 min 18 s") == 258
    assert seconds("2 h 05 min 0 s") == 7500


def test_a_resume_from_the_checkpoint_with_the_same_steps_has_no_problem() -> None:
    assert resume_problems(TRUTH, steps=60, save_every=10, world_size=2) == []


def test_a_resume_from_zero_or_to_other_parameters_is_a_problem() -> None:
    from_zero = Truth.parse(notes(resumed=0))
    assert "run 1 resumed from 0: not a checkpoint of run 0" in resume_problems(
        from_zero, steps=60, save_every=10, world_size=2
    )
    drifted = Truth.parse(notes(drift=1e-3))
    problems = resume_problems(drifted, steps=60, save_every=10, world_size=2)
    assert problems[0] == "run 1 did not start from run 0's step 40"
    assert next(p for p in problems if "parameters differ" in p).startswith("step 41:")
    on_checkpoint = Truth.parse(notes(last=40))
    assert "run 0 ended on a checkpoint: nothing was redone" in resume_problems(
        on_checkpoint, steps=60, save_every=10, world_size=2
    )
    short = resume_problems(TRUTH, steps=61, save_every=10, world_size=4)
    assert "the last run ended at 60, not 61" in short
    assert "run 0: world size 2, not 4" in short
