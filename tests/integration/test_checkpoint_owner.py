"""One checkpoint folder, one job at a time, on the sandbox with examples/train.py: a
folder in use is refused at submit and at start, naming the job; a job queued
behind the holder (--dependency) continues from its checkpoints; a finished job's
folder is continued from only with --adopt-checkpoints. The digests prove that the
continuations resume exactly. And the same for hpclaunch.Executor(cluster="local"),
whose jobs are judged by their process on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpclaunch.checkpoint import owner
from hpclaunch.checkpoint.owner import MarkerError
from tests.integration.helpers import VENV_BIN, base_env, wait_for
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import EXAMPLES, Job, digest_of, uninterrupted_digest
from tests.integration.training_jobs import submit as submit_script

pytestmark = pytest.mark.integration

TRAIN = EXAMPLES / "train.py"
# The holder trains steps 0..19 (checkpoints after 4, 9, 14, 19), slowly enough that
# a job released meanwhile finds it running; the one after it goes on to step 39.
FIRST = ("--steps", "20", "--checkpoint-every", "5", "--step-time", "0.5")
WHOLE = ("--steps", "40", "--checkpoint-every", "5")


def sbatch(sandbox: Running, folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``hpclaunch sbatch ARGV`` from ``folder`` (which holds train.py), as typed."""
    env = dict(sandbox.env)
    env["PATH"] = f"{VENV_BIN}:{env['PATH']}"
    return subprocess.run(
        [
            str(VENV_BIN / "hpclaunch"),
            "sbatch",
            "--log-dir",
            "logs",
            "--nodes",
            "2",
            "--nproc-per-node",
            "2",
            "--gpus-per-node",
            "0",
            *argv,
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def marker_job(folder: Path) -> str | None:
    try:
        found, _ = owner.read(folder)
    except MarkerError:
        return None
    return found.job_id if found is not None else None


def test_one_folder_one_job_and_continuing_on_purpose(sandbox: Running, tmp_path: Path) -> None:
    whole = uninterrupted_digest(sandbox, tmp_path / "whole", TRAIN, *WHOLE)
    ckpt = tmp_path / "ckpt"

    def submit(name: str, *args: str, options: tuple[str, ...] = ()) -> Job:
        return submit_script(
            sandbox, tmp_path / name, TRAIN, *args, options=options, checkpoint_dir=ckpt
        )

    # Submitted (held) while the folder is free: only the check at its start can stop it.
    slipped = submit("slipped", *FIRST, options=("--sbatch-option", "hold"))
    holder = submit("holder", *FIRST)
    wait_for(lambda: marker_job(ckpt) == str(holder.id), timeout_s=60, what="the holder's marker")

    refused = sbatch(sandbox, tmp_path / "holder", "--checkpoint-dir", str(ckpt), "train.py")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith(
        f"Error: checkpoint folder {ckpt} is in use by job {holder.id} (train, user root, "
        "submitted from "
    ), refused.stderr
    assert "which is RUNNING: two jobs in one folder" in refused.stderr

    queued = submit(
        "queued",
        *WHOLE,
        options=(
            "--sbatch-option",
            f"dependency=afterany:{holder.id}",
            "--adopt-checkpoints",
        ),
    )
    slipped.run("scontrol", "release", str(slipped.id))
    assert slipped.wait_end() == "FAILED", slipped.log
    assert f"supervisor: checkpoint folder {ckpt} is in use by job {holder.id}" in slipped.log
    assert "[rank0] START" not in slipped.log
    assert slipped.history() == [(0, "checkpoint folder refused", "none")]

    assert holder.wait_end() == "COMPLETED", holder.log
    assert queued.wait_end() == "COMPLETED", queued.log
    assert (
        f"supervisor: checkpoint folder {ckpt}: continuing, as asked, from step 19, left by "
        f"job {holder.id} (train, user root, submitted from "
    ) in queued.log
    assert [s["step"] for s in queued.lines("START")] == [20]
    assert digest_of(queued) == whole

    again = sbatch(sandbox, tmp_path / "queued", "--checkpoint-dir", str(ckpt), "train.py")
    assert again.returncode == 1
    assert again.stderr.startswith(
        f"Error: checkpoint folder {ckpt} holds checkpoints up to step 39 left by job "
        f"{queued.id} (train, user root, submitted from "
    ), again.stderr
    assert "which has ended (COMPLETED)" in again.stderr and "--adopt-checkpoints" in again.stderr

    # The latest step is 39 of 40: the adopting job resumes there and trains no more, so
    # its digest is the whole run's.
    adopting = submit("adopting", *WHOLE, options=("--adopt-checkpoints",))
    assert adopting.wait_end() == "COMPLETED", adopting.log
    assert [s["step"] for s in adopting.lines("START")] == [40]
    assert digest_of(adopting) == whole
    assert marker_job(ckpt) == str(adopting.id)


DRIVER = """
import json, os, sys, time
from pathlib import Path
import hpclaunch

def wait_for_release(path):
    while not os.path.exists(path):
        time.sleep(0.05)
    return os.environ["HPCLAUNCH_CHECKPOINT_DIR"]

folder, ckpt, release = sys.argv[1:]
ex = hpclaunch.Executor(folder, cluster="local", nproc_per_node=1, checkpoint_dir=ckpt)
first = ex.submit(wait_for_release, release)
marker = Path(ckpt) / ".hpclaunch-owner.1.json"  # the first job's, numbered 1
while not marker.exists():
    time.sleep(0.05)
out = {"owner": json.loads(marker.read_text())["job_id"], "first": first.job_id}
try:
    ex.submit(wait_for_release, release)
except hpclaunch.HpclaunchError as exc:
    out["refused"] = str(exc)
Path(release).touch()
out["result"] = first.result()
out["after"] = ex.submit(wait_for_release, release).result()
print(json.dumps(out))
"""


def test_a_local_executors_folder_is_its_running_jobs(tmp_path: Path) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    ckpt, release = tmp_path / "ckpt", tmp_path / "release"
    done = subprocess.run(
        [sys.executable, str(driver), str(tmp_path / "jobs"), str(ckpt), str(release)],
        cwd=tmp_path,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["owner"] == out["first"]
    assert out["refused"].startswith(
        f"checkpoint folder {ckpt} is in use by local job {out['first']} ("
    ), out["refused"]
    assert "which is running (process" in out["refused"]
    assert "adopt_checkpoints=True" in out["refused"]
    # Once the first has ended, its folder (no checkpoint in it) is the next job's.
    assert out["result"] == out["after"] == str(ckpt)
