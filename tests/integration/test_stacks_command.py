"""`hpclaunch stacks` on the sandbox: a running 2x2 job whose ranks all wait in the
same loop, rank 3 through one more function; each node's agent reads its ranks' stacks
(py-spy, installed in the venv) when asked through the job folder, and the login node
prints them: ranks 0-2's identical stacks once, rank 3's apart. The job is cancelled
after, and every process of it waited out."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.helpers import VENV_BIN, wait_for
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import Job, submit

pytestmark = pytest.mark.integration

# Every rank joins the group, says so, and waits in wait_here until it is cancelled;
# rank 3 gets there through one more function, so its stack differs.
WAITS = """\
import time
import torch.distributed as dist


def wait_here():
    while True:
        time.sleep(0.2)


def by_another_way():
    wait_here()


dist.init_process_group("gloo")
print("READY", dist.get_rank(), flush=True)
if dist.get_rank() == 3:
    by_another_way()
wait_here()
"""


def ready(job: Job) -> bool:
    """Whether all four ranks of the job's first attempt said READY."""
    outs = sorted(job.job_dir.glob("logs/requeue-0/step-*/attempt-0/rank-*.out"))
    return len(outs) == 4 and all("READY" in path.read_text() for path in outs)


def stacks(job: Job, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(VENV_BIN / "hpclaunch"), "stacks", *args, str(job.id)]
    return subprocess.run(
        argv, cwd=job.folder, env=job.env, capture_output=True, text=True, timeout=120, check=False
    )


def test_stacks_of_every_rank_of_a_running_job(sandbox: Running, tmp_path: Path) -> None:
    script = tmp_path / "waits.py"
    script.write_text(WAITS)
    job = submit(sandbox, tmp_path / "job", script)
    try:
        wait_for(lambda: ready(job), timeout_s=120, what=f"job {job.id}'s four ranks")
        began = time.monotonic()
        grouped = stacks(job)  # found by the job list, as a user runs it
        took = time.monotonic() - began
        assert grouped.returncode == 0, grouped.stderr
        out = grouped.stdout
        print(out, f"(took {took:.1f} s)")
        first = out.splitlines()[0]
        assert first.startswith(f"job {job.id}: stacks of 4 ranks on n[") and "attempt 0" in first
        # The three identical stacks print once, under their ranks, then rank 3's.
        assert out.count("wait_here (waits.py:7)") == 2 and "no answer" not in out, out
        assert (
            "\nranks 0-2 (3 ranks):\n  Thread MainThread:\n      wait_here (waits.py:7)\n"
            "      <module> (waits.py:18)\n"
        ) in out
        assert (
            "\nrank 3:\n  Thread MainThread:\n      wait_here (waits.py:7)\n"
            "      by_another_way (waits.py:11)\n      <module> (waits.py:17)"
        ) in out

        raw = stacks(job, "--raw", "--job-dir", str(job.job_dir))
        assert raw.returncode == 0, raw.stderr
        sections = raw.stdout.split("=== rank ")[1:]
        assert [s.split("\n", 1)[0] for s in sections] == ["0", "1", "2", "3"], raw.stdout
        assert all("wait_here (waits.py:7)" in s for s in sections), raw.stdout
        print(raw.stdout)
        # The request and its answers are gone: no agent answers it again.
        assert list((job.job_dir / "stacks").iterdir()) == []
    finally:
        job.run("scancel", str(job.id))
        assert job.wait_end() == "CANCELLED", job.log  # and every process of it is gone
    after = stacks(job)
    print(after.stderr)
    assert after.returncode == 1
    assert f"Error: job {job.id} has ended (CANCELLED): its workers are gone" in after.stderr
