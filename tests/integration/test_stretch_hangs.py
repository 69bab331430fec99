"""Hangs between steps on the sandbox, each found within the bound of its stretch
(hpclaunch.node.hangs.Bounds): a rank hung inside ``checkpoint.save`` of a sharded save, a
rank hung inside ``load_latest`` after a requeue, a rank that never reaches
``init_process_group`` in a restarted attempt, and a rank hung in the script's own
``hpclaunch.progress.paused()``. examples/train_fsdp.py (2 nodes x 2
workers, FSDP2, sharded checkpoints) injects each; every job ends with the digest of an
uninterrupted run, the hang named in its reports and in ``hpclaunch status``, and no
process left behind (``Job.wait_end``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from hpclaunch.jobdir import attempts, hangs
from hpclaunch.node.hangs import CHECK_S
from hpclaunch.node.stacks import READ_TIMEOUT_S
from hpclaunch.record.job_record import JobRecord
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import CRASH, EXAMPLES, Job, digest_of
from tests.integration.training_jobs import submit as submit_script

pytestmark = pytest.mark.integration

TRAIN = EXAMPLES / "train_fsdp.py"
# Periodic (asynchronous) saves after steps 4, 9, 14, 19, 24 and 29: the same run as
# test_sharded_checkpoint.py's, so the session shares its uninterrupted reference.
STEPS = ("--steps", "30", "--checkpoint-every", "5", "--step-time", "0.15")
BOUND_S = 10  # each test's bound, through its option: a short one, for a short test
# The first step's bound watches every attempt's start, the job's first one too (a user's
# bound): well above a start of four workers (torch's import, gloo) on a busy 2-core box.
FIRST_STEP_BOUND_S = 60
# After the bound: the watch's next look, and the stacks' read (py-spy on 2 busy cores
# can take seconds, then the signal files as long), which the report's time follows.
FOUND_BY_S = BOUND_S + CHECK_S + 2 * READ_TIMEOUT_S


@pytest.fixture(scope="module")
def uninterrupted(reference_digest: Callable[..., str]) -> str:
    return reference_digest(TRAIN, *STEPS)


def submit(sandbox: Running, folder: Path, *args: str, option: str, bound: int = BOUND_S) -> Job:
    return submit_script(sandbox, folder, TRAIN, *STEPS, *args, options=(option, str(bound)))


def hang_line(job: Job) -> dict[str, object]:
    """The HANG line the rank that hung wrote to its stderr just before it hung."""
    [line] = [m.group(1) for m in re.finditer(r"HANG (\{.*\})", job.log)]
    return dict(json.loads(line))


def reports_of(job: Job) -> list[hangs.HangReport]:
    """Every run's hang reports, oldest first."""
    record = JobRecord.read(job.job_dir, 0)
    return [report for run in record.runs.values() for report in run.hangs]


def check_found(
    job: Job, requeue: int, attempt: int, stretch: str, bound: int = BOUND_S
) -> hangs.FirstHung:
    """Both nodes reported the hang of (``requeue``, ``attempt``) in ``stretch`` past
    its bound, within the bound of the rank's hang line (of the attempt's start on the
    node, for its first step), with rank 1's stack in the script that hung; the hang
    began with rank 1."""
    hung = hang_line(job)
    assert hung["rank"] == 1, hung
    record = JobRecord.read(job.job_dir, 0)
    begun = {
        e.node: e.time
        for e in record.runs[requeue].events
        if (e.attempt, e.event) == (attempt, attempts.BEGIN)
    }
    reports = reports_of(job)
    assert sorted((r.requeue, r.attempt, r.node_rank) for r in reports) == [
        (requeue, attempt, 0),
        (requeue, attempt, 1),
    ], reports
    for report in reports:
        assert report.stretch is not None and report.stretch.startswith(stretch), report
        assert report.stretch.endswith(f"(bound {bound} s)") and report.limit_s == bound
        # The stretch began just before the rank's line, the wait for the first step at
        # the attempt's start: found after the bound, not later than the next look and
        # the stacks' read after it.
        if stretch.startswith("with no first step"):
            waited = report.time - begun[report.node]
            assert bound <= waited <= bound + FOUND_BY_S - BOUND_S, (waited, report)
        else:
            waited = report.time - float(str(hung["time"]))
            assert bound - 5 <= waited <= bound + FOUND_BY_S - BOUND_S, (waited, report)
    [first] = hangs.first_hung(reports)
    assert (first.requeue, first.attempt, first.rank) == (requeue, attempt, 1), first
    assert "not waiting in a collective" in first.how and "train_fsdp.py" in first.how
    return first


