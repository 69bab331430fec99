"""The agent on a real GPU: one node, NCCL, an all_reduce on CUDA.

Runs only with ``pytest --gpu`` (a machine with CUDA and a CUDA build of torch);
without ``--gpu`` these tests are not collected, so CPU-only CI neither runs nor
skips them. With ``--gpu`` and no CUDA they fail.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import VENV_BIN, base_env

pytestmark = pytest.mark.gpu

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "allreduce.py"


def cuda_devices() -> int:
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def test_nccl_all_reduce_on_cuda_through_the_agent(tmp_path: Path) -> None:
    gpus = cuda_devices()
    assert gpus >= 1, "pytest --gpu needs CUDA and a CUDA build of torch"
    job_id = random.randrange(1, 10**6)
    env = base_env(
        SLURM_JOB_ID=str(job_id),
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_NUM_NODES="1",
        SLURM_NODEID="0",
        SLURM_STEP_ID="0",
        SLURM_GPUS_ON_NODE=str(gpus),
    )
    result = subprocess.run(
        [
            str(VENV_BIN / "hpclaunch"),
            "agent",
            "--job-dir",
            str(tmp_path / "job"),
            str(EXAMPLE),
            "--backend",
            "nccl",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reports = sorted(
        (
            json.loads(line.split("ALLREDUCE ", 1)[1])
            for line in result.stdout.splitlines()
            if "ALLREDUCE " in line
        ),
        key=lambda r: r["rank"],
    )
    assert [r["rank"] for r in reports] == list(range(gpus))  # one worker per GPU
    assert {r["backend"] for r in reports} == {"nccl"}
    assert [r["device"] for r in reports] == [f"cuda:{i}" for i in range(gpus)]
    assert {r["sum"] for r in reports} == {gpus * (gpus - 1) / 2}
