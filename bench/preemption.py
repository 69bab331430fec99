"""Preemption on the SLURM sandbox: from the time-limit warning to the requeue, and
from the requeued job's start to its first training step.

A benchmark, not a test. Each run submits ``examples/train.py`` (2 nodes x 2
workers) with ``hpclaunch sbatch``, waits for its checkpoint of step 4, sends the
warning as SLURM would (``scancel --signal=USR1 --batch``), and measures

- warning → requeued: until SLURM's ``Restarts`` count of the job goes up (the
  workers have checkpointed, every process has exited, and the supervisor has run
  ``scontrol requeue``);
- start → first step: from the moment the requeued job's batch step starts (its
  supervisor's start time in history.json, so SLURM's hold after a requeue is not
  counted) to the end of the first training step after the resume.

    .venv/bin/python bench/preemption.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hpclaunch.sandbox.cluster import Sandbox
from hpclaunch.sandbox.conf import Mode, SandboxSpec
from hpclaunch.sandbox.daemons import SBIN_PATH
from hpclaunch.slurm.commands import parse_show_job
from hpclaunch.slurm.states import is_final

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "train.py"


def fields(job: int, env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "show", "job", str(job)], env=env, capture_output=True, text=True, check=True
    ).stdout
    return parse_show_job(out)


def wait(condition: Callable[[], bool], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the job took too long")
        time.sleep(0.02)


def one_run(work: Path, env: dict[str, str]) -> tuple[float, float]:
    work.mkdir()
    shutil.copy(TRAIN, work / "train.py")
    submitted = subprocess.run(
        [
            "hpclaunch",
            "sbatch",
            "--nodes",
            "2",
            "--nproc-per-node",
            "2",
            "--gpus-per-node",
            "0",
            "train.py",
            "--steps",
            "20",
            "--step-time",
            "0.1",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    job = int(submitted.stdout)
    job_dir = work / "hpclaunch-logs" / str(job)
    wait(lambda: (job_dir / "checkpoints" / f"step-{4:012d}.pt").exists())
    warned = time.time()
    subprocess.run(["scancel", "--signal=USR1", "--batch", str(job)], env=env, check=True)
    wait(lambda: fields(job, env).get("Restarts") == "1")
    requeued = time.time()
    wait(lambda: is_final(fields(job, env)["JobState"]))
    runs = json.loads((job_dir / "history.json").read_text())["runs"]
    log = (work / "hpclaunch-logs" / f"train-{job}.out").read_text()
    firsts = [
        json.loads(line.split("FIRST_STEP ", 1)[1])
        for line in log.splitlines()
        if line.startswith("[rank0] FIRST_STEP ")
    ]
    if len(runs) != 2 or len(firsts) != 2:
        raise RuntimeError(f"job {job}: expected two runs, got {runs} and {firsts}")
    return requeued - warned, float(firsts[1]["time"]) - float(runs[1]["started"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpclaunch-bench-") as tmp:
        work = Path(tmp)
        box = Sandbox(work / "sandbox")
        lay = box.up(SandboxSpec(nodes=2, mode=Mode.AUTO))
        env = dict(os.environ)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}:{SBIN_PATH}"
        env.update(box.env())
        samples: list[tuple[float, float]] = []
        try:
            for run in range(args.runs):
                samples.append(one_run(work / f"run{run}", env))
        finally:
            left = box.down()
            if left:
                print(f"sandbox down left {left}", file=sys.stderr)
    print(
        f"2 nodes x 2 workers, gloo, {lay.mode.value} sandbox, {args.runs} runs; "
        f"{os.cpu_count()} CPUs\n"
    )
    print("| interval | median (s) | min (s) | max (s) |\n|---|---:|---:|---:|")
    for name, values in (
        ("warning → requeued", [s[0] for s in samples]),
        ("start → first step", [s[1] for s in samples]),
    ):
        print(
            f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
