"""A worker's SLURM task variables describe the worker, not its agent (srun's one task
per node): SLURM-aware code in the worker, submitit's JobEnvironment here, sees the
worker's global rank, local rank and task count; the agent's values stay under
HPCLAUNCH_AGENT_."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import submit

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).with_name("slurm_view.py")


def test_slurm_aware_code_in_a_worker_sees_the_workers_rank_and_world(
    sandbox: Running, tmp_path: Path
) -> None:
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    job = submit(sandbox, tmp_path, SCRIPT, str(seen_dir))
    assert job.wait_end() == "COMPLETED", job.log
    seen = [json.loads(p.read_text()) for p in sorted(seen_dir.glob("rank-*.json"))]
    assert len(seen) == 4, job.log
    for worker in seen:
        expected = [worker["rank"], worker["local_rank"], 4, worker["node_rank"], 2]
        assert worker["submitit"] == expected, worker
        assert worker["agent_procid"] == str(worker["node_rank"]), worker
