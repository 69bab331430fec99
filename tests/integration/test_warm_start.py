"""Workers forked from the agent's zygote (``--worker-start warm``, the default) against
fresh interpreters (``fresh``, torchrun's way), on this machine with real torch: the
worker must not be able to tell them apart."""

from __future__ import annotations

import json
import random
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration.helpers import LOCAL_JOB_IDS, VENV_BIN, base_env

pytestmark = pytest.mark.integration

# Each rank writes what a script can see of how it was started.
REPORT = """
import json, logging, multiprocessing, os, random, signal, sys
import sibling  # next to this script: its folder must be on sys.path
import numpy
import torch

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
logging.getLogger("report").info("logging set up by the script")
handlers = {}
for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGCHLD", "SIGHUP",
             "SIGWINCH"):
    h = signal.getsignal(getattr(signal, name))
    handlers[name] = getattr(h, "__name__", str(h))
report = {
    "argv": sys.argv, "path0": sys.path[0], "name": __name__, "sibling": sibling.VALUE,
    "cwd": os.getcwd(), "session_leader": os.getsid(0) == os.getpid(),
    "env": {k: v for k, v in os.environ.items()},
    "start_method": multiprocessing.get_start_method(),
    "threads": torch.get_num_threads(), "handlers": handlers,
    "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "root_handlers": len(logging.getLogger().handlers),
    "excepthook": sys.excepthook is sys.__excepthook__,
    "cuda_initialized": torch.cuda.is_initialized(),
    "stdout_tty": sys.stdout.isatty(),
    "random": random.random(), "numpy_random": numpy.random.random(),
    # numpy's OpenBLAS: the agent loads it with one thread, a worker gets its own count.
    "threads": len(os.listdir("/proc/self/task")),
    "cmdline": open("/proc/self/cmdline").read().split(chr(0))[1:3],
    "dunders": sorted(k for k in dict(globals()) if k.startswith("__")),
    "file": __file__, "cached": __cached__,
    "spec": [getattr(__spec__, "name", None), getattr(__spec__, "origin", None)],
    "main_module": sys.modules["__main__"].__dict__ is globals(),
}
out = os.environ["OUT"]
with open(os.path.join(out, f"report-{os.environ['RANK']}.json"), "w") as f:
    json.dump(report, f)
"""

# Environment variables that differ between any two runs, whatever the start.
# Differ between the two runs (each has its own agent), not between the starts.
VOLATILE = {
    "TORCHELASTIC_RUN_ID",
    "MASTER_PORT",
    "TORCHELASTIC_ERROR_FILE",
    "OUT",
    "HPCLAUNCH_WATCHER_PID",
}


def same_env(env: dict[str, object]) -> dict[str, object]:
    """``env`` without what differs between any two agents: each agent's own node-local
    folder (named by its pid and start without a submission stamp) is written as
    NODE_LOCAL in the paths under it."""
    local = str(env.get("HPCLAUNCH_LOCAL_CHECKPOINT_DIR", ""))
    assert "/hpclaunch-u" in local, env
    return {
        key: value.replace(local, "NODE_LOCAL") if isinstance(value, str) else value
        for key, value in env.items()
        if key not in VOLATILE
    }


# How the script ends, and what the agent must make of it: (code, exit status).
ENDINGS = {
    "sys.exit()": ("import sys\nprint('bye')\nsys.exit()\n", 0),
    "sys.exit(3)": ("import sys\nprint('bye')\nsys.exit(3)\n", 3),
    "sys.exit('message')": ("import sys\nsys.exit('the reason')\n", 1),
    "os._exit(0)": ("import os, sys\nprint('bye', flush=True)\nos._exit(0)\n", 0),
    "raise": (
        "import atexit\natexit.register(lambda: print('atexit ran'))\n"
        "print('printed before the crash')\n"
        "def inner():\n    raise ValueError('bad value')\ninner()\n",
        1,
    ),
    "falls off the end": (
        "import atexit, threading, time\natexit.register(lambda: print('atexit ran'))\n"
        "t = threading.Thread(target=lambda: (time.sleep(0.5), print('thread done')))\n"
        "t.start()\n",
        0,
    ),
}


