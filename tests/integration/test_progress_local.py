"""Progress reporting in a fresh python, as the agent starts a fresh worker (the boot on
PYTHONPATH, hpclaunch.node.boot_env), with real torch: optimizer steps count with
no change to the script, the script sees the PYTHONPATH it was meant to have and the
sitecustomize that would have run, and the stack handler answers its signal; and in a
real one-node run of the agent (no SLURM), where a script that restores its own
checkpoint resumed, as the node's progress note says."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from hpclaunch import procs, progress
from hpclaunch.jobdir.attempts import FIRST, STEP
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.node import boot_env, stacks
from hpclaunch.record.job_record import read_run
from tests.integration.helpers import LOCAL_JOB_IDS, VENV_BIN, base_env

pytestmark = pytest.mark.integration

SCRIPT = """
import json, os, sys, time
import torch
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.ones(4)).sum().backward()
    optimizer.step()
report = {"pythonpath": os.environ.get("PYTHONPATH"), "path": sys.path,
          "user_site": os.environ.get("USER_SITECUSTOMIZE_RAN")}

def wait_for_the_test():
    print(json.dumps(report), flush=True)  # said from here: its stack is read once said
    while True:
        time.sleep(0.05)

wait_for_the_test()
"""

# A sitecustomize of the user's own, on the PYTHONPATH the worker was meant to have.
USER_SITECUSTOMIZE = "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n"


def test_a_fresh_python_counts_optimizer_steps_and_dumps_its_stacks(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text(USER_SITECUSTOMIZE)
    files = {
        progress.PROGRESS_FILE: str(tmp_path / "rank.progress"),
        progress.STACKS_FILE: str(tmp_path / "rank.stacks"),
    }
    env = base_env(PYTHONPATH=str(own), **files)
    env.update(boot_env.boot_env(env))
    argv = [sys.executable, "-u", str(script)]
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            seen = json.loads(proc.stdout.readline())
            assert seen["pythonpath"] == str(own) and seen["user_site"] == "yes"
            assert boot_env.BOOT_FOLDER not in seen["path"]
            done = progress.read(files[progress.PROGRESS_FILE])
            assert done is not None and (done.count, done.step) == (3, 3) and done.stacks_on_signal
            text = stacks.read({0: proc.pid}, (), {0: files[progress.STACKS_FILE]}, spy=None)[0]
            threads = stacks.parse(text)
            assert [f.function for f in threads[0].frames[-2:]] == ["wait_for_the_test", "<module>"]
            assert stacks.waiting(threads) is False
            assert procs.state(proc.pid) in ("R", "S")  # the handler did not end it
        finally:
            proc.kill()  # it waits for ever


def test_beat_reports_a_loop_without_an_optimizer(tmp_path: Path) -> None:
    path = tmp_path / "rank.progress"
    code = (
        "from hpclaunch import progress\n"
        "for step in range(100, 105):\n"
        "    progress.beat(step=step)\n"
    )
    env = base_env(**{progress.PROGRESS_FILE: str(path)})
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    done = progress.read(str(path))
    assert done is not None and (done.count, done.step) == (5, 105)  # steps done: index + 1
    assert done.steps_per_s is not None and done.steps_per_s > 0
    assert progress.read(str(tmp_path / "none")) is None  # no worker wrote it


# Two optimizers step in each training step (a GAN's), and a launcher between the agent
# and this python added a folder of its own to PYTHONPATH.
TWO_OPTIMIZERS = """
import os, sys
import torch
a, b = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
first, second = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
for _ in range(4):
    for model, optimizer in ((a, first), (b, second)):
        model(torch.ones(2)).sum().backward()
        optimizer.step()
print(os.environ.get("PYTHONPATH"))
"""


def test_a_fresh_python_without_a_sitecustomize_of_its_own_starts_cleanly(
    tmp_path: Path,
) -> None:
    script = tmp_path / "gan.py"
    script.write_text(TWO_OPTIMIZERS)
    path = tmp_path / "rank.progress"
    env = base_env(**{progress.PROGRESS_FILE: str(path)})
    env.update(boot_env.boot_env(env))
    env["PYTHONPATH"] = f"{tmp_path / 'src'}:{env['PYTHONPATH']}"  # the launcher's own
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, check=True
    )
    assert done.stderr == ""  # no "Error in sitecustomize"
    assert done.stdout.strip() == str(tmp_path / "src")  # the launcher's part stays
    counted = progress.read(str(path))
    assert counted is not None and counted.count == 4  # one per training step


# A plain script that keeps its own checkpoint (no hpclaunch import): it restores its
# model and AdamW from its own torch.save file when there is one, steps, and saves.
OWN_CHECKPOINT = """
import os, sys
import torch
path, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
if os.path.exists(path):
    saved = torch.load(path)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
for _ in range(steps):
    optimizer.zero_grad()
    model(torch.ones(4)).sum().backward()
    optimizer.step()
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
"""


def run_agent(script: Path, job: Path, requeue: int, *args: str) -> None:
    """One run of one node's agent with one worker, as a one-node SLURM step of run
    ``requeue`` of a job has it (SLURM's variables set here), to its end."""
    env = base_env(
        SLURM_JOB_ID=str(random.randrange(LOCAL_JOB_IDS, 10**6)),
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_NUM_NODES="1",
        SLURM_NODEID="0",
        SLURM_STEP_ID="0",
        SLURM_RESTART_COUNT=str(requeue),
    )
    argv = [str(VENV_BIN / "hpclaunch"), "agent", "--nproc-per-node", "1", "--job-dir"]
    done = subprocess.run(
        [*argv, str(job), str(script), *args], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_run_that_restores_its_own_adamw_says_where_it_resumed(tmp_path: Path) -> None:
    script = tmp_path / "own_checkpoint.py"
    script.write_text(OWN_CHECKPOINT)
    own = tmp_path / "own.pt"
    job = JobFolder(tmp_path / "job")
    run_agent(script, job.root, 0, str(own), "5")
    run_agent(script, job.root, 1, str(own), "3")
    [first] = read_run(job.root, 0).notes
    [rank] = first.ranks
    # A fresh AdamW is no evidence: unknown, never "from 0".
    assert (rank.step, rank.resumed, rank.resumed_by) == (5, None, None)
    [requeued] = read_run(job.root, 1).notes
    [rank] = requeued.ranks
    assert (rank.resumed, rank.resumed_by) == (5, "optimizer")
    assert (rank.step, rank.job_steps) == (8, True)  # counted on from the 5 it restored
    events = read_run(job.root, 1).events
    [first_step] = [e for e in events if e.event == FIRST]  # kept after later attempts
    assert (first_step.step, first_step.resumed, first_step.resumed_by) == (6, 5, "optimizer")
    samples = [e for e in events if e.event == STEP]
    assert samples and samples[-1].step == 8
