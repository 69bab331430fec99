"""The strings that become paths, against the real sandbox: a job name no file name
can hold is refused at submit with nothing submitted, and one broken entry in the job
list never keeps ``hpclaunch list`` or ``status`` from the others."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpclaunch.ops import registry
from tests.integration.helpers import VENV_BIN
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import EXAMPLES, submit

pytestmark = pytest.mark.integration


def hpclaunch(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "hpclaunch"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def squeue(env: dict[str, str]) -> str:
    return subprocess.run(
        ["squeue", "-h", "-o", "%i %j"], env=env, capture_output=True, text=True, check=True
    ).stdout


def test_a_job_name_too_long_for_a_file_name_is_refused_at_submit(
    sandbox: Running, tmp_path: Path
) -> None:
    """SLURM 22.05 takes a 300-character name; the job would then fail at launch with no
    log at all (its --output NAME-JOBID.out cannot be created)."""
    (tmp_path / "train.py").write_text("")
    env = {**sandbox.env, "XDG_STATE_HOME": str(tmp_path / "state")}
    before = squeue(env)
    name = "n" * 300
    done = hpclaunch(tmp_path, env, "sbatch", "--nodes", "1", "--job-name", name, "train.py")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        "Error: --job-name: job name 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn'... (300 "
        "characters) is 300 bytes long; the batch log is named NAME-JOBID.out, and a file "
        "name may be at most 255 bytes, so a job name may be at most 240: give a shorter "
        "--job-name\n"
    )
    assert squeue(env) == before  # nothing submitted
    assert not (tmp_path / "logs").exists()  # nothing written
    assert not (tmp_path / "state").exists()  # nothing in the job list


def test_list_and_status_outlive_a_broken_entry(sandbox: Running, tmp_path: Path) -> None:
    env = {**sandbox.env, "XDG_STATE_HOME": str(tmp_path / "state")}
    good = submit(sandbox, tmp_path / "good", EXAMPLES / "train.py", "--steps", "5")
    registry.add(env, registry.Entry(good.id, str(good.job_dir), good.name, 1.0))
    # Before names were checked at submit: a job whose name no file name can hold, and
    # an entry whose folder cannot even be looked at (File name too long).
    registry.add(env, registry.Entry(good.id + 1000, str(tmp_path), "x" * 300, 2.0))
    broken = tmp_path / ("d" * 300) / "9999"
    registry.add(env, registry.Entry(9999, str(broken), "train", 3.0))
    assert good.wait_end() == "COMPLETED", good.log
    listed = hpclaunch(tmp_path, env, "list")
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert rows[1].split()[:3] == [str(good.id), "train", "COMPLETED"], listed.stdout
    assert rows[2].split()[:2] == [str(good.id + 1000), "x" * 37 + "..."], listed.stdout
    assert rows[3].split()[:2] == ["9999", "train"] and "unreadable" in rows[3], listed.stdout
    assert rows[4].startswith("job 9999 is unreadable: job folder "), listed.stdout
    assert rows[4].endswith("cannot be read: File name too long"), listed.stdout
    shown = hpclaunch(tmp_path, env, "status", str(good.id))
    assert shown.returncode == 0 and shown.stdout.startswith(
        f"job {good.id} (train): COMPLETED\n"
    ), shown.stderr
    assert os.path.isdir(good.job_dir)
