"""Goodput end to end on the sandbox: examples/train.py on 2 nodes loses a node and is
requeued; ``hpclaunch status --json`` splits its wall time into parts that add up to it,
and ``hpclaunch report`` draws both runs."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.integration.helpers import VENV_BIN
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import EXAMPLES, end_with_a_lost_node, submit

pytestmark = pytest.mark.integration

# The node is lost after step 9's checkpoint; 50 more steps (~10 s) leave the kill time to
# land before the run could end by itself, which would leave nothing to requeue.
STEPS = ("--steps", "60", "--checkpoint-every", "5", "--step-time", "0.15")


def hpclaunch(job_env: dict[str, str], cwd: Path, *argv: str) -> str:
    done = subprocess.run(
        [str(VENV_BIN / "hpclaunch"), *argv],
        cwd=cwd,
        env=job_env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_requeued_job_s_goodput_adds_up_and_its_report_draws_both_runs(
    sandbox: Running, tmp_path: Path
) -> None:
    job = submit(sandbox, tmp_path, EXAMPLES / "train.py", *STEPS)
    job.wait_checkpoint(9)
    state, _ = end_with_a_lost_node(sandbox, job)
    assert state == "COMPLETED", job.log
    where = ("--job-dir", str(job.job_dir), str(job.id))
    found = json.loads(hpclaunch(job.env, tmp_path, "status", "--json", *where))["goodput"]
    parts = {k: found[k] for k in found if k.endswith("_s") and k != "wall_s"}
    assert abs(sum(parts.values()) - found["wall_s"]) <= 1, found
    assert found["submit_known"], found  # the job list's submit time
    assert found["productive_s"] > 0 and found["queue_s"] >= 0 and found["startup_s"] > 0
    assert found["restarts_s"] + found["lost_s"] > 0, found
    assert 0 < found["ratio"] < 1
    text = hpclaunch(job.env, tmp_path, "status", *where)
    assert "  goodput:         " in text
    svg = tmp_path / "t.svg"
    out = hpclaunch(job.env, tmp_path, "report", "--output", str(svg), *where)
    assert f"timeline: {svg}" in out and "    productive " in out
    root = ET.parse(svg).getroot()
    texts = {"".join(e.itertext()).strip() for e in root.iter("{http://www.w3.org/2000/svg}text")}
    assert {"run 0", "run 1"} <= texts, texts
    # Each lane says how its run ended: the lost node's requeue, then the completion.
    assert {"requeued by SLURM", "completed"} <= texts, texts
    assert "  run 0: requeued by SLURM" in out and "  run 1: completed" in out
    png = tmp_path / "t.png"
    hpclaunch(job.env, tmp_path, "report", "--output", str(png), *where)
    from PIL import Image

    with Image.open(png) as picture:
        assert picture.size[0] >= 800 and picture.size[1] >= 200
    (tmp_path / "report.txt").write_text(out + "\n" + text)
    print(out, text, sep="\n")
