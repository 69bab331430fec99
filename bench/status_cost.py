"""The cost of ``hpclaunch status`` on a job with 3 runs, and of working out its goodput,
side by side with the anchor: a plain ``scontrol show job`` of the same job.

A benchmark, not a test. It brings up a 2-node sandbox (loopback or netns, as this
machine allows), submits one job that sleeps (so that SLURM knows it), writes a job
folder for it with 3 runs, each with 2 nodes' attempt logs and progress notes, 20
checkpoint saves and a hang report, then alternates ``--rounds`` times:

- ``scontrol show job JOBID`` (the anchor: what any status costs at least),
- ``hpclaunch status --job-dir FOLDER JOBID`` (scontrol, the job folder, the goodput),
- ``JobRecord.read`` then ``hpclaunch.record.goodput.of_record`` in this process (the
  job folder read once, and the goodput worked out of it).

    .venv/bin/python bench/status_cost.py [--rounds 15] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpclaunch.jobdir import attempts, progress_notes, saves
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.record import goodput
from hpclaunch.record.job_record import JobRecord
from hpclaunch.sandbox.cluster import Sandbox
from hpclaunch.sandbox.conf import Mode, SandboxSpec
from hpclaunch.sandbox.daemons import SBIN_PATH

VENV_BIN = Path(sys.executable).parent


def client_env(box: Sandbox) -> dict[str, str]:
    """This process's environment, with SLURM's commands pointed at ``box``."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}:{SBIN_PATH}"
    return {**env, **box.env()}


def job_folder(folder: Path, job_id: int, t0: float) -> None:
    """A job folder with 3 runs (two lost a node), as the agents and supervisor write it."""
    job = JobFolder(folder)
    runs = []
    for requeue in range(3):
        start = t0 + requeue * 400
        ended = start + 300
        runs.append(
            {
                "requeue_count": requeue,
                "nodes": "n[1-2]",
                "started": start,
                "ended": ended,
                "reason": "completed" if requeue == 2 else "bad nodes",
                "action": "none" if requeue == 2 else "requeue",
            }
        )
        for node in ("n1", "n2"):
            for attempt in range(2):
                at = start + 10 + attempt * 140
                for event in (
                    attempts.AttemptEvent(node, attempt, attempts.BEGIN, at),
                    attempts.AttemptEvent(node, attempt, attempts.FIRST, at + 8, 1),
                    attempts.AttemptEvent(node, attempt, attempts.END, at + 130, 500, at + 125),
                ):
                    attempts.append(job, requeue, event)
            ranks = (progress_notes.RankProgress(0, 500, 4.0, 0.3, 5.0),)
            note = progress_notes.NodeProgress(node, 1, ended, ranks)
            progress_notes.write(job, requeue, note)
    (folder / "history.json").write_text(
        json.dumps({"job_id": job_id, "max_requeues": 3, "runs": runs})
    )
    for index in range(20):
        saves.append(
            job.saves,
            saves.SaveRecord(index * 25, False, False, 0.4, 0.6, 10**6, 4, t0 + 30 + index * 55),
        )


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    state = args.dir or Path(tempfile.mkdtemp(prefix="hpclaunch-status-bench-"))
    box = Sandbox(state)
    try:
        box.up(SandboxSpec(nodes=2, mode=Mode.AUTO))
        env = client_env(box)
        argv = [
            "sbatch",
            "--parsable",
            "-N1",
            "-o",
            str(state / "sleep.out"),
            "--wrap",
            "sleep 600",
        ]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
        job_id = int(out.strip().split(";")[0])
        folder = state / "logs" / str(job_id)
        folder.mkdir(parents=True)
        job_folder(folder, job_id, time.time() - 1300)
        anchor, status, split = [], [], []
        for _ in range(args.rounds):
            anchor.append(timed(["scontrol", "show", "job", str(job_id)], env))
            status.append(
                timed(
                    [str(VENV_BIN / "hpclaunch"), "status", "--job-dir", str(folder), str(job_id)],
                    env,
                )
            )
            start = time.perf_counter()
            goodput.of_record(JobRecord.read(folder, job_id), None, time.time(), final=False)
            split.append(time.perf_counter() - start)
        subprocess.run(["scancel", str(job_id)], env=env, check=False)
    finally:
        left = box.down()
    print(f"{args.rounds} rounds, median (min-max), job folder with 3 runs x 2 nodes x 2 attempts")
    for name, values in (
        ("scontrol show job (anchor)", anchor),
        ("hpclaunch status", status),
        ("JobRecord.read + goodput", split),
    ):
        low, mid, high = min(values), statistics.median(values), max(values)
        print(f"  {name:<28} {mid * 1000:8.1f} ms ({low * 1000:.1f}-{high * 1000:.1f})")
    if left:
        raise SystemExit(f"sandbox down left {', '.join(left)}")


if __name__ == "__main__":
    main()
