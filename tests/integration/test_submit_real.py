"""`hpclaunch sbatch` against the real SLURM sandbox: what SLURM stores is what the
user asked for, byte for byte, and its refusals reach the user."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.sandbox_fixture import Running

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
    # squeue 22.05 ignores --jobs with --json: filter here.
    (job,) = [j for j in json.loads(out.stdout)["jobs"] if j["job_id"] == job_id]
    return job  # type: ignore[no-any-return]


def test_submitted_job_is_what_was_asked_for(
    sandbox: Running,
    hpclaunch_bin: Path,
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text("")
    result = hpclaunch(
        hpclaunch_bin,
        tmp_path,
        sandbox.env,
        "--nodes",
        "2",
        "--job-name",
        HOSTILE_NAME,
        "--sbatch-option",
        f"comment={HOSTILE_NAME}",
        "--sbatch-option",
        "hold",
        "--log-dir",
        "my logs",
        "train.py",
    )
    assert result.returncode == 0, result.stderr
    job_id = int(result.stdout)
    assert result.stdout == f"{job_id}\n"
    try:
        job = job_record(sandbox.env, job_id)
    finally:
        subprocess.run(["scancel", str(job_id)], env=sandbox.env, check=True)
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
    sandbox: Running,
    hpclaunch_bin: Path,
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text("")
    result = hpclaunch(hpclaunch_bin, tmp_path, sandbox.env, "--partition", "nope", "train.py")
    assert result.returncode == 3
    assert "sbatch: error: invalid partition specified: nope" in result.stderr
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]
