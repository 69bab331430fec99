"""hpclaunch.checkpoint with real torch: a writer SIGKILLed in the middle of a save
leaves the previous checkpoint intact, and the next run resumes from it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpclaunch.jobdir.checkpoint_folder import NAME, TEMP
from tests.integration.helpers import base_env, wait_for

pytestmark = pytest.mark.integration

# Saves step after step of a large state (every element equal to the step), forever.
WRITER = """
import sys, torch
from hpclaunch import checkpoint
for step in range(10**6):
    checkpoint.save({"step": step, "value": torch.full((8_000_000,), float(step))}, step,
                    folder=sys.argv[1], keep_last=3)
"""

# Loads the latest checkpoint, checks it is whole, prints its step, saves the next one.
RESUMER = """
import sys, torch
from hpclaunch import checkpoint
loaded = checkpoint.load_latest(sys.argv[1])
assert loaded.state["step"] == loaded.step
assert bool((loaded.state["value"] == float(loaded.step)).all())
checkpoint.save({"step": loaded.step + 1, "value": torch.zeros(1)}, loaded.step + 1,
                folder=sys.argv[1], keep_last=3)
print(loaded.step)
"""


def python(code: str, *args: str) -> tuple[list[str], dict[str, str]]:
    env = base_env(PYTHONWARNINGS="ignore::UserWarning")
    return [sys.executable, "-c", code, *args], env


def test_sigkill_during_a_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    argv, env = python(WRITER, str(tmp_path))
    with subprocess.Popen(argv, env=env, stderr=subprocess.PIPE) as writer:
        try:
            # Wait until a checkpoint exists and the next one is half written.
            def mid_write() -> bool:
                names = os.listdir(tmp_path)
                return any(NAME.match(n) for n in names) and any(".tmp-" in n for n in names)

            wait_for(mid_write, timeout_s=60, what="a save in progress")
            os.kill(writer.pid, signal.SIGKILL)
            writer.wait(timeout=10)
        finally:
            writer.kill()
    assert writer.returncode == -signal.SIGKILL
    leftovers = [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    # The killed writer's temporary file (and its manifest's, when killed writing that).
    assert 1 <= len(leftovers) <= 2, os.listdir(tmp_path)
    assert all(TEMP.match(n) for n in leftovers), leftovers
    complete = sorted(n for n in os.listdir(tmp_path) if NAME.match(n))
    newest = int(complete[-1][len("step-") : -len(".pt")])

    argv, env = python(RESUMER, str(tmp_path))
    resumed = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert int(resumed.stdout) == newest  # resumed from the newest complete checkpoint
    names = sorted(os.listdir(tmp_path))
    assert not [n for n in names if ".tmp-" in n]  # the dead writer's file is gone
    assert [n for n in names if NAME.match(n)][-1] == f"step-{newest + 1:012d}.pt"
    # Each committed one has its manifest; the killed save's is not left behind.
    assert [n for n in names if not NAME.match(n)] == [
        f"{n}.manifest.json" for n in names if NAME.match(n)
    ]
