"""etcd wiped while a 2-node job trains (killed, its data folder deleted, started again
empty on the same port): the agents write back the rendezvous state they hold, the
workers go on untouched, attempt numbers and rank logs go on, and the model ends
bit-identical to an uninterrupted run's. Two agents on this machine, as in
test_etcd_outage.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.etcd_agents import finish, lines, start_agents
from tests.integration.etcd_fixture import RestartableEtcd
from tests.integration.helpers import wait_for

# One pytest-xdist worker for the etcd modules: they share one uninterrupted run
# (etcd_reference), and their agents run on this host under fixed job ids (ports).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("etcd-local")]


@pytest.mark.parametrize("down_s", [0.5, 10.0])
def test_an_etcd_wiped_mid_training_gets_its_rendezvous_state_back(
    down_s: float, etcd_reference: str, tmp_path: Path
) -> None:
    etcd = RestartableEtcd(tmp_path / "etcd")
    job_id = 8402 + int(down_s)
    try:
        agents = start_agents(job_id, tmp_path, etcd.endpoint, "--step-time", "0.4")
        checkpoints = tmp_path / "checkpoints"
        wait_for(
            lambda: checkpoints.is_dir() and any(checkpoints.iterdir()), 120, "a first checkpoint"
        )
        etcd.wipe(down_s)
        assert all(a.poll() is None for a in agents), "training ended before etcd came back"
        results = finish(job_id, agents)
    finally:
        etcd.stop()
    out = "\n".join(text for _, text in results)
    assert [status for status, _ in results] == [0, 0], out
    (result,) = lines(out, "RESULT")
    assert result["digest"] == etcd_reference
    # The workers were never restarted: one start, in attempt 0, whose rank logs hold
    # the whole run (no later attempt wrote over them).
    (start,) = lines(out, "START")
    assert start["attempt"] == "0", out
    attempts = tmp_path / "job" / "logs" / "requeue-0" / "step-0"
    assert sorted(p.name for p in attempts.iterdir()) == ["attempt-0"]
    rank0 = (attempts / "attempt-0" / "rank-0.out").read_text()
    assert "START " in rank0 and "RESULT " in rank0, rank0
    assert "starting a new round" not in out, out
    # One node wrote the state back, the other found it written; each says so once.
    lost = "etcd lost the rendezvous state (its data wiped, or a new etcd at its address); "
    wrote = lost + "this node wrote back the state it held: round 0, 2 nodes; running workers go on"
    found = lost + "another node wrote back its state: round 0, 2 nodes; running workers go on"
    assert out.count(wrote) == 1, out
    assert out.count(found) == 1, out
