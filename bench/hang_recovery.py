"""A hung rank, until every rank trains again: `hpclaunch agent --hang-timeout` against
`torchrun`, on one node, with the same script and the same hang.

A benchmark, not a test. No SLURM: each launcher runs here as one node of a job, the
agent with SLURM's variables set as a one-node step would have them (as
tests/integration/test_agent_local.py runs it). The script (2 ranks, gloo, CPU torch)
trains ``torch.nn.Linear(16, 16)`` with SGD, one all_reduce of the gradient and one
optimizer step per step, 0.05 s apart; every rank appends a line with its wall clock to
its own file after init and after each step. On the first attempt
(TORCHELASTIC_RESTART_COUNT 0) rank 1 writes its clock to a file and stops itself
(SIGSTOP) before step STOP_AT; rank 0 then waits in the all_reduce. The figure is the
time from that clock to the first step that every rank of the restarted attempt
completed. Launchers, in each round in turn:

- ``hpclaunch agent --nproc-per-node 2 --max-restarts 1 --hang-timeout T`` (warm
  workers, the default); its hang report in the job folder says when the hang was found;
- ``torchrun --standalone --nproc-per-node 2 --max-restarts 1``, the script on torch's
  default process-group timeout (it has no hang detection of its own);
- the same, the script passing ``timeout=timedelta(seconds=G)`` to
  ``init_process_group``: rank 0's all_reduce then fails after G s, and torchrun
  restarts the group.

torchrun gets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with its shared store its restarted
workers sometimes hang (see docs/benchmarks.md). A launcher that has not recovered
``--limit`` seconds after the stop counts as "never", and is stopped. Every process a
run started (the launcher, everything seen below it, everything carrying the run's
marker in its environment) gets SIGKILL at its end, which wakes a stopped worker too;
the benchmark then checks with ps that nothing of it is left.

    .venv/bin/python bench/hang_recovery.py [--runs 3] [--hang-timeout 10] [--limit 120]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hpclaunch import procs
from hpclaunch.node import hangs

STOP_AT = 20  # the step before which rank 1 stops itself
MARKER = "HPCLAUNCH_BENCH_RUN"

TRAIN = """
import datetime, os, signal, sys, time
out, gloo_timeout_s, stop_at = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
import torch
import torch.distributed as dist
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
options = {"timeout": datetime.timedelta(seconds=gloo_timeout_s)} if gloo_timeout_s else {}
dist.init_process_group("gloo", **options)
rank = dist.get_rank()
log = open(os.path.join(out, f"rank-{rank}.log"), "a", buffering=1)
log.write(f"{attempt} init {time.time()!r}\\n")
torch.manual_seed(0)
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 16)
try:
    for step in range(stop_at + 10 if attempt == 0 else 10):
        if attempt == 0 and rank == 1 and step == stop_at:
            with open(os.path.join(out, "stopped"), "w") as file:
                file.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        dist.all_reduce(model.weight.grad)
        opt.step()
        log.write(f"{attempt} {step} {time.time()!r}\\n")
        time.sleep(0.05)
except Exception as exc:
    log.write(f"{attempt} error {time.time()!r} {type(exc).__name__}\\n")
    raise
