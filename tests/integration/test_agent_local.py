"""The agent with real torch on this machine, as a one-node SLURM step would run it
(SLURM's variables set by the test): worker lifetime and in-place restarts."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from hpclaunch import procs
from tests.integration.helpers import LOCAL_JOB_IDS, VENV_BIN, base_env, wait_for

pytestmark = pytest.mark.integration

SLEEPER = """
import os, sys, time, pathlib
pathlib.Path(sys.argv[1], f"worker-{os.environ['RANK']}.pid").write_text(str(os.getpid()))
time.sleep(600)
"""

# Each worker reports the signals it gets; with IGNORE_TERM it ignores SIGTERM.
SIGNALLED = """
import os, signal, sys, time, pathlib
out = pathlib.Path(sys.argv[1])
rank = os.environ["RANK"]
def note(signum, frame):
    (out / f"signal-{rank}").write_text(str(signum))
    sys.exit(0)
signal.signal(signal.SIGUSR1, note)
signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("IGNORE_TERM") else note)
(out / f"worker-{rank}.pid").write_text(str(os.getpid()))
time.sleep(600)
"""

# Rank 1 crashes once, on the first attempt; the restarted group must then finish.
CRASH_ONCE = """
import os, sys, pathlib
import torch.distributed as dist
out = pathlib.Path(sys.argv[1])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if os.environ["RANK"] == "1" and attempt == 0:
    sys.exit(3)
