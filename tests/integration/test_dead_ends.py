"""On the sandbox's real SLURM: a job chained with --after starts only after the first
ends; a job that can never start (--nodes 8 on a 4-node partition) is said so by
`status`, and `sbatch --follow` stops with it; an invalid partition lists the ones that
exist; no SLURM_CONF names the variable; `logs --rank` of a rank that does not exist
lists those that do; torchrun's --nnodes is taken, sbatch's --gpus refused."""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from hpclaunch.slurm.commands import Slurm
from tests.integration.helpers import VENV_BIN, wait_for
from tests.integration.sandbox_fixture import Running

pytestmark = pytest.mark.integration

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"


def hpclaunch(
    sandbox: Running,
    folder: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout_s: float = 60,
) -> subprocess.CompletedProcess[str]:
    if env is None:  # the nodes run `hpclaunch agent` from PATH
        env = {
            **sandbox.env,
            "PATH": f"{VENV_BIN}:{sandbox.env['PATH']}",
            "XDG_STATE_HOME": str(folder / "state"),
        }
    return subprocess.run(
        [str(VENV_BIN / "hpclaunch"), *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    shutil.copy(TRAIN, tmp_path / "train.py")
    return tmp_path


def _time(fields: dict[str, str], key: str) -> datetime:
    return datetime.fromisoformat(fields[key])


def test_after_starts_the_second_job_once_the_first_has_ended(
    sandbox: Running, folder: Path
) -> None:
    slurm = Slurm(env=sandbox.env)
    train = ("train.py", "--steps", "10", "--step-time", "0.3")
    first = hpclaunch(sandbox, folder, "sbatch", "--nnodes", "1", *train)
    assert first.returncode == 0, first.stderr
    first_id = first.stdout.strip()
    second = hpclaunch(sandbox, folder, "sbatch", "-N", "1", "--after", first_id, *train)
    assert second.returncode == 0, second.stderr
    second_id = second.stdout.strip()
    assert slurm.job_fields(second_id)["Dependency"].startswith(f"afterok:{first_id}")
    wait_for(lambda: slurm.job_fields(first_id)["JobState"] == "RUNNING", 30, "the first job")
    held = slurm.job_fields(second_id)
    assert (held["JobState"], held["Reason"]) == ("PENDING", "Dependency")

    def second_over() -> bool:
        fields = slurm.job_fields(second_id)
        over = fields["JobState"] not in ("PENDING", "RUNNING")
        return over or fields["Reason"] == "DependencyNeverSatisfied"

    wait_for(second_over, 90, "the second job's end")
    a, b = slurm.job_fields(first_id), slurm.job_fields(second_id)
    logs = hpclaunch(sandbox, folder, "logs", first_id).stdout[-2000:]
    assert (a["JobState"], b["JobState"]) == ("COMPLETED", "COMPLETED"), (a, b, logs)
    assert _time(b, "StartTime") >= _time(a, "EndTime")
    # the rank that does not exist: the one-node job had rank 0 only
    logs = hpclaunch(sandbox, folder, "logs", second_id, "--rank", "9")
    assert logs.returncode == 1
    assert f"job {second_id} has no rank 9 (from --rank): its ranks are 0; give one" in logs.stderr
    followed = hpclaunch(sandbox, folder, "logs", second_id, "--rank", "9", "--follow")
    assert followed.returncode == 1 and logs.stderr in followed.stderr  # said, not waited for


def test_a_job_that_can_never_start_is_said_so_and_not_followed(
    sandbox: Running, folder: Path
) -> None:
    follow = hpclaunch(sandbox, folder, "sbatch", "--follow", "--nodes", "8", "train.py")
    job = follow.stdout.strip()
    try:
        assert follow.returncode == 1, follow.stderr
        assert (
            f"Error: job {job} can never start: it asks for 8 nodes and partition low has "
            "4 (TotalNodes)"
        ) in follow.stderr
        assert f"`hpclaunch cancel {job}`" in follow.stderr
        status = hpclaunch(sandbox, folder, "status", job)
        assert "waiting for:     PartitionNodeLimit" in status.stdout
        assert "never starts:    it asks for 8 nodes and partition low has 4" in status.stdout
    finally:
        assert hpclaunch(sandbox, folder, "cancel", job).returncode == 0


def test_an_invalid_partition_lists_the_partitions(sandbox: Running, folder: Path) -> None:
    done = hpclaunch(sandbox, folder, "sbatch", "-p", "nope", "train.py")
    assert done.returncode == 3
    assert (
        "sbatch refused the partition 'nope': it does not exist (sbatch: error: invalid "
        "partition specified: nope). Partitions here: "
        "low (default, 4 nodes), high (4 nodes)"
    ) in done.stderr


def test_no_slurm_conf_names_the_variable(sandbox: Running, folder: Path) -> None:
    if Path("/etc/slurm/slurm.conf").exists():
        pytest.skip("SLURM has a default configuration here")
    env = {k: v for k, v in sandbox.env.items() if k != "SLURM_CONF"}
    done = hpclaunch(sandbox, folder, "sbatch", "train.py", env=env)
    assert done.returncode == 3
    assert "SLURM_CONF is not set and no slurmctld is announced in DNS" in done.stderr
    assert "res_nsearch" not in done.stderr
    env["SLURM_CONF"] = str(folder / "missing.conf")
    # A job no one submitted (an earlier test's job 1 would be found in the job list).
    done = hpclaunch(sandbox, folder, "status", "99999", env=env, timeout_s=20)  # no retries
    assert done.returncode == 3
    assert f"SLURM_CONF={folder / 'missing.conf'} is not a readable slurm.conf" in done.stderr


def test_sbatchs_gpus_is_refused_before_submitting(sandbox: Running, folder: Path) -> None:
    done = hpclaunch(sandbox, folder, "sbatch", "--gpus", "8", "train.py")
    assert done.returncode == 2
    assert "--gpus is sbatch's GPU count for the whole job" in done.stderr
    assert not (folder / "hpclaunch-logs").exists()