def test_a_rank_hung_in_a_sharded_save_is_found_within_the_checkpoint_bound(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit(sandbox, tmp_path, "--hang-in-save", "9", option="--checkpoint-timeout")
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    # Restarted in place from step 4's checkpoint: step 9's was never committed.
    starts = [(s["requeue"], s["attempt"], s["step"]) for s in job.lines("START")]
    assert starts == [("0", "0", 0), ("0", "1", 5)], job.log
    assert job.history() == [(0, "completed", "none")]
    check_found(job, 0, 0, "in checkpoint save for ")
    assert re.search(
        rf"hang: +attempt 0: rank 1 on n\d hung in checkpoint save for \d+ s "
        rf"\(bound {BOUND_S} s\), after step \d+ \(not waiting in a collective",
        job.status(),
    ), job.status()
    assert f"(bound {BOUND_S} s); reading their stacks, then restarting them" in job.log


def test_a_rank_hung_in_load_latest_after_a_requeue_is_found_within_the_checkpoint_bound(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit(sandbox, tmp_path, "--hang-in-load", option="--checkpoint-timeout")
    job.wait_checkpoint(9)
    job.run("scontrol", "requeue", str(job.id))
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    # The requeued run's first attempt hung in its load (rank 0 never printed START);
    # its second loaded the stop's checkpoint and finished the run.
    [stopped] = job.lines("STOPPED")
    starts = [(s["requeue"], s["attempt"], s["step"]) for s in job.lines("START")]
    assert starts == [("0", "0", 0), ("1", "1", int(str(stopped["step"])) + 1)], job.log
    assert job.history() == [(0, "requeued by SLURM", "SLURM requeues"), (1, "completed", "none")]
    check_found(job, 1, 0, "in checkpoint load for ")
    assert re.search(
        rf"hang: +run 1, attempt 0: rank 1 on n\d hung in checkpoint load for \d+ s "
        rf"\(bound {BOUND_S} s\)(, after step \d+)? \(not waiting in a collective",
        job.status(),
    ), job.status()


def test_a_restarted_attempt_that_never_steps_is_found_within_the_first_step_bound(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    # Rank 3 crashes at step 12; in the restarted attempt rank 1 never reaches
    # init_process_group, and the others wait for it there.
    hang = ("--hang-before-init", "1")
    job = submit(
        sandbox, tmp_path, *CRASH, *hang, option="--first-step-timeout", bound=FIRST_STEP_BOUND_S
    )
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    starts = [(s["requeue"], s["attempt"], s["step"]) for s in job.lines("START")]
    assert starts == [("0", "0", 0), ("0", "2", 10)], job.log
    assert job.history() == [(0, "completed", "none")]
    check_found(job, 0, 1, "with no first step for ", FIRST_STEP_BOUND_S)
    assert re.search(
        rf"hang: +attempt 1: rank 1 on n\d hung with no first step for \d+ s "
        rf"\(bound {FIRST_STEP_BOUND_S} s\) \(not waiting in a collective",
        job.status(),
    ), job.status()


def test_a_rank_hung_in_the_scripts_pause_is_found_within_the_pause_bound(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    # After step 12 every rank evaluates in hpclaunch.progress.paused(); rank 1 hangs
    # there, the others wait for it in a barrier. Step 9's checkpoint is committed.
    job = submit(sandbox, tmp_path, "--hang-in-pause", "12", option="--pause-timeout")
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    starts = [(s["requeue"], s["attempt"], s["step"]) for s in job.lines("START")]
    assert starts == [("0", "0", 0), ("0", "1", 10)], job.log
    check_found(job, 0, 0, "in a pause (hpclaunch.progress.paused) for ")
    assert re.search(
        rf"hang: +attempt 0: rank 1 on n\d hung in a pause \(hpclaunch.progress.paused\) for "
        rf"\d+ s \(bound {BOUND_S} s\), after step \d+ \(not waiting in a collective",
        job.status(),
    ), job.status()