dist.destroy_process_group()
"""


@dataclass(frozen=True)
class Outcome:
    recovered_s: float | None  # stop -> first step of every rank after the restart
    found_s: float | None  # stop -> hang found (hpclaunch's report)
    error_s: float | None  # stop -> rank 0's collective failed (torchrun with a timeout)
    init_s: float | None  # stop -> every restarted rank past init_process_group
    note: str


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def lines(out: Path) -> dict[int, list[tuple[int, str, float]]]:
    """rank -> its (attempt, step or "init"/"error", wall clock) lines."""
    found: dict[int, list[tuple[int, str, float]]] = {}
    for path in out.glob("rank-*.log"):
        rank = int(path.stem.split("-")[1])
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                found.setdefault(rank, []).append((int(parts[0]), parts[1], float(parts[2])))
    return found


def all_ranks(seen: dict[int, list[tuple[int, str, float]]], what: str) -> float | None:
    """When every rank had written its first ``what`` line ("init", "step") of an attempt
    after the first; None before."""
    firsts = []
    for rank in (0, 1):
        times = [
            t
            for a, s, t in seen.get(rank, [])
            if a > 0 and (s == what or (what == "step" and s.isdigit()))
        ]
        if not times:
            return None
        firsts.append(min(times))
    return max(firsts)


def stop_everything(
    launcher: subprocess.Popen[bytes], tracked: set[procs.Tracked], marker: str
) -> list[str]:
    """SIGKILL the launcher and every process the run started (see the module); what is
    still alive 10 s later, as ps lines."""
    for pid in procs.with_environ(f"{MARKER}={marker}".encode()):
        try:
            tracked.add(procs.Tracked.of(pid))
        except ProcessLookupError:
            continue
    launcher.kill()
    for proc in tracked:
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)  # also ends a stopped process
    launcher.wait()
    deadline = time.monotonic() + 10
    while any(p.alive() for p in tracked) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [f"{p.pid} {procs.command_line(p.pid)}" for p in tracked if p.alive()]


def one_run(
    name: str, argv: list[str], env: dict[str, str], out: Path, limit_s: float, job: Path | None
) -> Outcome:
    marker = f"{os.getpid()}-{out.name}"
    env = {**env, MARKER: marker, "TMPDIR": str(out / "tmp")}
    (out / "tmp").mkdir(parents=True)
    with open(out / "launcher.log", "wb") as log:
        launcher = subprocess.Popen(
            argv, env=env, cwd=out, stdout=log, stderr=log, start_new_session=True
        )
    tracked = {procs.Tracked.of(launcher.pid)}
    start, note = time.monotonic(), ""
    recovered: float | None = None
    try:
        while True:
            for pid in procs.descendants(launcher.pid):
                try:
                    tracked.add(procs.Tracked.of(pid))
                except ProcessLookupError:
                    continue
            stop_file = out / "stopped"
            stopped_at = float(stop_file.read_text()) if stop_file.exists() else None
            seen = lines(out)
            recovered = all_ranks(seen, "step")
            if recovered is not None:
                try:  # the restarted attempt's 10 steps, then the exit
                    launcher.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    note = "recovered, but the launcher had not exited 60 s later"
                break
            if launcher.poll() is not None:
                note = f"the launcher exited {launcher.returncode} before recovering"
                break
            waited = time.time() - stopped_at if stopped_at else time.monotonic() - start
            if waited > (limit_s if stopped_at else 120):
                note = (
                    f"never within the run's limit of {limit_s:g} s"
                    if stopped_at
                    else ("no stop within 120 s of the launch")
                )
                break
            time.sleep(0.05)
    finally:
        left = stop_everything(launcher, tracked, marker)
    if left:
        raise RuntimeError(f"{name}: processes left after SIGKILL: {left}")
    if recovered is None or not stopped_at:
        if not note:
            note = "no recovery"
        return Outcome(None, None, None, None, note)
    found = None
    if job is not None:
        reports = list((job / "hangs").glob("requeue-*/attempt-0-node-*.json"))
        if reports:
            report = json.loads(reports[0].read_text())
            found = report["time"] - stopped_at
            note = f"{report['reason']}; named rank {report['culprits']}: {report['how']}"
    errors = [t for a, s, t in seen.get(0, []) if a == 0 and s == "error"]
    init = all_ranks(seen, "init")
    return Outcome(
        recovered - stopped_at,
        found,
        errors[0] - stopped_at if errors else None,
        init - stopped_at if init is not None else None,
        note,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hang-timeout", type=float, default=10.0)
    parser.add_argument(
        "--gloo-timeout",
        type=float,
        default=30.0,
        help="the collective timeout of the torchrun variant that sets one",
    )
    parser.add_argument(
        "--limit",
        type=float,
        default=120.0,
        help="seconds after the stop before a run counts as not recovered",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the run's folder (logs, hang reports) and print its path",
    )
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    base = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
    }
    results: dict[str, list[Outcome]] = {}
    before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="hpclaunch-bench-"))
    try:
        script = work / "train.py"
        script.write_text(TRAIN)
        for run in range(args.runs):
            job_id = random.randrange(10**6, 10**7)
            variants = {
                f"hpclaunch agent --hang-timeout {args.hang_timeout:g}": (
                    [
                        str(bin_dir / "hpclaunch"),
                        "agent",
                        "--nproc-per-node",
                        "2",
                        "--max-restarts",
                        "1",
                        "--hang-timeout",
                        f"{args.hang_timeout:g}",
                        "--master-port",
                        str(free_port()),
                        "--job-dir",
                        "JOB",
                        str(script),
                    ],
                    {
                        **base,
                        "SLURM_JOB_ID": str(job_id),
                        "SLURM_JOB_NODELIST": "localhost",
                        "SLURM_JOB_NUM_NODES": "1",
                        "SLURM_NODEID": "0",
                        "SLURM_STEP_ID": "0",
                    },
                    0.0,
                ),
                "torchrun, default process-group timeout": (
                    [
                        str(bin_dir / "torchrun"),
                        "--standalone",
                        "--nproc-per-node",
                        "2",
                        "--max-restarts",
                        "1",
                        str(script),
                    ],
                    {**base, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
                    0.0,
                ),
                f"torchrun, gloo timeout {args.gloo_timeout:g} s": (
                    [
                        str(bin_dir / "torchrun"),
                        "--standalone",
                        "--nproc-per-node",
                        "2",
                        "--max-restarts",
                        "1",
                        str(script),
                    ],
                    {**base, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
                    args.gloo_timeout,
                ),
            }
            for index, (name, (argv, env, gloo_s)) in enumerate(variants.items()):
                out = work / f"run{run}-{index}"
                job = out / "job"
                argv = [str(job) if a == "JOB" else a for a in argv]
                argv += [str(out), f"{gloo_s:g}", str(STOP_AT)]
                outcome = one_run(name, argv, env, out, args.limit, job if index == 0 else None)
                results.setdefault(name, []).append(outcome)
                print(f"run {run} {name}: {outcome}", file=sys.stderr, flush=True)
                if index == 0:
                    for folder in Path("/dev/shm").glob(f"hpclaunch-{job_id}-*"):
                        print(f"left in node memory: {folder}", file=sys.stderr)
        leftover = subprocess.run(
            ["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True, check=True
        ).stdout
        left = [line for line in leftover.splitlines() if str(work) in line]
    finally:
        if args.keep:
            print(f"the run's folder: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    report(args, results, before, left)
    return 1 if left else 0


def report(
    args: argparse.Namespace, results: dict[str, list[Outcome]], load_before: float, left: list[str]
) -> None:
    print(
        f"1 node x 2 ranks, gloo, CPU; rank 1 SIGSTOPs itself before step {STOP_AT} of the "
        f"first attempt; {args.runs} runs per launcher, in turn; limit {args.limit:g} s after "
        f"the stop; {os.cpu_count()} CPUs; hpclaunch checks progress every "
        f"{hangs.CHECK_S:g} s\n"
    )
    print(
        "| launcher | stop → every rank stepping again (s): median | min | max "
        "| stop → hang found / collective error (s) | stop → restarted ranks initialised (s) |"
    )
    print("|---|---:|---:|---:|---:|---:|")

    def cell(values: list[float | None]) -> str:
        known = [v for v in values if v is not None]
        return f"{statistics.median(known):.2f}" if known else "-"

    notes = []
    for name, outcomes in results.items():
        times = [o.recovered_s for o in outcomes if o.recovered_s is not None]
        never = len(outcomes) - len(times)
        if times:
            head = f"{statistics.median(times):.2f} | {min(times):.2f} | {max(times):.2f}"
            if never:
                head = f"{head} ({never} of {len(outcomes)} never)"
        else:
            head = f"never within {args.limit:g} s | - | -"
        found = [o.found_s if o.found_s is not None else o.error_s for o in outcomes]
        print(f"| {name} | {head} | {cell(found)} | {cell([o.init_s for o in outcomes])} |")
        notes += sorted({f"{name}: {o.note}" for o in outcomes if o.note})
    print()
    for line in notes:
        print(line)
    print(f"load average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print("left behind (ps, processes running a file of the run):", "; ".join(left) or "none")


if __name__ == "__main__":
    sys.exit(main())
