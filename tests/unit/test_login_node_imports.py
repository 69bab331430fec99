"""The login node imports only what it renders: ``hpclaunch sbatch --dry-run``, run as a
user runs it (a fresh ``python -m hpclaunch``), loads no module of the parts that run
on the nodes or in the batch step, and no torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# What a dry run must not load, each for its reason.
NOT_ON_THE_LOGIN_NODE = (
    "hpclaunch.node",  # the agent: each node
    "hpclaunch.recovery",  # the supervisor: the batch step
    "hpclaunch.rendezvous",  # the agents' rendezvous
    "hpclaunch.checkpoint",  # the worker API (its submit-time folder check submits only)
    "hpclaunch.progress",  # the worker API
    "hpclaunch.slurm",  # a dry run asks SLURM nothing
    "hpclaunch.ops",  # operating submitted jobs
    "hpclaunch.record",  # reading a job folder: a job not yet submitted has none
    "hpclaunch.executor",  # submitit's interface
    "hpclaunch.sandbox",  # the development cluster
    "torch",  # seconds of import; the login node never needs it
)


# ``python -m hpclaunch ARGS``, then the names in sys.modules as the process exits, one a
# line, into the file named by the first argument. (``-X importtime`` would miss what
# is imported through importlib, as the CLI loads its commands.)
_RUN_AND_LIST = """
import atexit, pathlib, runpy, sys
out = pathlib.Path(sys.argv.pop(1))
atexit.register(lambda: out.write_text("\\n".join(sorted(sys.modules))))
sys.argv[0] = "hpclaunch"
runpy.run_module("hpclaunch", run_name="__main__", alter_sys=True)
"""


def _loaded_modules(cwd: Path, *args: str) -> tuple[set[str], str]:
    """The modules ``python -m hpclaunch ARGS`` has loaded when it exits, and its
    stdout. An empty config home: no profile of the machine's user applies."""
    listed = cwd / "modules.txt"
    env = {**os.environ, "XDG_CONFIG_HOME": str(cwd / "config")}
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_AND_LIST, str(listed), *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return set(listed.read_text().split()), proc.stdout


def test_sbatch_dry_run_loads_nothing_of_the_nodes_or_the_batch_step(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('training')\n")
    modules, script = _loaded_modules(
        tmp_path, "sbatch", "--dry-run", "--nodes", "2:4", "--gpus-per-node", "8", "train.py"
    )
    # The run did render (the check below would pass for a run that failed early).
    assert "#SBATCH --nodes=2-4" in script and "hpclaunch agent" in script
    assert {"hpclaunch.cli.sbatch", "hpclaunch.job.render"} <= modules
    loaded = [
        name
        for name in sorted(modules)
        if any(name == part or name.startswith(part + ".") for part in NOT_ON_THE_LOGIN_NODE)
    ]
    assert not loaded, f"sbatch --dry-run imports {loaded}"
