"""What a user following a job sees of its training, on the sandbox: the step out of how
many, the rate, the time left and the loss in ``status --follow``; why the worker group
restarted in place (rank, node, error, attempts numbered from 0); and, when a run is
requeued after steps its last checkpoint does not hold, how many steps the next run
repeats, the same number in ``status``, ``--follow`` and the batch log, as the next run
showed it resumed."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.integration.helpers import VENV_BIN, wait_for
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import CRASH, EXAMPLES, Job, end_with_a_lost_node, submit

pytestmark = pytest.mark.integration

TRAIN = EXAMPLES / "train.py"
PROGRESS = re.compile(
    r"^progress: step (\d+) of 80 \(\d+ %\), [\d.]+ steps/s, ETA (\d+ s|\d+ min \d\d s); "
    r"loss [-+\d.e]+ \(attempt (\d), noted \d+ s ago\)$"
)


def follow(job: Job) -> subprocess.Popen[str]:
    """``hpclaunch status --follow`` of ``job``, started now and left to end by itself."""
    argv = [
        str(VENV_BIN / "hpclaunch"),
        "status",
        "--follow",
        "--job-dir",
        str(job.job_dir),
        str(job.id),
    ]
    return subprocess.Popen(
        argv,
        cwd=job.folder,
        env=job.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def followed(follower: subprocess.Popen[str]) -> list[str]:
    """What it printed, each line without its ``[HH:MM:SS] job N: `` prefix."""
    out, _ = follower.communicate(timeout=60)  # the job has ended: it stops by itself
    print(out)  # for the test's report when it fails
    return [re.sub(r"^\[\d\d:\d\d:\d\d\] job \d+: ", "", line) for line in out.splitlines()]


def test_follow_shows_progress_eta_loss_and_why_the_group_restarted(
    sandbox: Running, tmp_path: Path
) -> None:
    job = submit(
        sandbox,
        tmp_path,
        TRAIN,
        "--steps",
        "80",
        "--step-time",
        "0.3",
        "--checkpoint-every",
        "5",
        *CRASH,
    )
    follower = follow(job)
    assert job.wait_end() == "COMPLETED", job.log
    lines = followed(follower)
    shown = [m for m in map(PROGRESS.match, lines) if m]
    assert shown, lines
    # The restart is said once, with its cause: rank 3's own error, on its node.
    restarts = [line for line in lines if line.startswith("worker group restarted")]
    assert len(restarts) == 1, lines
    assert re.fullmatch(
        r"worker group restarted in place: attempt 1 began after attempt 0 failed: "
        r"rank 3 on n\d: rank 3: crashing at step 12",
        restarts[0],
    ), restarts
    # Never a flood: at most one progress line per 30 s of stepping, plus the attempts'.
    assert len(shown) <= 4, lines
    final = job.status()
    assert re.search(r"progress: +step 80 of 80 \(100 %\)", final), final
    assert re.search(r"restart: +attempt 1 began after attempt 0 failed: rank 3 on n\d", final)


def status_json(job: Job) -> dict[str, object]:
    argv = [
        str(VENV_BIN / "hpclaunch"),
        "status",
        "--json",
        "--job-dir",
        str(job.job_dir),
        str(job.id),
    ]
    done = subprocess.run(
        argv, cwd=job.folder, env=job.env, capture_output=True, text=True, check=True
    )
    data: dict[str, object] = json.loads(done.stdout)
    return data


def stepped(job: Job) -> int:
    """The job's steps done, as ``status --json`` has them noted."""
    training = status_json(job).get("training")
    return int(training["step"]) if isinstance(training, dict) else 0


def test_a_requeue_says_how_many_steps_the_next_run_repeats(
    sandbox: Running, tmp_path: Path
) -> None:
    # Checkpoints at steps 149 and 299 only; the node is killed once a step after 149's
    # checkpoint is noted (the agents note every 10 s: at most ~50 steps after it), ~20 s
    # of steps before the next one, so the run ends between the two, never on one.
    job = submit(
        sandbox,
        tmp_path,
        TRAIN,
        "--steps",
        "300",
        "--step-time",
        "0.2",
        "--checkpoint-every",
        "150",
    )
    follower = follow(job)
    job.wait_checkpoint(149)
    wait_for(lambda: stepped(job) > 150, timeout_s=60, what=f"job {job.id} past step 150")
    state, _ = end_with_a_lost_node(sandbox, job)
    assert state == "COMPLETED", job.log
    lines = followed(follower)
    said = [line for line in lines if line.startswith("lost work: run 0 did ")]
    assert len(said) == 1, lines
    # Said once run 1 has shown where it resumed: a fact, not a forecast.
    found = re.fullmatch(
        r"lost work: run 0 did (\d+) steps; run 1 resumed from step (\d+) \(its hpclaunch "
        r"checkpoint\): it repeated (\d+) steps?",
        said[0],
    )
    assert found, said
    steps, holds, repeats = map(int, found.groups())
    assert holds == 150 and repeats == steps - holds > 0, said
    text = said[0].removeprefix("lost work: ")
    assert f"lost work:       {text}" in job.status()
    # The batch log says it too: at run 1's start from the checkpoint run 0 left, at its
    # end as run 1 showed it.
    forecast = (
        f"supervisor: lost work: run 0 did {steps} steps; its last checkpoint (step 149) "
        f"holds 150: a run that resumes from it repeats {repeats} steps"
    )
    assert forecast in job.log and f"supervisor: lost work: {text}" in job.log, job.log
    [loss] = status_json(job)["lost_work"]  # type: ignore[misc]
    assert (loss["requeue"], loss["repeats"], loss["resumed"]) == (0, repeats, holds)
    assert loss["resumed_by"] == "checkpoint" and loss["final"]
    # The resumed run started where the checkpoint left off: what was said is what it did.
    assert [s["step"] for s in job.lines("START")] == [0, holds]