dist.init_process_group("gloo")
import torch
value = torch.ones(1)
dist.all_reduce(value)
(out / f"rank-{os.environ['RANK']}").write_text(f"{attempt} {value.item():g}")
dist.destroy_process_group()
"""


# How workers are tied to the agent's life: forked from its zygote (the default), or
# started fresh with PATH holding setpriv (util-linux), or without it: then through
# worker_guard.py. Value: (PATH, the agent's --worker-start).
GUARDS = {
    "zygote": (None, "warm"),
    "setpriv": (None, "fresh"),
    "worker_guard": (str(VENV_BIN), "fresh"),
}


def agent_env(job_id: int, path: str | None = None, **extra: str) -> dict[str, str]:
    env = base_env(
        SLURM_JOB_ID=str(job_id),
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_NUM_NODES="1",
        SLURM_NODEID="0",
        SLURM_STEP_ID="0",
        **extra,
    )
    if path is not None:
        env["PATH"] = path
    return env


def agent(
    script: Path, out: Path, job_id: int, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            str(VENV_BIN / "hpclaunch"),
            "agent",
            "--nproc-per-node",
            "2",
            "--job-dir",
            str(out / "job"),
            *extra,
            str(script),
            str(out),
        ],
        env=env or agent_env(job_id),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def started_workers(out: Path) -> list[procs.Tracked]:
    pid_files = [out / f"worker-{rank}.pid" for rank in (0, 1)]
    wait_for(
        lambda: all(p.exists() and p.read_text() for p in pid_files), timeout_s=60, what="workers"
    )
    workers = [procs.Tracked.of(int(p.read_text())) for p in pid_files]
    assert all(w.alive() for w in workers)
    return workers


@pytest.mark.parametrize("guard", sorted(GUARDS))
def test_sigkill_of_the_agent_leaves_no_worker(tmp_path: Path, guard: str) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    job_id = random.randrange(LOCAL_JOB_IDS, 10**6)
    path, start = GUARDS[guard]
    env = agent_env(job_id, path)
    dry = subprocess.run(
        [str(VENV_BIN / "hpclaunch"), "agent", "--worker-start", start, "--dry-run", str(script)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    plan = json.loads(dry.stdout)
    launched_as = plan["launched_as"]
    assert plan["worker_start"] == start
    assert (guard == "setpriv") == launched_as[0].endswith("/setpriv")
    assert (guard == "worker_guard") == launched_as[2].endswith("/worker_guard.py")
    assert (guard == "zygote") == (launched_as[1:3] == ["-u", str(script)])
    with agent(script, tmp_path, job_id, "--worker-start", start, env=env) as proc:
        try:
            workers = started_workers(tmp_path)
            table = procs.parents()
            zygotes = {table[w.pid] for w in workers} - {proc.pid}
            assert len(zygotes) == (1 if guard == "zygote" else 0)
            assert all(table.get(z) == proc.pid for z in zygotes)
            workers += [procs.Tracked.of(z) for z in zygotes]
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            proc.kill()
    wait_for(lambda: not any(w.alive() for w in workers), timeout_s=10, what="the workers to die")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_reaches_every_worker_and_ends_the_agent(
    tmp_path: Path, sig: signal.Signals
) -> None:
    script = tmp_path / "signalled.py"
    script.write_text(SIGNALLED)
    with agent(script, tmp_path, random.randrange(LOCAL_JOB_IDS, 10**6)) as proc:
        try:
            workers = started_workers(tmp_path)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 128 + sig, err.decode()[-2000:]
    assert {p.name: p.read_text() for p in tmp_path.glob("signal-*")} == {
        "signal-0": str(int(sig)),
        "signal-1": str(int(sig)),
    }
    assert not any(w.alive() for w in workers)


def test_workers_that_ignore_the_signal_are_killed_after_the_grace_period(
    tmp_path: Path,
) -> None:
    script = tmp_path / "signalled.py"
    script.write_text(SIGNALLED)
    env = agent_env(random.randrange(LOCAL_JOB_IDS, 10**6), IGNORE_TERM="1")
    with agent(script, tmp_path, 0, "--grace-period", "2", env=env) as proc:
        try:
            workers = started_workers(tmp_path)
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
            took = time.monotonic() - signalled
        finally:
            proc.kill()
    assert proc.returncode == 143, err.decode()[-2000:]
    assert not any(w.alive() for w in workers)
    assert not list(tmp_path.glob("signal-*"))  # they ignored it: killed, not stopped
    # They were given the grace period, and not torch's default 30 s.
    assert 2 <= took < 25, took


@pytest.mark.slow
def test_one_worker_crash_costs_exactly_one_restart_every_time(tmp_path: Path) -> None:
    script = tmp_path / "crash_once.py"
    script.write_text(CRASH_ONCE)
    for run in range(20):
        out = tmp_path / f"run{run}"
        out.mkdir()
        with agent(
            script, out, random.randrange(LOCAL_JOB_IDS, 10**6), "--max-restarts", "1"
        ) as proc:
            _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"run {run}: {err.decode()[-2000:]}"
        results = {p.name: p.read_text() for p in out.glob("rank-*")}
        assert results == {"rank-0": "1 2", "rank-1": "1 2"}, f"run {run}: {results}"


@pytest.mark.parametrize("rdzv", ["c10d", "static"])
def test_a_taken_port_is_named_with_its_holder_and_the_fix(tmp_path: Path, rdzv: str) -> None:
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('the workers must not start')\n")
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [
                str(VENV_BIN / "hpclaunch"),
                "agent",
                "--rdzv",
                rdzv,
                "--nproc-per-node",
                "1",
                "--master-port",
                str(port),
                "--job-dir",
                str(tmp_path / "job"),
                str(script),
            ],
            env=agent_env(random.randrange(LOCAL_JOB_IDS, 10**6)),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, done.stderr
    said = f"the rendezvous port {port} on localhost (the first node) is already in use by pid "
    assert f"{said}{os.getpid()} (" in done.stderr, done.stderr
    assert "hpclaunch sbatch --master-port PORT" in done.stderr
    assert "Traceback" not in done.stderr and "C10d store has failed" not in done.stderr


def test_a_job_folder_it_cannot_write_is_one_line(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    subprocess.run(["mount", "--bind", str(shared), str(shared)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(shared)], check=True)
        done = subprocess.run(
            [
                str(VENV_BIN / "hpclaunch"),
                "agent",
                "--nproc-per-node",
                "1",
                "--job-dir",
                str(shared / "job"),
                str(tmp_path / "never.py"),
            ],
            env=agent_env(random.randrange(LOCAL_JOB_IDS, 10**6)),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        subprocess.run(["umount", str(shared)], check=True)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"Error: the job folder {shared / 'job'} cannot be written on localhost: Read-only file "
        f"system ({shared / 'job'}); give a folder every node can write, on a shared filesystem: "
        "hpclaunch sbatch --log-dir DIR (the job folder is DIR/JOBID), or --job-dir for "
        "hpclaunch agent"
    ], done.stderr
