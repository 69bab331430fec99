"""Hangs on the sandbox, found by hpclaunch's hang watch (hpclaunch.node.hangs) from the
workers' own progress reports, with no change to the training script: examples/train.py
(2 nodes x 2 workers) with one rank that stops or sleeps ends with the digest of an
uninterrupted run after one restart in place, with every rank's stacks in the job folder
and the rank that hung named; a node that hangs every time is kept out of a requeue;
scripts that report no progress, or take long before their first step, are left alone."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from hpclaunch.jobdir import hangs
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.node.hangs import CHECK_S
from hpclaunch.node.stacks import READ_TIMEOUT_S
from hpclaunch.record.job_record import JobRecord
from hpclaunch.slurm.hostlist import expand
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import (
    EXAMPLES,
    Job,
    check_restarted_in_place,
    digest_of,
)
from tests.integration.training_jobs import submit as submit_script

pytestmark = pytest.mark.integration

TRAIN = EXAMPLES / "train.py"
STEPS = ("--steps", "30", "--checkpoint-every", "5", "--step-time", "0.15")
TIMEOUT_S = 5
WATCH = ("--hang-timeout", str(TIMEOUT_S))


def submit(sandbox: Running, folder: Path, *args: str, options: tuple[str, ...] = ()) -> Job:
    return submit_script(sandbox, folder, TRAIN, *STEPS, *args, options=(*WATCH, *options))


@pytest.fixture(scope="module")
def uninterrupted(reference_digest: Callable[..., str]) -> str:
    return reference_digest(TRAIN, *STEPS)


def hang_line(job: Job) -> dict[str, float]:
    """The HANG line the rank that hung wrote to its stderr just before it hung."""
    [line] = [m.group(1) for m in re.finditer(r"HANG (\{.*\})", job.log)]
    return dict(json.loads(line))


def all_hangs(job_dir: Path) -> list[hangs.HangReport]:
    """Every run's hang reports, oldest first."""
    record = JobRecord.read(job_dir, 0)
    return [report for run in record.runs.values() for report in run.hangs]


def check_one_restart(job: Job, uninterrupted: str) -> list[hangs.HangReport]:
    """The job ended as an uninterrupted run, after one restart in place from step 10;
    both nodes reported the hang of attempt 0, with the stacks of all their ranks."""
    check_restarted_in_place(job, uninterrupted)  # as after a crash: the same digest
    reports = all_hangs(job.job_dir)
    assert sorted((r.attempt, r.node_rank) for r in reports) == [(0, 0), (0, 1)], reports
    for report in reports:
        stacks = hangs.from_sections(Path(report.stacks).read_text())
        assert sorted(stacks) == sorted(r.rank for r in report.ranks) and len(stacks) == 2
        assert all("train.py" in text for text in stacks.values()), stacks
    return reports


