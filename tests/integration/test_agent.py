"""`hpclaunch agent` on the SLURM sandbox: real srun, real torch (gloo), real ranks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpclaunch.context import parse_topology, topology_order
from tests.integration.helpers import VENV_BIN, wait_for
from tests.integration.sandbox_fixture import Running

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "allreduce.py"


def job_env(sandbox: Running) -> dict[str, str]:
    env = dict(sandbox.env)
    env["PATH"] = f"{VENV_BIN}:{env['PATH']}"
    return env


def scontrol_job(env: dict[str, str], job_id: int) -> str:
    argv = ["scontrol", "show", "job", str(job_id)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout


def job_state(env: dict[str, str], job_id: int) -> str:
    out = scontrol_job(env, job_id)
    return next(w.split("=", 1)[1] for w in out.split() if w.startswith("JobState="))


def submit(sandbox: Running, tmp_path: Path, *args: str) -> tuple[int, dict[str, str]]:
    env = job_env(sandbox)
    shutil.copy(EXAMPLE, tmp_path / "allreduce.py")
    result = subprocess.run(
        [str(VENV_BIN / "hpclaunch"), "sbatch", "--log-dir", "logs", "--gpus-per-node", "0", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return int(result.stdout), env


def finished(env: dict[str, str], job_id: int) -> str:
    done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    wait_for(lambda: job_state(env, job_id) in done, timeout_s=120, what=f"job {job_id} to end")
    return job_state(env, job_id)


def reports(tmp_path: Path, job_id: int) -> list[dict[str, object]]:
    text = (tmp_path / "logs" / f"allreduce-{job_id}.out").read_text()
    return [
        json.loads(line.split(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ALLREDUCE ")
    ]


@pytest.mark.parametrize("nodes", [2, 4])
def test_sbatch_job_runs_every_rank(sandbox: Running, tmp_path: Path, nodes: int) -> None:
    job_id, env = submit(
        sandbox, tmp_path, "--nodes", str(nodes), "--nproc-per-node", "2", "allreduce.py"
    )
    state = finished(env, job_id)
    log = (tmp_path / "logs" / f"allreduce-{job_id}.out").read_text()
    assert state == "COMPLETED", log
    got = sorted(reports(tmp_path, job_id), key=lambda r: int(str(r["rank"])))
    world = 2 * nodes
    assert [r["rank"] for r in got] == list(range(world))
    assert {r["world_size"] for r in got} == {world}
    assert {r["sum"] for r in got} == {world * (world - 1) / 2}
    assert {r["job_id"] for r in got} == {str(job_id)} and {r["requeue_count"] for r in got} == {
        "0"
    }
    show = scontrol_job(env, job_id)
    nodelist = next(w.split("=", 1)[1] for w in show.split() if w.startswith("NodeList="))
    first = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    assert got[0]["node"] == first and got[1]["node"] == first  # ranks 0 and 1 on the first node
    by_node = {r["group_rank"]: r["node"] for r in got}
    assert len(set(by_node.values())) == nodes


def test_failing_script_fails_the_job_with_its_root_cause(sandbox: Running, tmp_path: Path) -> None:
    job_id, env = submit(
        sandbox, tmp_path, "--nodes", "2", "--nproc-per-node", "2", "--max-restarts", "0",
        "allreduce.py", "--fail-rank", "3",
    )  # fmt: skip
    assert finished(env, job_id) == "FAILED"
    log = (tmp_path / "logs" / f"allreduce-{job_id}.out").read_text()
    assert "Root Cause (first observed failure)" in log
    assert "rank 3 fails on purpose" in log


def test_topology_rank_order(sandbox: Running, tmp_path: Path) -> None:
    env = job_env(sandbox)
    subprocess.run(
        ["srun", "-N4", f"--output={tmp_path}/context-%t.json", str(VENV_BIN / "hpclaunch"),
         "agent", "--dry-run", "--rank-order", "topology", str(EXAMPLE)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    contexts = [
        json.loads(p.read_text())["context"] for p in sorted(tmp_path.glob("context-*.json"))
    ]
    assert len(contexts) == 4
    topology = subprocess.run(
        ["scontrol", "show", "topology"], env=env, capture_output=True, text=True, check=True
    ).stdout
    expected = list(
        topology_order(sorted(c["hostname"] for c in contexts), parse_topology(topology))
    )
    assert {tuple(c["hosts"]) for c in contexts} == {tuple(expected)}
    assert sorted((c["node_rank"], c["hostname"]) for c in contexts) == list(enumerate(expected))


def test_agent_outside_an_allocation_says_so() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hpclaunch", "agent", str(EXAMPLE)],
        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "not inside a SLURM allocation (SLURM_JOB_ID is not set)" in result.stderr
