"""hpclaunch.Executor(cluster="local"): the same function API on this machine, no
SLURM, real torch. The driver is a user's script: its functions live in __main__,
so cloudpickle sends them by value."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import base_env

pytestmark = pytest.mark.integration

DRIVER = """
import json, os, sys, time
import submitit.helpers
import hpclaunch

def work(offset):
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([float(os.environ["RANK"]) + offset])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"]),
            "sum": total.item(), "job_dir": os.environ["HPCLAUNCH_JOB_DIR"]}

def broken():
    if os.environ["RANK"] == "1":
        raise KeyError("rank 1 lost its key")

def settings():
    return {"seed": os.environ.get("SEED"), "ckpt": os.environ["HPCLAUNCH_CHECKPOINT_DIR"],
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}

class Slow(submitit.helpers.Checkpointable):
    # One step a second; checkpoint() (inherited) keeps the steps done. The first run
    # steps until the time limit stops it (however long its start took on a busy
    # machine); the requeued one takes `more` steps on from where it resumed.
    def __init__(self):
        self.done = []
    def __call__(self, more):
        first = len(self.done)
        requeue = int(os.environ["HPCLAUNCH_REQUEUE_COUNT"])
        while requeue == 0 or len(self.done) < first + more:
            time.sleep(1)
            self.done.append(len(self.done))
        return {"first": first, "done": self.done, "requeue": requeue}

ex = hpclaunch.Executor(sys.argv[1], cluster="local", nproc_per_node=2, max_restarts=0)
job = ex.submit(work, 0.5)
out = {"result": job.result(), "results": job.results()}
try:
    ex.submit(broken).result()
except Exception as exc:
    out["error"] = [type(exc).__name__, str(exc)]
ex.update_parameters(env={"SEED": "7"}, checkpoint_dir=sys.argv[2], partition="ignored")
out["settings"] = ex.submit(settings).result()
try:
    ex.update_parameters(nodes=2)
except hpclaunch.SpecError as exc:
    out["nodes"] = str(exc)
# A 1-minute limit warns 30 s before the end: the callable checkpoints, the node
# runs again (a local requeue) and finishes from there.
ex.update_parameters(timeout_min=1, max_requeues=1)
out["timed"] = ex.submit(Slow(), 5).result()
print(json.dumps(out))
"""


def test_the_same_function_runs_on_this_machine(tmp_path: Path) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    done = subprocess.run(
        [sys.executable, str(driver), str(tmp_path / "jobs"), str(tmp_path / "ckpt")],
        cwd=tmp_path,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    result = out["result"]
    assert result["rank"] == 0 and result["world_size"] == 2 and result["sum"] == 0 + 1 + 2 * 0.5
    # Every rank's value, in rank order, as submitit gives one per task.
    assert [r["rank"] for r in out["results"]] == [0, 1] and out["results"][0] == result
    assert Path(result["job_dir"]).parent == tmp_path / "jobs"
    kind, message = out["error"]
    assert kind == "FailedJobError"
    assert "root cause: rank 1" in message and "KeyError: 'rank 1 lost its key'" in message
    # The user's script by name, although cloudpickle 3.1.3 pickles it as "<dynamic-code>".
    assert f'File "{driver}", line 17, in broken' in message, message
    assert out["settings"] == {"seed": "7", "ckpt": str(tmp_path / "ckpt"), "cuda": ""}
    assert out["nodes"].startswith("update_parameters(nodes=...): cluster='local' runs one node")
    # The requeued run went on from the steps the stopped one checkpointed: none lost,
    # none repeated.
    timed = out["timed"]
    assert timed["requeue"] == 1 and timed["first"] > 0, timed
    assert timed["done"] == list(range(timed["first"] + 5)), timed
    assert 20 <= timed["first"] < 45, timed  # resumed from the checkpoint, not from 0
