"""`hpclaunch agent` on the SLURM sandbox: real srun, real torch (gloo), real ranks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpclaunch.slurm.env import parse_topology, topology_order
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
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return int(result.stdout), env


def finished(env: dict[str, str], job_id: int) -> str:
    done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    wait_for(lambda: job_state(env, job_id) in done, timeout_s=120, what=f"job {job_id} to end")
    return job_state(env, job_id)


def reports(tmp_path: Path, job_id: int) -> list[dict[str, object]]:
    """The ALLREDUCE lines of the job's output, each checked against its rank prefix."""
    text = (tmp_path / "logs" / f"allreduce-{job_id}.out").read_text()
    found = []
    for line in text.splitlines():
        prefix, _, rest = line.partition(" ")
        if rest.startswith("ALLREDUCE "):
            report = json.loads(rest.split(" ", 1)[1])
            assert prefix == f"[rank{report['rank']}]", line
            found.append(report)
    return found


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
    # One rank's error looks like a bad node to the supervisor; --max-requeues 0 makes
    # it give up at once instead of trying the job without that node.
    job_id, env = submit(
        sandbox,
        tmp_path,
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "0",
        "--max-requeues",
        "0",
        "allreduce.py",
        "--fail-rank",
        "3",
    )
    assert finished(env, job_id) == "FAILED"
    log = (tmp_path / "logs" / f"allreduce-{job_id}.out").read_text()
    assert log.count(f"hpclaunch: job {job_id} failed on node") == 1  # printed once
    block = log[log.index(f"hpclaunch: job {job_id} failed on node 1") :]
    block = block[: block.index("=" * 72)]
    rank_logs = tmp_path / "logs" / str(job_id) / "logs" / "requeue-0" / "step-0" / "attempt-0"
    assert "python -u allreduce.py --fail-rank 3" in block
    assert "root cause: rank 3 (local rank 1, pid " in block and "exit code 1," in block
    assert f"traceback (from {rank_logs}/rank-3.err):" in block
    assert "RuntimeError: rank 3 fails on purpose (--fail-rank)" in block
    assert "rank 3 fails on purpose" in (rank_logs / "rank-3.err").read_text()


# Rank 1 (on the first node) crashes on the job's first attempt, saying so on stderr.
CRASH_ONCE = """
import json, os, socket, sys
import torch, torch.distributed as dist
env = os.environ
if env["RANK"] == "1" and env["HPCLAUNCH_ATTEMPT"] == "0":
    sys.stderr.write("rank 1 crashes on purpose\\n")
    sys.exit(3)
dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
keys = ("RANK", "HPCLAUNCH_ATTEMPT", "TORCHELASTIC_RESTART_COUNT", "HPCLAUNCH_NODE_RANK")
report = {k: env[k] for k in keys} | {"node": socket.gethostname(), "sum": value.item()}
sys.stdout.write("ATTEMPT " + json.dumps(report) + "\\n")
dist.destroy_process_group()
"""


def test_one_attempt_counter_on_every_node_and_logs_per_rank(
    sandbox: Running, tmp_path: Path
) -> None:
    (tmp_path / "crash_once.py").write_text(CRASH_ONCE)
    job_id, env = submit(
        sandbox,
        tmp_path,
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "crash_once.py",
    )
    state = finished(env, job_id)
    log = (tmp_path / "logs" / f"crash_once-{job_id}.out").read_text()
    assert state == "COMPLETED", log
    got = sorted(
        (
            json.loads(line.split("ATTEMPT ", 1)[1])
            for line in log.splitlines()
            if "ATTEMPT " in line
        ),
        key=lambda r: int(r["RANK"]),
    )
    assert [r["RANK"] for r in got] == ["0", "1", "2", "3"]
    assert {r["sum"] for r in got} == {4.0}
    # The second attempt on both nodes, although only node 0's agent restarted its workers.
    assert {r["HPCLAUNCH_ATTEMPT"] for r in got} == {"1"}
    restarts = {r["HPCLAUNCH_NODE_RANK"]: r["TORCHELASTIC_RESTART_COUNT"] for r in got}
    assert restarts == {"0": "1", "1": "0"}
    # Each attempt's output per rank; the job's output has every line, prefixed with the rank.
    runs = tmp_path / "logs" / str(job_id) / "logs" / "requeue-0" / "step-0"
    assert sorted(p.name for p in runs.iterdir()) == ["attempt-0", "attempt-1"]
    for attempt in ("attempt-0", "attempt-1"):
        names = sorted(p.name for p in (runs / attempt).iterdir() if p.suffix in (".err", ".out"))
        assert names == [f"rank-{r}.{k}" for r in range(4) for k in ("err", "out")]
        # Each agent noted which ranks it ran (for `hpclaunch logs --node`).
        noted = [json.loads(p.read_text()) for p in sorted((runs / attempt).glob("node-*.ranks"))]
        assert sorted(map(sorted, noted)) == [[0, 1], [2, 3]]
    assert (
        "rank 1 crashes on purpose" in (runs / "attempt-0" / "rank-1.err").read_text().splitlines()
    )
    assert "[rank1] rank 1 crashes on purpose" in log.splitlines()
    for rank in range(4):
        out = (runs / "attempt-1" / f"rank-{rank}.out").read_text()
        assert json.loads(out.split("ATTEMPT ", 1)[1])["RANK"] == str(rank)
        assert f"[rank{rank}] {out.strip()}" in log.splitlines()


def test_topology_rank_order(sandbox: Running, tmp_path: Path) -> None:
    env = job_env(sandbox)
    subprocess.run(
        [
            "srun",
            "-N4",
            f"--output={tmp_path}/context-%t.json",
            str(VENV_BIN / "hpclaunch"),
            "agent",
            "--dry-run",
            "--rank-order",
            "topology",
            str(EXAMPLE),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
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
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "not inside a SLURM allocation (SLURM_JOB_ID is not set)" in result.stderr
