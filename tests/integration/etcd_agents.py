"""Two agents on this machine training examples/train.py through a real etcd (as in
test_etcd.py), for the tests that take etcd away mid-training (test_etcd_outage.py,
test_etcd_wipe.py), and the digest of the same training with nothing taken away."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from hpclaunch import procs
from tests.integration.etcd_fixture import RestartableEtcd
from tests.integration.helpers import VENV_BIN, wait_for
from tests.integration.test_etcd import agents_env

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"
STEPS = "60"


def start_agents(
    job_id: int, folder: Path, endpoint: str, *train: str, outage_timeout_s: str = "60"
) -> list[subprocess.Popen[str]]:
    argv = [
        str(VENV_BIN / "hpclaunch"),
        "agent",
        "--nproc-per-node",
        "1",
        "--job-dir",
        str(folder / "job"),
        "--rdzv",
        "etcd",
        "--etcd-endpoint",
        endpoint,
        "--etcd-outage-timeout",
        outage_timeout_s,
        str(TRAIN),
        "--steps",
        STEPS,
        *train,
    ]
    agents = []
    for node in range(2):
        env = agents_env(job_id, node)
        env["HPCLAUNCH_CHECKPOINT_DIR"] = str(folder / "checkpoints")
        agents.append(
            subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    return agents


def finish(job_id: int, agents: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    results = [(a.wait(timeout=240), a.communicate()[0]) for a in agents]
    mark = f"SLURM_JOB_ID={job_id}".encode()
    wait_for(lambda: not procs.with_environ(mark), 10, "every worker of the job gone")
    return results


def lines(out: str, kind: str) -> list[dict[str, object]]:
    return [
        json.loads(line.split(f"{kind} ", 1)[1])
        for line in out.splitlines()
        if f"] {kind} " in line
    ]


def uninterrupted_digest(folder: Path, job_id: int) -> str:
    """The digest of the training that the outage tests interrupt, run without an outage."""
    etcd = RestartableEtcd(folder / "etcd")
    try:
        results = finish(job_id, start_agents(job_id, folder, etcd.endpoint))
    finally:
        etcd.stop()
    assert [status for status, _ in results] == [0, 0], results
    (result,) = [r for _, out in results for r in lines(out, "RESULT")]
    return str(result["digest"])
