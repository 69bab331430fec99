"""Fault tolerance end to end on the sandbox: examples/train.py interrupted in each way
ends with exactly the digest of an uninterrupted run, with the expected restarts and
requeues, and leaves no process of the job behind."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from hpclaunch import procs
from hpclaunch.sandbox.cluster import NodeAction
from hpclaunch.sandbox.conf import Mode
from hpclaunch.slurm.hostlist import expand
from tests.integration.helpers import wait_for
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import (
    CRASH,
    ENDED,
    EXAMPLES,
    HIGH_JOB,
    Job,
    check_restarted_in_place,
    digest_of,
    end_with_a_lost_node,
)
from tests.integration.training_jobs import submit as submit_script

pytestmark = pytest.mark.integration

TRAIN = EXAMPLES / "train.py"
STEPS = ("--steps", "30", "--checkpoint-every", "5", "--step-time", "0.15")
# For a run interrupted after step 9's checkpoint: its 20 steps left take >= 8 s, so the
# interruption (a signal through the controller, a scheduler pass) lands well before it
# could end by itself. The step time only sleeps: the digest is that of STEPS.
INTERRUPTIBLE = ("--step-time", "0.4")


def submit(
    sandbox: Running,
    folder: Path,
    *args: str,
    partition: str | None = None,
    options: tuple[str, ...] = (),
) -> Job:
    """examples/train.py on 2 nodes x 2 workers, 30 steps; ``args`` override STEPS."""
    return submit_script(
        sandbox, folder, TRAIN, *STEPS, *args, partition=partition, options=options
    )


@pytest.fixture(scope="module")
def uninterrupted(reference_digest: Callable[..., str]) -> str:
    """The digest of a run that nothing interrupts."""
    return reference_digest(TRAIN, *STEPS)


def test_a_worker_crash_is_restarted_in_place(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    check_restarted_in_place(submit(sandbox, tmp_path, *CRASH), uninterrupted)


# What each interruption leaves in the history of the run it stopped.
INTERRUPTED = {
    "scontrol requeue": ("requeued by SLURM", "SLURM requeues"),
    "time-limit warning": ("time limit", "requeue"),
    "preemption": ("requeued by SLURM", "SLURM requeues"),
    # Sent to the steps only, as submitit's job._interrupt() does: the supervisor gets
    # nothing and reads the signal from the agents' notes (hpclaunch.recovery.stops).
    "a warning to the steps": ("time limit", "requeue"),
    "SIGTERM to the steps": ("steps stopped", "requeue"),
}


@pytest.mark.parametrize("how", list(INTERRUPTED))
def test_an_interrupted_job_is_requeued_once_and_resumes(
    sandbox: Running, tmp_path: Path, uninterrupted: str, how: str
) -> None:
    job = submit(sandbox, tmp_path, *INTERRUPTIBLE)
    job.wait_checkpoint(9)
    interrupt = {
        "scontrol requeue": ("scontrol", "requeue", str(job.id)),
        "time-limit warning": ("scancel", "--signal=USR1", "--batch", str(job.id)),
        # A job of the high partition that needs every node whole preempts (requeues) this one.
        "preemption": ("sbatch", "-p", "high", "-N4", "--exclusive", *HIGH_JOB),
        "a warning to the steps": ("scancel", "--signal=USR2", str(job.id)),
        "SIGTERM to the steps": ("scancel", "--signal=TERM", str(job.id)),
    }
    job.run(*interrupt[how])
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    starts = job.lines("START")
    assert [s["requeue"] for s in starts] == ["0", "1"]
    assert int(str(starts[1]["step"])) >= 10  # resumed, not restarted from scratch
    assert job.fields()["Restarts"] == "1"
    assert job.history() == [(0, *INTERRUPTED[how]), (1, "completed", "none")]


def test_a_lost_node_requeues_the_job_onto_the_others(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit(sandbox, tmp_path, *INTERRUPTIBLE)
    job.wait_checkpoint(9)
    state, lost = end_with_a_lost_node(sandbox, job)
    assert state == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    assert job.fields()["Restarts"] == "1"
    assert job.history() == [(0, "requeued by SLURM", "SLURM requeues"), (1, "completed", "none")]
    runs = json.loads((job.job_dir / "history.json").read_text())["runs"]
    assert lost in expand(runs[0]["nodes"]) and lost not in expand(runs[1]["nodes"])
    # The supervisor kept the lost node out of the next run, as it does bad nodes.
    assert runs[0]["excluded"] == [lost] and job.fields()["ExcNodeList"] == lost
    assert runs[0]["error"] == f"node lost ({lost} down or not responding)"
    starts = job.lines("START")
    assert [s["requeue"] for s in starts] == ["0", "1"] and int(str(starts[1]["step"])) >= 5


def test_a_partitioned_batch_host_healed_leaves_every_run_in_the_history(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    """The batch host is cut off the network: SLURM requeues the job onto the other
    nodes, where it completes, while the old supervisor goes on running on the cut-off
    host. Healed, that stale supervisor neither requeues the job nor rewrites the
    history: it holds both runs, the first closed as lost."""
    if sandbox.layout.mode is not Mode.NETNS:
        pytest.fail("this machine allows network namespaces as root, so the sandbox must use them")
    job = submit(sandbox, tmp_path)
    job.wait_checkpoint(9)
    host = expand(job.fields()["NodeList"])[0]  # the batch step's node
    sandbox.box.cut_node(host)
    try:
        # SLURM would mark it DOWN after its timeouts (~25 s): do it now.
        sandbox.box.set_node_state(host, NodeAction.DOWN, "test: partitioned")
        wait_for(lambda: job.fields()["JobState"] in ENDED, timeout_s=180, what="run 1's end")
    finally:
        sandbox.box.cut_node(host, heal=True)
        sandbox.box.set_node_state(host, NodeAction.RESUME, "test: healed")
    # The old run's processes on the healed host end once its slurmd registers again and
    # SLURM tells it the job is no longer there: that can take longer than wait_end waits.
    entry = f"SLURM_JOB_ID={job.id}".encode()
    wait_for(
        lambda: not procs.with_environ(entry),
        timeout_s=120,
        what="the old run on the healed host to end",
    )
    assert job.wait_end() == "COMPLETED", job.log
    assert job.history() == [(0, "lost", "SLURM requeues"), (1, "completed", "none")], job.log
    assert digest_of(job) == uninterrupted
    assert ": requeueing the job (requeue" not in job.log  # the supervisor's own requeue
    # Healed, the old supervisor got SLURM's SIGTERM, saw run 1 and left the history as it was.
    assert "recorded this run as 'lost'; not overwriting the history" in job.log
    runs = json.loads((job.job_dir / "history.json").read_text())["runs"]
    assert host in expand(runs[0]["nodes"]) and host not in expand(runs[1]["nodes"])


def test_a_bad_node_is_kept_out_of_the_requeued_job(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    bad = "n2"  # its workers exit 4 at their first step, as on a broken GPU
    job = submit(sandbox, tmp_path, "--bad-node", bad, options=("--max-restarts", "1"))
    assert job.wait_end() == "COMPLETED", job.log
    runs = json.loads((job.job_dir / "history.json").read_text())
    first, second = (expand(run["nodes"]) for run in runs["runs"])
    assert bad in first, f"SLURM did not give the job {bad} first: {first}"
    assert bad not in second
    assert job.history() == [(0, "bad nodes", "requeue"), (1, "completed", "none")]
    assert runs["excluded_nodes"] == [bad]
    assert job.fields()["ExcNodeList"] == bad and job.fields()["Restarts"] == "1"
    assert digest_of(job) == uninterrupted
    assert "supervisor: failure records: errors on some nodes only n2" in job.log
    assert job.log.count(f"hpclaunch: job {job.id} failed on node 1 (n2)") == 1


@pytest.mark.slow
def test_a_real_time_limit_warning_requeues_and_resumes(sandbox: Running, tmp_path: Path) -> None:
    """SLURM's own warning (--signal=B:USR1@60 in a 2-minute job), which comes up to
    a minute early; the training needs about 75 s, so at least one run is cut short."""
    steps = ("--steps", "500", "--checkpoint-every", "25")
    reference = submit(sandbox, tmp_path / "reference", *steps, "--step-time", "0")
    assert reference.wait_end() == "COMPLETED", reference.log
    job = submit(
        sandbox,
        tmp_path / "limited",
        *steps,
        "--step-time",
        "0.15",
        # Each run trains 35-60 s before SLURM's once-a-minute check sends the warning;
        # on a loaded machine (CI's workers side by side) a step takes twice its 0.15 s,
        # and four runs did not reach step 500: the headroom keeps the verdict about the
        # resume, not the machine's speed.
        options=("--time", "2", "--signal-lead", "60", "--max-requeues", "8"),
    )
    wait_for(lambda: job.fields()["JobState"] in ENDED, timeout_s=600, what=f"job {job.id}")
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job, last=True) == digest_of(reference)
    history = job.history()
    assert len(history) >= 2 and history[-1] == (len(history) - 1, "completed", "none")
    assert all(run[1:] == ("time limit", "requeue") for run in history[:-1])
    starts = job.lines("START")
    assert [int(str(s["step"])) > 0 for s in starts] == [False] + [True] * (len(starts) - 1)


def test_the_same_error_everywhere_fails_without_requeue(sandbox: Running, tmp_path: Path) -> None:
    job = submit(sandbox, tmp_path, "--fail-at", "3")
    assert job.wait_end() == "FAILED"
    assert job.fields()["Restarts"] == "0"
    assert job.history() == [(0, "the same error on every node", "none")]
    assert "ValueError: bad value at step 3" in job.log
    assert job.log.count("root cause: rank") == 1  # one block for the job, not one per node
    # A bug fails the job at once: one attempt, not four of the same traceback.
    assert [s["attempt"] for s in job.lines("START")] == ["0"], job.log
    assert "a bug in the script, which restarting would not mend" in job.log


@pytest.mark.parametrize("stuck", [False, True])
def test_scancel_never_requeues(sandbox: Running, tmp_path: Path, stuck: bool) -> None:
    """A cancelled job is said cancelled everywhere. With a rank stuck in the checkpoint
    it writes on the signal, the agents outlast SLURM's KillWait: srun then exits 0
    ("Timed out waiting for job step to complete"), which once made the supervisor say
    "job completed", or SLURM kills the supervisor before srun returns, which once left
    the run's end unrecorded. The supervisor records the cancel at SLURM's signal (what
    it makes of srun's 0 when it lives to see it: tests/unit/test_stops.py)."""
    job = submit(sandbox, tmp_path, *INTERRUPTIBLE, *(("--hang-when-stopping", "1") * stuck))
    job.wait_checkpoint(4)
    job.run("scancel", str(job.id))
    assert job.wait_end() == "CANCELLED"
    assert job.fields()["Restarts"] == "0"
    assert job.history() == [(0, "cancelled", "none")], job.log
    assert (
        "supervisor: SIGTERM without a requeue (SLURM's Restarts is still 0): recorded as "
        "cancelled now"
    ) in job.log
    assert "job completed" not in job.log
    if not stuck:  # srun returns well within KillWait: the supervisor decides as well
        assert "supervisor: the job ends: cancelled" in job.log
    shown = job.status()
    assert shown.startswith(f"job {job.id} (train): CANCELLED\n"), shown
    assert ": cancelled -> none" in shown, shown


def test_a_rank_that_exits_0_early_is_named_not_its_peers(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    """Rank 3 calls sys.exit(0) at step 12 while the others train on: they fail on the
    closed connection, the group restarts in place from step 9's checkpoint, and the
    restart names rank 3's early exit, not the peer that saw the connection close."""
    job = submit(sandbox, tmp_path, *CRASH, "--crash-code", "0")
    check_restarted_in_place(job, uninterrupted)
    restart = re.compile(
        r"restart: +attempt 1 began after attempt 0 failed: "
        r"rank 3 on n\d: exited 0 at step 12 while the others trained on$",
        re.MULTILINE,
    )
    assert restart.search(job.status()), job.status()
    records = sorted((job.job_dir / "failures" / "requeue-0" / "attempt-0").glob("node-*.json"))
    workers = [w for path in records for w in json.loads(path.read_text())["workers"]]
    assert {
        "rank": 3,
        "exitcode": 0,
        "message": "exited 0 at step 12 while the others trained on",
    } in workers
    assert all(w["exitcode"] != 0 for w in workers if w["rank"] != 3), workers
