"""An outage of the job's own etcd (killed, then started again on its data folder)
while a 2-node job trains: the agents wait it out, the workers are not restarted,
and the model ends bit-identical to an uninterrupted run's. Two agents on this
machine (as in test_etcd.py), examples/train.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpclaunch import procs
from tests.integration.etcd_fixture import RestartableEtcd
from tests.integration.helpers import VENV_BIN, wait_for
from tests.integration.test_etcd import agents_env

pytestmark = pytest.mark.integration

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"
STEPS = "60"


def _start_agents(
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


def _finish(job_id: int, agents: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    results = [(a.wait(timeout=240), a.communicate()[0]) for a in agents]
    mark = f"SLURM_JOB_ID={job_id}".encode()
    wait_for(lambda: not procs.with_environ(mark), 10, "every worker of the job gone")
    return results


def _lines(out: str, kind: str) -> list[dict[str, object]]:
    return [
        json.loads(line.split(f"{kind} ", 1)[1])
        for line in out.splitlines()
        if f"] {kind} " in line
    ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The digest of the same training without an outage."""
    folder = tmp_path_factory.mktemp("reference")
    etcd = RestartableEtcd(folder / "etcd")
    try:
        results = _finish(8301, _start_agents(8301, folder, etcd.endpoint))
    finally:
        etcd.stop()
    assert [status for status, _ in results] == [0, 0], results
    (result,) = [r for _, out in results for r in _lines(out, "RESULT")]
    return str(result["digest"])


@pytest.mark.parametrize("down_s", [0.5, 10.0])
def test_an_etcd_restart_mid_training_is_waited_out(
    down_s: float, reference: str, tmp_path: Path
) -> None:
    etcd = RestartableEtcd(tmp_path / "etcd")
    try:
        job_id = 8302 + int(down_s)
        agents = _start_agents(job_id, tmp_path, etcd.endpoint, "--step-time", "0.4")
        checkpoints = tmp_path / "checkpoints"
        wait_for(
            lambda: checkpoints.is_dir() and any(checkpoints.iterdir()), 120, "a first checkpoint"
        )
        etcd.outage(down_s)
        assert all(a.poll() is None for a in agents), "training ended before etcd came back"
        results = _finish(job_id, agents)
    finally:
        etcd.stop()
    assert [status for status, _ in results] == [0, 0], results
    out = "\n".join(text for _, text in results)
    (result,) = _lines(out, "RESULT")
    assert result["digest"] == reference
    assert len(_lines(out, "START")) == 1, out  # the workers were never restarted
    assert "etcd lost the rendezvous state" not in out, out  # its data was kept
    # Every outage an agent saw is one line when it began and one when it ended. A
    # node writes its heartbeat every 2 s: each sees a 10 s outage; a short one, maybe not.
    went = out.count(f"etcd at {etcd.endpoint} is unreachable")
    assert went == out.count(f"etcd at {etcd.endpoint} is back after"), out
    assert went == 2 or (down_s < 5 and went < 2), out


def test_an_etcd_outage_past_the_limit_after_the_last_step_ends_the_agents_0(
    reference: str, tmp_path: Path
) -> None:
    """etcd killed for good once training has written its result, while the workers
    still linger 2 s: the agents meet an outage longer than --etcd-outage-timeout 3,
    and end 0 as their workers did, with the outage said in lines naming etcd and no
    traceback."""
    etcd = RestartableEtcd(tmp_path / "etcd")
    result_file = tmp_path / "result.json"
    try:
        train = ("--result", str(result_file), "--linger", "2")
        agents = _start_agents(8320, tmp_path, etcd.endpoint, *train, outage_timeout_s="3")
        wait_for(result_file.exists, 180, "the training's result")
        etcd.stop()
        results = _finish(8320, agents)
    finally:
        etcd.stop()
    out = "\n".join(text for _, text in results)
    assert [status for status, _ in results] == [0, 0], out
    assert json.loads(result_file.read_text())["digest"] == reference
    assert f"etcd at {etcd.endpoint} is unreachable" in out, out
    assert f"etcd at {etcd.endpoint} was unreachable for" in out, out
    assert "Traceback" not in out, out