def test_a_stopped_worker_is_found_and_restarted_in_place(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit(sandbox, tmp_path, "--hang-rank", "3", "--hang-at", "12", "--hang-how", "stop")
    reports = check_one_restart(job, uninterrupted)
    stopped = hang_line(job)
    [named] = [r for r in reports if r.culprits]
    assert named.culprits == (3,) and "stopped" in named.how
    # Found within the timeout, the watch's look and the stacks' read (which the report's
    # time follows: py-spy on 2 busy cores can take seconds, then the signal files as
    # long), not gloo's 30 min: the node of the stopped rank by its state, the other by
    # its ranks' missing progress.
    found_by = TIMEOUT_S + CHECK_S + 2 * READ_TIMEOUT_S
    assert all(r.time - stopped["time"] <= found_by for r in reports), reports
    [first] = hangs.first_hung(reports)
    assert (first.rank, first.step) == (3, 12)
    assert "rank 3 on" in job.status() and "hung after step 12" in job.status()


def test_a_rank_asleep_in_its_loop_is_the_one_named(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit(sandbox, tmp_path, "--hang-rank", "2", "--hang-at", "12", "--hang-how", "sleep")
    reports = check_one_restart(job, uninterrupted)
    assert hang_line(job)["rank"] == 2
    [named] = [r for r in reports if r.culprits]
    assert named.culprits == (2,) and "not waiting in a collective" in named.how
    seen = {s.rank: s for r in reports for s in r.ranks}
    assert [rank for rank, s in sorted(seen.items()) if s.waiting] == [0, 1, 3]
    assert "hang" in seen[2].where and "train.py" in seen[2].where
    status = job.status()
    assert re.search(r"hang: +attempt 0: rank 2 on n\d hung after step 12", status), status
    assert "3 of the 4 ranks read waited in a collective" in status


# Reports no progress: no torch optimizer, no hpclaunch.progress.beat(); runs for
# longer than the timeout, with a first stretch longer than it too.
NO_PROGRESS = """\
import time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
time.sleep(8)
value = torch.ones(1)
for step in range(40):
    dist.all_reduce(value)
    time.sleep(0.2)
dist.barrier()
"""

# Steps an optimizer, but its first step comes only after a long start (data loading).
SLOW_START = """\
import time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
time.sleep(10)
for step in range(20):
    model(torch.ones(4)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.1)
dist.barrier()
"""


def test_no_progress_reports_and_a_long_first_step_are_not_hangs(
    sandbox: Running, tmp_path: Path
) -> None:
    jobs = []
    for name, text in (("no_progress", NO_PROGRESS), ("slow_start", SLOW_START)):
        script = tmp_path / f"{name}.py"
        script.write_text(text)
        jobs.append(submit_script(sandbox, tmp_path / name, script, options=WATCH))
    for job in jobs:
        assert job.wait_end() == "COMPLETED", job.log
        assert all_hangs(job.job_dir) == []
        assert "hung" not in job.log
        attempts = JobFolder(job.job_dir).attempts()
        assert [(a.requeue, a.attempt) for a in attempts] == [(0, 0)]
    # The one that steps reported its progress; the other had none to report. Its line
    # says "no step for N s" once its last step is 30 s old (the other job, or a busy
    # machine, can keep this look that long after its end).
    assert "progress:" not in jobs[0].status()
    status = jobs[1].status()
    assert re.search(
        r"progress: +step 20, (no step for \d+ s, )?[\d.]+ steps/s \(attempt 0, noted", status
    ), status


def test_a_node_that_hangs_every_time_is_kept_out_of_the_requeue(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    hanging = "n2"  # its first worker sleeps at step 12 on every attempt
    job = submit(sandbox, tmp_path, "--hang-node", hanging, "--hang-at", "12")
    assert job.wait_end() == "COMPLETED", job.log
    runs = json.loads((job.job_dir / "history.json").read_text())
    first, second = (expand(run["nodes"]) for run in runs["runs"])
    assert hanging in first, f"SLURM did not give the job {hanging} first: {first}"
    assert hanging not in second and runs["excluded_nodes"] == [hanging]
    assert job.history() == [(0, "bad nodes", "requeue"), (1, "completed", "none")]
    assert digest_of(job) == uninterrupted
    # Two hangs on the first run, each begun on the hanging node; then no more restarts.
    named = [(f.requeue, f.attempt, f.node) for f in hangs.first_hung(all_hangs(job.job_dir))]
    assert named == [(0, 0, hanging), (0, 1, hanging)]
    assert "hangs began on this node 2 times: not restarting its workers again" in job.log
    assert f"supervisor: failure records: errors on some nodes only {hanging}" in job.log


def test_a_hang_in_the_checkpoint_after_a_stop_signal_ends_in_a_requeue(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    # The agents give the workers 3/4 of the signal lead (15 s) to save and exit after
    # the time-limit warning; rank 3 stops instead, the others wait for it in the save.
    # Steps of 0.4 s: the warning lands well before the 20 steps after step 9 could end it.
    job = submit(
        sandbox,
        tmp_path,
        "--hang-when-stopping",
        "3",
        "--step-time",
        "0.4",
        options=("--signal-lead", "20"),
    )
    job.wait_checkpoint(9)
    job.run("scancel", "--signal=USR1", "--batch", str(job.id))
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    assert hang_line(job)["rank"] == 3
    assert "workers still running 15 s after SIGUSR1; sending SIGKILL" in job.log
    starts = job.lines("START")
    assert [s["requeue"] for s in starts] == ["0", "1"] and int(str(starts[1]["step"])) >= 10
    assert job.history() == [(0, "time limit", "requeue"), (1, "completed", "none")]
