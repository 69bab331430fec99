"""What a training script starts in the background ends with its worker group: one
process in the worker's process group, one in a new session (setsid), one daemon
forked twice; after a normal end, after a restart in place, and in a SLURM job."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from pathlib import Path

import pytest

from hpclaunch import procs
from tests.integration.helpers import LOCAL_JOB_IDS, VENV_BIN
from tests.integration.sandbox_fixture import Running
from tests.integration.test_agent import finished, job_env
from tests.integration.test_agent_local import agent, agent_env

pytestmark = pytest.mark.integration

# What each background process sleeps for: found in its command line.
MARK = "4242.5"

# Each worker starts the three, waits until each has written its pid, then ends:
# with 0, or with 3 for rank 1 of a first attempt where CRASH_FIRST is set (rank 0
# then waits to be stopped). A worker of a later attempt first notes which
# processes of the attempts before it still run.
BACKGROUND = f"""
import os, pathlib, shlex, subprocess, sys, time
out = pathlib.Path(sys.argv[1])
rank, attempt = os.environ["RANK"], int(os.environ["TORCHELASTIC_RESTART_COUNT"])

def alive(pid):
    try:
        state = pathlib.Path(f"/proc/{{pid}}/stat").read_text().rsplit(")", 1)[1].split()[0]
        argv = pathlib.Path(f"/proc/{{pid}}/cmdline").read_bytes().split(b"\\0")
    except OSError:
        return False
    return state != "Z" and b"{MARK}" in argv

if attempt > 0:
    earlier = [p for p in out.glob("bg-*.pid") if int(p.stem.split("-")[2]) < attempt]
    left = [p.name for p in earlier if alive(int(p.read_text()))]
    (out / f"left-at-start-{{attempt}}-{{rank}}").write_text(" ".join(left))

def script(kind):
    pid_file = shlex.quote(str(out / f"bg-{{kind}}-{{attempt}}-{{rank}}.pid"))
    return f"echo $$ > {{pid_file}}.tmp && mv {{pid_file}}.tmp {{pid_file}} && exec sleep {MARK}"

subprocess.Popen(["sh", "-c", script("group")])
subprocess.Popen(["sh", "-c", script("session")], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sh", ["sh", "-c", script("daemon")])
    os._exit(0)
os.wait()

def started(ranks):
    return all((out / f"bg-{{k}}-{{attempt}}-{{r}}.pid").exists()
               for k in ("group", "session", "daemon") for r in ranks)

while not started([rank]):
    time.sleep(0.01)
if os.environ.get("CRASH_FIRST") and attempt == 0:
    if rank == "1":
        while not started(["0", "1"]):
            time.sleep(0.01)
        sys.exit(3)
    time.sleep(600)
"""


# The agent's side, without torch: its own children (one in its session, as the zygote
# is, one in a session of its own and spared, as the etcd sidecar is) and a "worker" in
# a session of its own, owned as torch's fresh workers are, that leaves an orphan that
# ends, one in a session of its own (setsid) that ends, one that runs on and one that
# ignores SIGTERM, then ends with status 7 unread. Prints what became of each.
AGENT_SIDE = f"""
import json, logging, os, shlex, subprocess, sys, time
from hpclaunch import procs
from hpclaunch.node.sweep import Sweeper, become_subreaper

out, pidfds = sys.argv[1], sys.argv[2] == "pidfds"
logging.basicConfig(level=logging.INFO)
def until(condition):
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)

quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
helper = subprocess.Popen(["sleep", "{MARK}"], start_new_session=True, **quiet)
own = subprocess.Popen(["sleep", "{MARK}"], **quiet)
names = ("short", "leader", "long", "deaf")
def orphan(name, then, setsid=""):
    return f"({{setsid}}sh -c {{shlex.quote(f'echo $$ > {{out}}/{{name}}; {{then}}')}} &); "
def running(pid):
    found = procs.proc(pid)
    return found is not None and not found.zombie
def adopted_zombie(pid):
    found = procs.proc(pid)
    return found is not None and found.zombie and found.ppid == os.getpid()
try:
    assert become_subreaper()
    sweeper = Sweeper(spared=[helper.pid], grace_s=0.3, pidfds=pidfds)
    worker = subprocess.Popen(["sh", "-c", orphan("short", "exec sleep 0.1")
        + orphan("leader", "exec sleep 0.1", setsid="setsid ")
        + orphan("long", "exec sleep {MARK}") + orphan("deaf", "trap '' TERM; exec sleep {MARK}")
        + "exit 7"], start_new_session=True, **quiet)
    until(lambda: all(os.path.exists(f"{{out}}/{{name}}") for name in names))
    short, leader, long, deaf = (int(open(f"{{out}}/{{name}}").read()) for name in names)
    assert procs.proc(leader).session == leader
    until(lambda: adopted_zombie(short) and adopted_zombie(leader)
          and procs.proc(worker.pid).zombie)
    sweeper.reap(owned=[worker.pid])
    reaped = procs.proc(short) is None
    leader_reaped = procs.proc(leader) is None
    swept = sweeper.sweep("in the test", owned=[worker.pid])
    print(json.dumps({{
        "worker_status": worker.wait(), "short_reaped": reaped,
        "leader_reaped": leader_reaped, "swept": swept,
        "long_running": running(long), "deaf_running": running(deaf),
        "helper_running": helper.poll() is None, "own_running": own.poll() is None,
    }}))
