"""An outage of the job's own etcd (killed, then started again on its data folder)
while a 2-node job trains: the agents wait it out, the workers are not restarted,
and the model ends bit-identical to an uninterrupted run's. Two agents on this
machine (as in test_etcd.py), examples/train.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.etcd_agents import finish, lines, start_agents
from tests.integration.etcd_fixture import RestartableEtcd
from tests.integration.helpers import wait_for

# One pytest-xdist worker for the etcd modules: they share one uninterrupted run
# (etcd_reference), and their agents run on this host under fixed job ids (ports).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("etcd-local")]


@pytest.mark.parametrize("down_s", [0.5, 10.0])
def test_an_etcd_restart_mid_training_is_waited_out(
    down_s: float, etcd_reference: str, tmp_path: Path
) -> None:
    etcd = RestartableEtcd(tmp_path / "etcd")
    try:
        job_id = 8302 + int(down_s)
        agents = start_agents(job_id, tmp_path, etcd.endpoint, "--step-time", "0.4")
        checkpoints = tmp_path / "checkpoints"
        wait_for(
            lambda: checkpoints.is_dir() and any(checkpoints.iterdir()), 120, "a first checkpoint"
        )
        etcd.outage(down_s)
        assert all(a.poll() is None for a in agents), "training ended before etcd came back"
        results = finish(job_id, agents)
    finally:
        etcd.stop()
    assert [status for status, _ in results] == [0, 0], results
    out = "\n".join(text for _, text in results)
    (result,) = lines(out, "RESULT")
    assert result["digest"] == etcd_reference
    assert len(lines(out, "START")) == 1, out  # the workers were never restarted
    assert "etcd lost the rendezvous state" not in out, out  # its data was kept
    # Every outage an agent saw is one line when it began and one when it ended. A
    # node writes its heartbeat every 2 s: each sees a 10 s outage; a short one, maybe not.
    went = out.count(f"etcd at {etcd.endpoint} is unreachable")
    assert went == out.count(f"etcd at {etcd.endpoint} is back after"), out
    assert went == 2 or (down_s < 5 and went < 2), out


def test_an_etcd_outage_past_the_limit_after_the_last_step_ends_the_agents_0(
    etcd_reference: str, tmp_path: Path
) -> None:
    """etcd killed for good once training has written its result, while the workers
    still linger 2 s: the agents meet an outage longer than --etcd-outage-timeout 3,
    and end 0 as their workers did, with the outage said in lines naming etcd and no
    traceback."""
    etcd = RestartableEtcd(tmp_path / "etcd")
    result_file = tmp_path / "result.json"
    try:
        train = ("--result", str(result_file), "--linger", "2")
        agents = start_agents(8320, tmp_path, etcd.endpoint, *train, outage_timeout_s="3")
        wait_for(result_file.exists, 180, "the training's result")
        etcd.stop()
        results = finish(8320, agents)
    finally:
        etcd.stop()
    out = "\n".join(text for _, text in results)
    assert [status for status, _ in results] == [0, 0], out
    assert json.loads(result_file.read_text())["digest"] == etcd_reference
    assert f"etcd at {etcd.endpoint} is unreachable" in out, out
    assert f"etcd at {etcd.endpoint} was unreachable for" in out, out
    assert "Traceback" not in out, out
