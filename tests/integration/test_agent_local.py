"""The agent with real torch on this machine, as a one-node SLURM step would run it
(SLURM's variables set by the test): worker lifetime and in-place restarts."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from pathlib import Path

import pytest

from hpclaunch.sandbox import procs
from tests.integration.helpers import VENV_BIN, base_env, wait_for

pytestmark = pytest.mark.integration

SLEEPER = """
import os, sys, time, pathlib
pathlib.Path(sys.argv[1], f"worker-{os.environ['RANK']}.pid").write_text(str(os.getpid()))
time.sleep(600)
"""

# Rank 1 crashes once, on the first attempt; the restarted group must then finish.
CRASH_ONCE = """
import os, sys, pathlib
import torch.distributed as dist
out = pathlib.Path(sys.argv[1])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if os.environ["RANK"] == "1" and attempt == 0:
    sys.exit(3)
dist.init_process_group("gloo")
import torch
value = torch.ones(1)
dist.all_reduce(value)
(out / f"rank-{os.environ['RANK']}").write_text(f"{attempt} {value.item():g}")
dist.destroy_process_group()
"""


def agent_env(job_id: int) -> dict[str, str]:
    return base_env(
        SLURM_JOB_ID=str(job_id), SLURM_JOB_NODELIST="localhost", SLURM_JOB_NUM_NODES="1",
        SLURM_NODEID="0",
    )  # fmt: skip


def agent(script: Path, out: Path, job_id: int, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(VENV_BIN / "hpclaunch"), "agent", "--nproc-per-node", "2", *extra, str(script),
         str(out)],
        env=agent_env(job_id), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_sigkill_of_the_agent_leaves_no_worker(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    with agent(script, tmp_path, random.randrange(1, 10**6)) as proc:
        try:
            pid_files = [tmp_path / f"worker-{rank}.pid" for rank in (0, 1)]
            wait_for(
                lambda: all(p.exists() and p.read_text() for p in pid_files),
                timeout_s=60,
                what="workers",
            )
            workers = [procs.Tracked.of(int(p.read_text())) for p in pid_files]
            assert all(w.alive() for w in workers)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            proc.kill()
    wait_for(lambda: not any(w.alive() for w in workers), timeout_s=10, what="the workers to die")


@pytest.mark.slow
def test_one_worker_crash_costs_exactly_one_restart_every_time(tmp_path: Path) -> None:
    script = tmp_path / "crash_once.py"
    script.write_text(CRASH_ONCE)
    for run in range(20):
        out = tmp_path / f"run{run}"
        out.mkdir()
        with agent(script, out, random.randrange(1, 10**6), "--max-restarts", "1") as proc:
            _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"run {run}: {err.decode()[-2000:]}"
        results = {p.name: p.read_text() for p in out.iterdir()}
        assert results == {"rank-0": "1 2", "rank-1": "1 2"}, f"run {run}: {results}"
