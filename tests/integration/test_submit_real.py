"""`hpclaunch sbatch` against a real slurmctld: what SLURM stores is what the
user asked for, byte for byte, and its refusals reach the user."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.slurm_controller import Controller

pytestmark = pytest.mark.integration

HOSTILE_NAME = 'it\'s "q" $(touch PWNED) `x` ;a#b \\back\\ naïve ✓ %x  end'


def hpclaunch(
    hpclaunch_bin: Path, cwd: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(hpclaunch_bin), "sbatch", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def job_record(env: dict[str, str], job_id: int) -> dict[str, Any]:
    out = subprocess.run(
        ["squeue", "--json", "--jobs", str(job_id)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    (job,) = json.loads(out.stdout)["jobs"]
    return job  # type: ignore[no-any-return]


def test_submitted_job_is_what_was_asked_for(
    slurm_controller: Controller,
    hpclaunch_bin: Path,
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text("")
    result = hpclaunch(
        hpclaunch_bin, tmp_path, slurm_controller.env,
        "--nodes", "2", "--job-name", HOSTILE_NAME, "--sbatch-option", f"comment={HOSTILE_NAME}",
        "--sbatch-option", "hold", "--log-dir", "my logs", "train.py",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    job_id = int(result.stdout)
    assert result.stdout == f"{job_id}\n"
    job = job_record(slurm_controller.env, job_id)
    assert job["name"] == HOSTILE_NAME
    assert job["comment"] == HOSTILE_NAME
    assert job["node_count"] == 2
    assert job["requeue"] is True
    assert job["state_reason"] == "JobHeldUser"
    assert job["current_working_directory"] == str(tmp_path)
    assert job["standard_output"] == f"{tmp_path}/my logs/%x-%j.out"
    kept = tmp_path / "my logs" / str(job_id) / "job.sbatch"
    assert kept.is_file()
    assert not list(tmp_path.rglob("PWNED"))


def test_sbatch_refusal_is_shown_and_nothing_is_left(
    slurm_controller: Controller,
    hpclaunch_bin: Path,
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text("")
    result = hpclaunch(
        hpclaunch_bin, tmp_path, slurm_controller.env, "--partition", "nope", "train.py"
    )
    assert result.returncode == 3
    assert "sbatch: error: invalid partition specified: nope" in result.stderr
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]
