"""hpclaunch.Executor on the sandbox: functions run on every rank of multi-node
jobs submitted through submitit's interface, with real SLURM and real torch."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from submitit.core.utils import FailedJobError, UncompletedJobError

import hpclaunch
from hpclaunch.ops import registry
from tests.integration import executor_jobs
from tests.integration.helpers import VENV_BIN, wait_for
from tests.integration.sandbox_fixture import Running

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def on_sandbox(sandbox: Running, monkeypatch: pytest.MonkeyPatch) -> Iterator[Running]:
    """This process talks to the sandbox, from the repository root (the folder the
    jobs run in, so that their workers import tests.integration.executor_jobs)."""
    for key, value in sandbox.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{VENV_BIN}:{sandbox.env['PATH']}")
    monkeypatch.chdir(ROOT)
    yield sandbox


def executor(folder: Path, **params: object) -> hpclaunch.Executor:
    params = {"nodes": 2, "nproc_per_node": 2, "max_restarts": 0, **params}
    return hpclaunch.Executor(folder, **params)


def scontrol(job_id: str, env: dict[str, str] | None = None) -> dict[str, str]:
    from hpclaunch.slurm.commands import parse_show_job

    out = subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True, env=env
    ).stdout
    return parse_show_job(out)


def test_a_two_node_function_job_returns_rank_zeros_value(
    on_sandbox: Running, tmp_path: Path
) -> None:
    job = executor(tmp_path).submit(executor_jobs.all_reduce, 10.0)
    result = job.result()
    assert result["rank"] == 0 and result["world_size"] == 4 and result["local_world_size"] == 2
    assert result["sum"] == 0 + 1 + 2 + 3 + 4 * 10.0
    assert len(set(result["hosts"])) == 2, result["hosts"]  # two ranks on each of two nodes
    every = job.results()  # every rank's value, in rank order, as submitit's tasks give
    assert [r["rank"] for r in every] == [0, 1, 2, 3] and every[0] == result, every
    # The result is there before SLURM has closed the job.
    wait_for(
        lambda: job.get_info(mode="force").get("State") == "COMPLETED",
        timeout_s=60,
        what="the job's end",
    )
    log = job.rank_log(3)
    assert log is not None and log.parent.name == "attempt-0"
    assert job.stdout() is not None and "supervisor: job completed" in job.stdout()
    noted = registry.find(on_sandbox.env, int(job.job_id))  # in `hpclaunch list` too
    assert noted is not None and noted.job_dir == str(job.job_dir) and noted.name == "all_reduce"


def test_a_failing_function_raises_the_failing_ranks_traceback(
    on_sandbox: Running, tmp_path: Path
) -> None:
    job = executor(tmp_path).submit(executor_jobs.fail_on, 3)
    with pytest.raises(FailedJobError) as raised:
        job.result()
    message = str(raised.value)
    assert "root cause: rank 3" in message
    assert "ValueError: rank 3 cannot go on" in message
    assert 'executor_jobs.py", line' in message  # the remote traceback, not just the message
    assert job.state == "FAILED"
    assert "[rank3] ValueError: rank 3 cannot go on" in (job.stderr() or ""), job.stderr()


def test_a_group_restarted_in_place_still_returns(on_sandbox: Running, tmp_path: Path) -> None:
    job = executor(tmp_path / "jobs", max_restarts=1).submit(
        executor_jobs.fail_once, str(tmp_path / "failed-once")
    )
    wait_for(job.done, timeout_s=180, what="the job's end")
    result = job.result()
    assert result["rank"] == 0
    # Node 2's agent restarted its workers after their failure, node 1's after the
    # new round: their counts differ, yet rank 0 saw every rank return.
    assert result["restart_counts"] == [0, 0, 1, 1], result
    assert job.rank_log(3) is not None and job.rank_log(3).parent.name != "attempt-0"
    assert not list((tmp_path / "jobs").glob(".*_finished"))  # cleaned up on success


def test_a_requeued_job_resumes_from_its_checkpoint_and_returns_the_right_value(
    on_sandbox: Running, tmp_path: Path
) -> None:
    steps = 40
    job = executor(tmp_path).submit(executor_jobs.count_to, steps, 0.1)
    wait_for(
        lambda: (job.job_dir / "checkpoints" / f"step-{5:012d}.pt").exists(),
        timeout_s=120,
        what="the checkpoint of step 5",
    )
    subprocess.run(["scontrol", "requeue", job.job_id], check=True)
    result = job.result()
    assert result["total"] == sum(range(steps))
    assert result["requeue"] == 1 and result["world_size"] == 4
    assert 5 < result["started_at"] < steps, result  # resumed, not started over
    assert scontrol(job.job_id)["Restarts"] == "1"


def test_a_submitit_checkpointable_callable_is_requeued_with_its_state(
    on_sandbox: Running, tmp_path: Path
) -> None:
    progress = tmp_path / "progress"
    job = executor(tmp_path).submit(executor_jobs.Counter(), 30, 0.2, str(progress))
    wait_for(
        lambda: progress.exists() and int(progress.read_text() or 0) >= 4,
        timeout_s=120,
        what="the callable's step 4",
    )
    subprocess.run(["scontrol", "requeue", job.job_id], check=True)
    result = job.result()
    assert result["requeue"] == 1
    assert result["done"] == list(range(30))
    assert result["first"] >= 4, result  # checkpoint() carried rank 0's state over


@pytest.mark.parametrize("timeout", [False, True], ids=["preemption", "timeout"])
def test_submitits_interrupt_requeues_a_checkpointable_callable(
    on_sandbox: Running, tmp_path: Path, timeout: bool
) -> None:
    """submitit's documented way to try checkpointing: ``job._interrupt()`` signals the
    job's steps only (SIGTERM then SIGUSR2 for a preemption, SIGUSR2 for a timeout)."""
    progress = tmp_path / "progress"
    job = executor(tmp_path).submit(executor_jobs.Counter(), 30, 0.2, str(progress))
    wait_for(
        lambda: progress.exists() and int(progress.read_text() or 0) >= 4,
        timeout_s=120,
        what="the callable's step 4",
    )
    job._interrupt(timeout=timeout)
    result = job.result()
    assert result["requeue"] == 1 and result["done"] == list(range(30)), result
    assert result["first"] >= 4, result
    assert scontrol(job.job_id)["Restarts"] == "1"


