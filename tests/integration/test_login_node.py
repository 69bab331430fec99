"""The login-node CLI: no torch import, and the real sbatch binary's failures."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import base_env

pytestmark = pytest.mark.integration

PROBE = """
import sys
from hpclaunch.cli import main
try:
    main(sys.argv[1:], prog_name="hpclaunch")
except SystemExit as exc:
    code = exc.code
# the agent's libraries, and the Python API's, imported when used
heavy = ("torch", "etcd3gw", "requests", "submitit")
loaded = any(m.split(".")[0] in heavy for m in sys.modules)
print("TORCH_LOADED" if loaded else "NO_TORCH", file=sys.stderr)
raise SystemExit(code)
"""


@pytest.mark.parametrize(
    "args",
    [
        [
            "sbatch",
            "--dry-run",
            "--nodes",
            "32",
            "--gpus-per-node",
            "8",
            "train.py",
            "--lr",
            "3e-4",
        ],
        ["sbatch", "--json", "--dry-run", "-m", "pkg.train"],
        ["sbatch", "--help"],
        [
            "sbatch",
            "--dry-run",
            "--nodes",
            "2:3",
            "--no-kill",
            "--rdzv",
            "etcd",
            "--etcd-sidecar",
            "train.py",
        ],
        ["sbatch", "--nodes", "0", "train.py"],
        ["list"],
        ["status", "--help"],
        ["logs", "--help"],
        ["cancel", "--help"],
        ["status", "--job-dir", "nowhere", "12"],  # no SLURM here: an error, no torch
        ["config", "show", "--nodes", "2", "train.py"],
        ["doctor", "--no-allocate"],  # no SLURM here: a problem, no torch
        ["init", "site.toml"],
    ],
)
def test_cli_never_imports_torch(tmp_path: Path, args: list[str]) -> None:
    assert importlib.util.find_spec("torch") is not None, (
        "torch must be installed for this test to mean anything"
    )
    (tmp_path / "train.py").write_text("")
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=tmp_path,
        env=base_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.stderr.strip().endswith("NO_TORCH"), result.stderr
    assert result.returncode in (0, 1, 2, 3) and "Traceback" not in result.stderr, result.stderr


API_PROBE = """
import sys
import hpclaunch
executor = hpclaunch.Executor(sys.argv[1], cluster="local", nodes=1, nproc_per_node=2)
assert "hpclaunch.executor.worker" in executor.script()
print("TORCH_LOADED" if "torch" in sys.modules else "NO_TORCH", file=sys.stderr)
"""


def test_the_python_api_submits_without_importing_torch(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", API_PROBE, str(tmp_path / "jobs")],
        cwd=tmp_path,
        env=base_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().endswith("NO_TORCH"), result.stderr


def test_real_sbatch_failure_is_shown(tmp_path: Path, hpclaunch_bin: Path) -> None:
    if shutil.which("sbatch") is None:
        pytest.skip("sbatch is not installed (apt-get install slurm-wlm; scripts/setup does it)")
    (tmp_path / "train.py").write_text("")
    # A config sbatch rejects at once (a missing one makes it retry for 60 s).
    (tmp_path / "slurm.conf").write_text("ClusterName=test\nBogusKey=1\n")
    result = subprocess.run(
        [str(hpclaunch_bin), "sbatch", "train.py"],
        cwd=tmp_path,
        env=base_env(SLURM_CONF=str(tmp_path / "slurm.conf")),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 3
    conf = tmp_path / "slurm.conf"
    assert result.stderr.startswith(
        f"Error: SLURM's commands cannot read their configuration: SLURM_CONF={conf} is not "
        "a readable slurm.conf (sbatch: error: "
    ), result.stderr
    assert "unrecognized key: BogusKey" in result.stderr  # sbatch's own words
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slurm.conf", "train.py"]


def test_no_sbatch_on_path(tmp_path: Path, hpclaunch_bin: Path) -> None:
    (tmp_path / "train.py").write_text("")
    empty = tmp_path / "bin"
    empty.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "hpclaunch", "sbatch", "train.py"],
        cwd=tmp_path,
        env=base_env(PATH=str(empty)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 3
    assert "sbatch is not on PATH: this does not look like a SLURM login node" in result.stderr
    assert "--dry-run" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "train.py"]
