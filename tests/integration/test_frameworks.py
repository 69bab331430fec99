"""Frameworks people already run, unchanged, on the sandbox: accelerate's plain
``Accelerator()`` on CPU nodes is one world over gloo (the agent sets
ACCELERATE_USE_CPU=1 where the job has no GPU), not four trainings of their own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import submit

pytestmark = pytest.mark.integration

ACCELERATE = Path(__file__).with_name("accelerate_train.py")


def test_accelerate_on_cpu_nodes_trains_one_model_in_one_world(
    sandbox: Running, tmp_path: Path
) -> None:
    pytest.importorskip("accelerate")  # the test tier installs it (.[frameworks])
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    job = submit(sandbox, tmp_path, ACCELERATE, str(seen_dir))
    assert job.wait_end() == "COMPLETED", job.log
    seen = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in seen_dir.iterdir()}
    assert sorted(seen) == [0, 1, 2, 3], job.log
    for rank, worker in seen.items():
        assert worker["num_processes"] == 4 and worker["process_index"] == rank, worker
        assert worker["distributed_type"] == "DistributedType.MULTI_CPU", worker
    assert len({worker["digest"] for worker in seen.values()}) == 1, seen
