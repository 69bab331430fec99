"""A rank that hangs on every attempt, on the sandbox: the others time out in their
collective, and the job ends FAILED as a hang, not as a bug in the script, with no
node kept out and no root-cause block naming a healthy node. (Naming the rank that
hung needs progress reports from the workers: the hang detector's work.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import submit

pytestmark = pytest.mark.integration

# Global rank 2 (node 1) sleeps at step 3 on every attempt; the other ranks wait for it
# in all_reduce until gloo's timeout (5 s here, 30 min by default).
HANGS = """\
import datetime, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
value = torch.ones(1)
for step in range(10):
    if dist.get_rank() == 2 and step == 3:
        time.sleep(3600)
    dist.all_reduce(value)
"""


def test_a_rank_that_hangs_every_time_is_a_hang_not_a_bug(sandbox: Running, tmp_path: Path) -> None:
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    job = submit(sandbox, tmp_path / "job", script, options=("--max-restarts", "1"))
    assert job.wait_end() == "FAILED", job.log
    assert job.history() == [(0, "hang", "none")]
    history = json.loads((job.job_dir / "history.json").read_text())
    assert history["excluded_nodes"] == [] and job.fields()["Restarts"] == "0"
    assert "Timed out waiting" in history["runs"][0]["error"]
    assert (
        job.log.count("supervisor: every rank that failed timed out waiting in a collective") == 1
    )
    assert "the same error on every node" not in job.log
    assert "root cause: rank" not in job.log  # each block there is a waiting rank's
