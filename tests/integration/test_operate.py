"""`hpclaunch status`, `logs`, `cancel`, `list` and `sbatch --follow` on the sandbox,
against real jobs of examples/train.py: running, requeued, completed, failed and
cancelled. The output fields are checked, not just exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import VENV_BIN, wait_for
from tests.integration.sandbox_fixture import Running

pytestmark = pytest.mark.integration

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"
STEPS = ("--steps", "30", "--checkpoint-every", "5", "--step-time", "0.15")


@dataclass
class Cli:
    folder: Path
    env: dict[str, str]
    started: list[subprocess.Popen[str]] = field(default_factory=list)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(VENV_BIN / "hpclaunch"), *args]
        done = subprocess.run(
            argv, cwd=self.folder, env=self.env, capture_output=True, text=True, check=False
        )
        if check:
            assert done.returncode == 0, done.stderr
        return done

    def start(self, *args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [str(VENV_BIN / "hpclaunch"), *args],
            cwd=self.folder,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(process)
        return process

    def status(self, job: int) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.run("status", "--json", str(job)).stdout)
        return data

    def submit_args(self, *train: str, follow: bool = False) -> list[str]:
        return [
            "sbatch",
            *(["--follow"] if follow else []),
            "--log-dir",
            "logs",
            "--nodes",
            "2",
            "--nproc-per-node",
            "2",
            "train.py",
            *STEPS,
            *train,
        ]


@pytest.fixture
def cli(sandbox: Running, tmp_path: Path) -> Iterator[Cli]:
    env = dict(sandbox.env)
    env["PATH"] = f"{VENV_BIN}:{env['PATH']}"
    env["XDG_STATE_HOME"] = str(tmp_path / "state")  # this test's own job list
    folder = tmp_path / "work"
    folder.mkdir()
    shutil.copy(TRAIN, folder / "train.py")
    made = Cli(folder, env)
    yield made
    for process in made.started:  # a test that failed half-way leaves no follower behind
        if process.poll() is None:
            process.kill()
        process.communicate()


def follow_lines(stderr: str) -> list[str]:
    """`--follow`'s lines without their time stamps and job id."""
    return [line.split(": ", 1)[1] for line in stderr.splitlines() if line.startswith("[")]


def test_a_requeued_job_followed_to_its_end(cli: Cli) -> None:
    follower = cli.start(*cli.submit_args(follow=True))
    assert follower.stdout is not None
    job = int(follower.stdout.readline())
    job_dir = cli.folder / "logs" / str(job)
    # train.py checkpoints after steps 4, 9, 14, ... and keeps the last two.
    wait_for(
        lambda: (job_dir / "checkpoints" / f"step-{9:012d}.pt").exists(),
        timeout_s=120,
        what="the checkpoint of step 9",
    )
    running = cli.status(job)
    assert running["state"] == "RUNNING" and len(running["nodes"]) == 2
    assert running["requeues"] == 0 and running["max_requeues"] == 3
    assert running["checkpoint_step"] >= 9 and running["job_dir"] == str(job_dir)
    assert running["name"] == "train" and not running["ended"]
    rank_follower = cli.start("logs", "--rank", "0", "--follow", str(job))

    subprocess.run(["scontrol", "requeue", str(job)], env=cli.env, check=True)
    _, stderr = follower.communicate(timeout=240)
    assert follower.returncode == 0, stderr  # the job's own status: COMPLETED
    lines = follow_lines(stderr)
    assert lines[-1] == "state COMPLETED, exit code 0:0", lines
    assert any(line.startswith("state RUNNING on n") for line in lines), lines
    assert any(line.startswith("requeued (1 of 3)") for line in lines), lines
    assert any(line.startswith("checkpoint: step") for line in lines), lines

    done = cli.status(job)
    assert done["state"] == "COMPLETED" and done["ended"] and done["requeues"] == 1
    assert [(run["requeue"], run["reason"]) for run in done["runs"]] == [
        (0, "requeued by SLURM"),
        (1, "completed"),
    ]
    assert done["checkpoint_step"] == 29 and done["root_cause"] is None
    human = cli.run("status", str(job)).stdout
    assert human.startswith(f"job {job} (train): COMPLETED\n")
    assert "  requeues:        1 of at most 3\n" in human
    assert "  last checkpoint: step 29 (" in human

    followed, _ = rank_follower.communicate(timeout=60)
    assert rank_follower.returncode == 0
    assert f"==> rank 0, requeue 0, step 0, attempt 0: {job_dir}" in followed
    assert f"==> rank 0, requeue 1, step 0, attempt 0: {job_dir}" in followed
    assert followed.count("START ") == 2 and followed.count("RESULT ") == 1
    assert cli.run("logs", "--rank", "0", str(job)).stdout == followed  # the same, at once
    batch = cli.run("logs", str(job)).stdout
    assert "supervisor: job completed" in batch
    node = running["nodes"][1]
    by_node = cli.run("logs", "--node", node, str(job)).stdout
    assert "==> rank 2, requeue 0" in by_node and "==> rank 3, requeue 0" in by_node

    listed = json.loads(cli.run("list", "--json").stdout)
    assert [(row["job_id"], row["state"], row["requeues"]) for row in listed] == [
        (job, "COMPLETED", 1)
    ]