finally:  # nothing left behind, whatever failed
    left = [int(open(f"{{out}}/{{name}}").read() or 0) for name in names
            if os.path.exists(f"{{out}}/{{name}}")]
    for pid in [helper.pid, own.pid, *left]:
        if pid and running(pid) and "{MARK}" in procs.command_line(pid):
            os.kill(pid, 9)
"""


# Without pidfds (kernels before 5.3) processes are signalled and watched by pid.
@pytest.mark.parametrize("by", ["pidfds", "pids"])
def test_the_sweep_leaves_the_agents_own_children_alone(tmp_path: Path, by: str) -> None:
    script = tmp_path / "agent_side.py"
    script.write_text(AGENT_SIDE)
    done = subprocess.run(
        [str(VENV_BIN / "python"), str(script), str(tmp_path), by],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "worker_status": 7,  # not read by the reaping: torch reads its workers' status
        "short_reaped": True,
        "leader_reaped": True,  # a worker's setsid child that ended: no zombie left
        "swept": 2,
        "long_running": False,
        "deaf_running": False,
        "helper_running": True,
        "own_running": True,
    }
    assert "ending 2 processes the workers left running in the test" in done.stderr
    assert "1 of them outlived SIGTERM by 0.3 s: SIGKILL" in done.stderr
    assert "still running" not in done.stderr


def alive(pid: int) -> bool:
    """Whether ``pid`` is still one of the background sleeps (a zombie is dead)."""
    found = procs.proc(pid)
    return found is not None and not found.zombie and MARK in procs.command_line(pid)


def still_running(out: Path, count: int) -> list[str]:
    """The background processes (``count`` of them) that still run, by pid file; each
    is killed, so that a failing test leaves none behind."""
    pids = {f.stem: int(f.read_text()) for f in sorted(out.glob("bg-*.pid"))}
    running = [name for name, pid in pids.items() if alive(pid)]
    for name in running:
        os.kill(pids[name], signal.SIGKILL)
    assert len(pids) == count, sorted(pids)
    return running


@pytest.mark.parametrize("start", ["warm", "fresh"])
def test_background_processes_end_with_the_agent(tmp_path: Path, start: str) -> None:
    script = tmp_path / "background.py"
    script.write_text(BACKGROUND)
    with agent(
        script, tmp_path, random.randrange(LOCAL_JOB_IDS, 10**6), "--worker-start", start
    ) as proc:
        _, err = proc.communicate(timeout=120)
    log = err.decode()
    assert not still_running(tmp_path, 6)  # three for each of the two workers
    assert proc.returncode == 0, log[-3000:]
    assert "ending 6 processes the workers left running as the agent ends" in log, log[-3000:]
    assert f"sleep {MARK}" in log


# The etcd sidecar is a child of the agent in a session of its own, as the workers'
# leftovers are: it must outlive the restart's sweep, or the second round fails.
RESTARTS = {
    "warm": ("--worker-start", "warm"),
    "fresh": ("--worker-start", "fresh"),
    "sidecar": ("--rdzv", "etcd", "--etcd-sidecar"),
}


@pytest.mark.parametrize("case", sorted(RESTARTS))
def test_background_processes_end_when_the_group_restarts(tmp_path: Path, case: str) -> None:
    script = tmp_path / "background.py"
    script.write_text(BACKGROUND)
    env = agent_env(random.randrange(LOCAL_JOB_IDS, 10**6), CRASH_FIRST="1")
    extra = (*RESTARTS[case], "--max-restarts", "1")
    with agent(script, tmp_path, 0, *extra, env=env) as proc:
        _, err = proc.communicate(timeout=120)
    log = err.decode()
    assert not still_running(tmp_path, 12)  # two attempts of two workers
    assert proc.returncode == 0, log[-3000:]
    # The first attempt's were gone before the second attempt's workers started.
    left = {p.name: p.read_text() for p in tmp_path.glob("left-at-start-*")}
    assert left == {"left-at-start-1-0": "", "left-at-start-1-1": ""}
    assert "processes the workers left running after the worker group stopped" in log
    assert "ending 6 processes the workers left running as the agent ends" in log
    assert "etcd" not in "".join(line for line in log.splitlines() if "ending " in line)


def test_background_processes_end_with_the_slurm_job(sandbox: Running, tmp_path: Path) -> None:
    script = tmp_path / "background.py"
    script.write_text(BACKGROUND)
    out = tmp_path / "out"
    out.mkdir()
    env = job_env(sandbox)
    submitted = subprocess.run(
        [
            str(VENV_BIN / "hpclaunch"),
            "sbatch",
            "--log-dir",
            "logs",
            "--gpus-per-node",
            "0",
            "--nodes",
            "2",
            "--nproc-per-node",
            "2",
            "background.py",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout)
    state = finished(env, job_id)
    log = (tmp_path / "logs" / f"background-{job_id}.out").read_text()
    # Three for each of two workers on each of two nodes.
    assert not still_running(out, 12), log[-3000:]
    assert state == "COMPLETED", log[-3000:]
    assert log.count("ending 6 processes the workers left running as the agent ends") == 2, log