def test_an_array_of_three_two_node_jobs_completes(on_sandbox: Running, tmp_path: Path) -> None:
    ex = executor(tmp_path, array_parallelism=2)
    jobs = ex.map_array(executor_jobs.all_reduce, [1.0, 2.0, 3.0])
    assert [j.job_id.split("_")[1] for j in jobs] == ["0", "1", "2"]
    assert len({j.job_id.split("_")[0] for j in jobs}) == 1  # one SLURM array
    array_task = scontrol(jobs[0].job_id)
    assert array_task.get("ArrayTaskThrottle") == "2"
    results = [j.result() for j in jobs]
    assert [r["sum"] for r in results] == [6 + 4 * x for x in (1.0, 2.0, 3.0)]
    assert all(r["world_size"] == 4 and len(set(r["hosts"])) == 2 for r in results)
    assert len({j.slurm_job_id for j in jobs}) == 3


def test_cancel_ends_the_job_without_a_requeue(on_sandbox: Running, tmp_path: Path) -> None:
    job = executor(tmp_path).submit(executor_jobs.count_to, 200, 0.1)
    wait_for(
        lambda: (job.job_dir / "checkpoints" / f"step-{2:012d}.pt").exists(),
        timeout_s=120,
        what="the checkpoint of step 2",
    )
    job.cancel()
    with pytest.raises(UncompletedJobError, match="CANCELLED"):
        job.result()
    assert scontrol(job.job_id)["Restarts"] == "0"


def test_bad_parameters_fail_before_anything_is_submitted(
    on_sandbox: Running, tmp_path: Path
) -> None:
    with pytest.raises(hpclaunch.SpecError, match=r"update_parameters\(nodes=\.\.\.\)"):
        executor(tmp_path, nodes="3:2")
    ex = executor(tmp_path)
    with pytest.raises(hpclaunch.SpecError, match="'nodez'; did you mean 'nodes'"):
        ex.update_parameters(nodez=2)
    assert ex.spec.nodes.max == 2  # unchanged
    assert not [p for p in tmp_path.iterdir()]  # no pickle, no script, no job


def test_a_log_dir_that_cannot_be_made_stops_the_submission(
    on_sandbox: Running, tmp_path: Path
) -> None:
    ex = executor(tmp_path, log_dir="/proc/hpclaunch-logs")
    with pytest.raises(hpclaunch.ExecutorError, match=r"log_dir '/proc/hpclaunch-logs'.*cannot"):
        ex.submit(executor_jobs.all_reduce, 1.0)
    with pytest.raises(hpclaunch.ExecutorError, match=r"one string.*\['--steps', '3'\]"):
        executor(tmp_path).submit_script(__file__, "--steps 3")
    assert not [p for p in tmp_path.iterdir()]  # no pickle, no submission file, no job
