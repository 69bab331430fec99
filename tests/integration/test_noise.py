"""torch's known-harmless lines are summarised once in the batch log of a successful
2 x 2 job, while the rank logs keep the raw lines (hpclaunch.recovery.noise)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.helpers import VENV_BIN
from tests.integration.sandbox_fixture import Running

pytestmark = pytest.mark.integration

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"
RAW = "The hostname of the client socket cannot be retrieved"


def test_the_c10d_hostname_warning_is_summarised_once(sandbox: Running, tmp_path: Path) -> None:
    env = dict(sandbox.env)
    env["PATH"] = f"{VENV_BIN}:{env['PATH']}"
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    shutil.copy(TRAIN, tmp_path / "train.py")
    argv = [
        str(VENV_BIN / "hpclaunch"),
        "sbatch",
        "--follow",
        "--log-dir",
        "logs",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "train.py",
        "--steps",
        "10",
    ]
    done = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr
    job = int(done.stdout)
    batch = (tmp_path / "logs" / f"train-{job}.out").read_text()
    assert RAW not in batch.replace(f"that '{RAW}", ""), batch  # no raw line left
    summaries = [line for line in batch.splitlines() if "torch's c10d warned" in line]
    assert len(summaries) == 1, batch
    # 2 agents and 4 workers, each once.
    assert "warned 6 times" in summaries[0] and "docs/troubleshooting.md" in summaries[0]
    assert "supervisor: job completed" in batch
    attempt = tmp_path / "logs" / str(job) / "logs" / "requeue-0" / "step-0" / "attempt-0"
    for rank in range(4):
        assert RAW in (attempt / f"rank-{rank}.err").read_text(), f"rank {rank}'s log"
    kept = (tmp_path / "logs" / str(job) / "logs" / "requeue-0" / "torch-noise.log").read_text()
    assert kept.count(RAW) == 6
    assert str(tmp_path / "logs" / str(job) / "logs" / "requeue-0" / "torch-noise.log") in batch
