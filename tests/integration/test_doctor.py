"""`hpclaunch doctor` on the real sandbox: all good as set up, and each broken part
named, with a non-zero exit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.helpers import VENV_BIN
from tests.integration.sandbox_fixture import Running

pytestmark = pytest.mark.integration


def doctor(sandbox: Running, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(sandbox.env)
    full["PATH"] = f"{VENV_BIN}:{full['PATH']}"
    full.update(env)
    return subprocess.run(
        [str(VENV_BIN / "hpclaunch"), "doctor", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def verdicts(out: str) -> dict[str, str]:
    return {line.split()[1].rstrip(":"): line.split()[0] for line in out.splitlines()[:-1]}


def test_doctor_on_the_sandbox(sandbox: Running, tmp_path: Path) -> None:
    good = doctor(sandbox, tmp_path, "--gpus-per-node", "2")
    print(good.stdout)
    assert good.returncode == 0, good.stdout + good.stderr
    lines = good.stdout.splitlines()
    assert lines[-1] == "all good"
    assert [line.split()[0] for line in lines[:-1]] == ["ok"] * 7, good.stdout
    assert "sbatch --test-only accepts it (2 GPUs per node as --gpus-per-node)" in good.stdout
    assert "is shared: n" in good.stdout
    assert not list((tmp_path / "hpclaunch-logs").iterdir())  # the marker is removed

    nope = doctor(sandbox, tmp_path, "--partition", "nope")
    print(nope.stdout)
    assert nope.returncode == 1
    assert (
        "problem  partition: 'nope' does not exist; the partitions here are low*, high"
        in nope.stdout
    )
    assert "problem  job script: sbatch --test-only refuses it" in nope.stdout

    big = doctor(sandbox, tmp_path, "--nodes", "8", "--gpus-per-node", "3", "--no-allocate")
    print(big.stdout)
    assert big.returncode == 1
    got = verdicts(big.stdout)
    assert got["partition"] == "problem" and "ask for at most 4 nodes" in big.stdout
    assert got["job"] == "problem" and "gpu_directive = 'gres'" in big.stdout
    assert got["hpclaunch"] == "skipped" and "no node asked for" in big.stdout
    assert "warn     nodes" not in nope.stdout  # no srun into a partition that is not there

    conf = doctor(sandbox, tmp_path, "--no-allocate", SLURM_CONF=str(tmp_path / "none.conf"))
    print(conf.stdout)
    assert conf.returncode == 1
    assert f"problem  controller: SLURM_CONF={tmp_path / 'none.conf'} is not a file" in conf.stdout

    # hpclaunch missing from the nodes' PATH (the job exports this PATH to them)
    bare = doctor(sandbox, tmp_path, PATH=sandbox.env["PATH"].replace(f"{VENV_BIN}:", ""))
    print(bare.stdout)
    assert bare.returncode == 1
    assert verdicts(bare.stdout)["hpclaunch"] == "problem"
    assert "`hpclaunch` is not on PATH on n" in bare.stdout