def test_a_failed_job_shows_its_root_cause(cli: Cli) -> None:
    followed = cli.run(*cli.submit_args("--fail-at", "3", follow=True), check=False)
    job = int(followed.stdout)
    failed = cli.status(job)
    assert failed["state"] == "FAILED" and failed["requeues"] == 0
    code = int(failed["exit_code"].split(":")[0])
    assert code != 0 and followed.returncode == code, followed.stderr  # the job's own status
    assert follow_lines(followed.stderr)[-1] == f"state FAILED, exit code {failed['exit_code']}"
    assert "ValueError: bad value at step 3" in followed.stderr  # the root cause, printed
    assert failed["root_cause"] is not None
    assert "root cause: rank" in failed["root_cause"]
    assert "ValueError: bad value at step 3" in failed["root_cause"]
    human = cli.run("status", str(job)).stdout
    assert "root cause: rank" in human and "the same error on every node -> none" in human


def test_cancel_ends_a_running_job_for_good(cli: Cli) -> None:
    job = int(cli.run(*cli.submit_args()).stdout)
    job_dir = cli.folder / "logs" / str(job)
    wait_for(
        lambda: (job_dir / "checkpoints" / f"step-{4:012d}.pt").exists(),
        timeout_s=120,
        what="the checkpoint of step 4",
    )
    nodes = cli.status(job)["nodes"]
    follower = cli.start("status", "--follow", str(job))
    out = cli.run("cancel", str(job)).stdout
    assert out.startswith(f"job {job}: cancelled (was RUNNING on n")
    assert out.endswith("it will not be requeued\n")
    wait_for(lambda: cli.status(job)["ended"], timeout_s=60, what=f"job {job} to end")
    cancelled = cli.status(job)
    assert cancelled["state"] == "CANCELLED" and cancelled["requeues"] == 0
    assert cancelled["nodes"] == nodes
    wait_for(
        lambda: bool(cli.status(job)["runs"][-1]["reason"]),
        timeout_s=30,
        what="the supervisor's record",
    )
    assert [run["reason"] for run in cli.status(job)["runs"]] == ["cancelled"]
    _, followed = follower.communicate(timeout=60)  # docs/operating.md: 128 + SIGTERM
    assert cancelled["exit_code"] == "143:0" and follower.returncode == 143, followed
    again = cli.run("cancel", str(job), check=False)
    assert again.returncode == 1
    assert f"job {job} already ended (CANCELLED); nothing to cancel" in again.stderr