def run_agent(
    script: Path,
    start: str,
    job_dir: Path,
    *,
    env_extra: dict[str, str] | None = None,
    nproc: int = 2,
    max_restarts: int = 0,
    job_id: int | None = None,
    module: bool = False,
    ignored: tuple[signal.Signals, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """The agent on ``script``, or with ``module`` on ``-m`` and the script's stem;
    ``ignored``: signals the agent starts with ignored (as under nohup)."""

    def ignore() -> None:
        for sig in ignored:
            signal.signal(sig, signal.SIG_IGN)

    env = base_env(
        SLURM_JOB_ID=str(job_id or random.randrange(LOCAL_JOB_IDS, 10**6)),
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_NUM_NODES="1",
        SLURM_NODEID="0",
        SLURM_STEP_ID="0",
        **(env_extra or {}),
    )
    return subprocess.run(
        [
            str(VENV_BIN / "hpclaunch"),
            "agent",
            "--worker-start",
            start,
            "--nproc-per-node",
            str(nproc),
            "--max-restarts",
            str(max_restarts),
            "--job-dir",
            str(job_dir),
            *(["-m", script.stem] if module else [str(script)]),
        ],
        env=env,
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=ignore if ignored else None,
    )


def reports(out: Path) -> dict[int, dict[str, object]]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("report-*")}


@pytest.mark.parametrize("entry", ["script", "module"])
def test_a_warm_worker_sees_what_a_fresh_one_sees(tmp_path: Path, entry: str) -> None:
    code = tmp_path / "code"
    code.mkdir()
    script = code / "report.py"
    script.write_text(REPORT)
    (code / "sibling.py").write_text("VALUE = 42\n")
    seen = {}
    job_id = random.randrange(LOCAL_JOB_IDS, 10**6)
    for start in ("fresh", "warm"):
        out = tmp_path / start
        out.mkdir()
        done = run_agent(
            script,
            start,
            tmp_path / f"job-{start}",
            env_extra={"OUT": str(out)},
            job_id=job_id,
            module=entry == "module",
            # torch handles SIGHUP (an exec then resets it), not SIGWINCH (ignored stays).
            ignored=(signal.SIGHUP, signal.SIGWINCH),
        )
        assert done.returncode == 0, done.stderr[-3000:]
        seen[start] = reports(out)
        assert sorted(seen[start]) == [0, 1]
        # The script's own logging.basicConfig took effect (not the agent's set-up).
        logs = sorted((tmp_path / f"job-{start}" / "logs").rglob("rank-0.err"))
        assert "INFO logging set up by the script" in logs[-1].read_text()
    for rank in (0, 1):
        fresh, warm = dict(seen["fresh"][rank]), dict(seen["warm"][rank])
        fresh_env, warm_env = fresh.pop("env"), warm.pop("env")
        assert isinstance(fresh_env, dict) and isinstance(warm_env, dict)
        assert same_env(warm_env) == same_env(fresh_env)
        for volatile in ("random", "numpy_random", "cmdline"):
            fresh.pop(volatile), warm.pop(volatile)
        assert warm == fresh
        assert fresh["argv"][0] == str(script)  # python -m gives the module's path too
    assert seen["warm"][0]["name"] == "__main__"
    assert seen["warm"][0]["main_module"] is True
    assert seen["warm"][0]["file"] == str(script)
    assert seen["warm"][0]["path0"] == str(code)
    assert seen["warm"][0]["cuda_initialized"] is False
    # Each warm rank seeds its own random state, as each fresh interpreter does.
    assert seen["warm"][0]["random"] != seen["warm"][1]["random"]
    assert seen["warm"][0]["numpy_random"] != seen["warm"][1]["numpy_random"]
    # And the warm workers were forked (a fork shows the agent's command line), not
    # started fresh after a failed fork.
    script_args = ["-u", str(script)] if entry == "script" else ["-u", "-m"]
    assert seen["fresh"][0]["cmdline"] == script_args
    assert seen["warm"][0]["cmdline"] != script_args
    assert seen["fresh"][0]["handlers"]["SIGHUP"] == "0"  # SIG_DFL: the case is real
    assert seen["fresh"][0]["handlers"]["SIGWINCH"] == "1"  # SIG_IGN


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_warm_worker_ends_as_python_would(tmp_path: Path, ending: str) -> None:
    body, status = ENDINGS[ending]
    script = tmp_path / "end.py"
    script.write_text(body)
    done = run_agent(script, "warm", tmp_path / "job", nproc=1)
    assert (done.returncode == 0) == (status == 0), done.stderr[-3000:]
    [err] = (tmp_path / "job" / "logs").rglob("rank-0.err")
    [out] = (tmp_path / "job" / "logs").rglob("rank-0.out")
    if status:
        assert f"exit code {status}" in done.stderr
    if ending == "raise":
        text = err.read_text()
        assert "printed before the crash" in out.read_text()
        assert "atexit ran" in out.read_text()
        # The traceback starts at the script, as python's own does.
        assert text.startswith(f'Traceback (most recent call last):\n  File "{script}", line')
        assert "runpy" not in text and "zygote" not in text
        assert text.rstrip().endswith("ValueError: bad value")
    if ending == "sys.exit('message')":
        assert err.read_text() == "the reason\n"
    if ending == "falls off the end":
        assert out.read_text() == "thread done\natexit ran\n"


def test_a_warm_restart_runs_a_new_fork_each_attempt(tmp_path: Path) -> None:
    script = tmp_path / "flaky.py"
    script.write_text(
        "import os, sys\n"
        "print(os.getpid(), os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
        "sys.exit(0 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '2' else 5)\n"
    )
    done = run_agent(script, "warm", tmp_path / "job", nproc=1, max_restarts=2)
    assert done.returncode == 0, done.stderr[-3000:]
    outs = sorted((tmp_path / "job" / "logs").rglob("rank-0.out"))
    lines = [p.read_text().split() for p in outs]
    assert [count for _, count in lines] == ["0", "1", "2"]
    assert len({pid for pid, _ in lines}) == 3


def test_workers_start_fresh_once_the_zygote_is_gone(tmp_path: Path) -> None:
    # Rank 0 kills the zygote, its parent, on the first attempt: every worker dies with
    # it, the agent counts that as a failed attempt and starts the next one fresh.
    script = tmp_path / "orphan.py"
    script.write_text(
        "import os, signal, subprocess, sys, time\n"
        "attempt = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
        "cmdline = open('/proc/self/cmdline').read().split(chr(0))\n"
        "print(attempt, cmdline[1:3] == ['-u', sys.argv[0]], flush=True)\n"
        "if attempt == '0' and os.environ['RANK'] == '1':  # a child in its group\n"
        "    child = subprocess.Popen(['sleep', '60'])\n"
        "    open('child', 'w').write(str(child.pid))\n"
        "open(f'started-{attempt}-{os.environ[\"RANK\"]}', 'w').close()\n"
        "parent = open(f'/proc/{os.getppid()}/cmdline').read().split(chr(0))\n"
        "if attempt == '0' and os.environ['RANK'] == '0' and parent == cmdline:\n"
        "    while not os.path.exists('started-0-1'):  # rank 1 and its child are there\n"
        "        time.sleep(0.01)\n"
        "    os.kill(os.getppid(), signal.SIGKILL)  # the zygote, a fork of the agent\n"
        "if attempt == '1' and os.environ['RANK'] == '0':\n"
        "    pid = open('child').read()\n"
        "    alive = os.path.exists(f'/proc/{pid}')\n"
        "    state = open(f'/proc/{pid}/stat').read().split()[2] if alive else 'gone'\n"
        "    open('child-then', 'w').write(state)\n"
        "if attempt == '0':\n"
        "    time.sleep(60)\n"
    )
    done = run_agent(script, "warm", tmp_path / "job", nproc=2, max_restarts=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "has ended: workers start fresh" in done.stderr
    outs = sorted((tmp_path / "job" / "logs").rglob("rank-*.out"))
    # A fork shows the agent's command line; a fresh interpreter its own.
    assert sorted(p.read_text() for p in outs) == ["0 False\n"] * 2 + ["1 True\n"] * 2
    record = json.loads(next((tmp_path / "job" / "failures").rglob("*.json")).read_text())
    assert sorted(w["exitcode"] for w in record["workers"]) == [-9, -9]
    # What a dead worker had started in its process group was stopped before the next
    # attempt began (a zombie, where init does not reap orphans, has ended too).
    assert (tmp_path / "child-then").read_text() in ("gone", "Z")


def test_omp_num_threads_reaches_a_warm_worker(tmp_path: Path) -> None:
    script = tmp_path / "threads.py"
    script.write_text("import torch\nprint(torch.get_num_threads())\n")
    done = run_agent(script, "warm", tmp_path / "job", nproc=1, env_extra={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    [out] = (tmp_path / "job" / "logs").rglob("rank-0.out")
    assert out.read_text() == "1\n"


def test_a_dataloader_in_a_warm_worker_forks_its_workers(tmp_path: Path) -> None:
    script = tmp_path / "loader.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "loader = DataLoader(list(range(8)), batch_size=2, num_workers=2,\n"
        "                    collate_fn=lambda b: sum(b))\n"  # a lambda: needs fork
        "print(sorted(loader))\n"
    )
    done = run_agent(script, "warm", tmp_path / "job", nproc=1)
    assert done.returncode == 0, done.stderr[-3000:]
    [out] = (tmp_path / "job" / "logs").rglob("rank-0.out")
    assert out.read_text() == "[1, 5, 9, 13]\n"
