"""The agent's torch version check: a pure function of the version string, and what
`hpclaunch agent` does with the installed torch's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpclaunch.errors import HpclaunchError
from hpclaunch.node.torch_version import (
    TESTED_RANGE,
    TorchVersionError,
    check_installed_torch,
    check_torch_version,
    release_of,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version", ["2.13.0", "2.13.0+cpu", "2.13.1+cu128", "2.13.0rc1"])
def test_a_tested_torch_passes(version: str) -> None:
    check_torch_version(version)


@pytest.mark.parametrize("version", ["2.3.0", "2.12.1+cpu", "2.14.0", "2.14.0a0+git", "3.0.0"])
def test_an_untested_torch_is_refused_with_the_fix(version: str) -> None:
    with pytest.raises(TorchVersionError) as caught:
        check_torch_version(version)
    message = str(caught.value)
    assert f"torch {version} is installed" in message  # the value and its source
    assert TESTED_RANGE == ">=2.13,<2.14"
    assert f"pip install 'torch{TESTED_RANGE}'" in message  # the fix
    assert isinstance(caught.value, HpclaunchError)


def test_an_unreadable_version_is_refused() -> None:
    assert release_of("nightly") is None
    with pytest.raises(TorchVersionError, match="torch nightly is installed"):
        check_torch_version("nightly")


def test_release_of_reads_major_and_minor() -> None:
    assert release_of("2.13.0+cpu") == (2, 13)
    assert release_of("10.2") == (10, 2)


def test_pyproject_pins_the_tested_range() -> None:
    from pathlib import Path

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    assert f"torch{TESTED_RANGE}" in deps


def test_the_installed_torch_is_a_tested_one() -> None:
    check_installed_torch()  # the CPU build pinned in scripts/setup


def test_the_agent_refuses_an_untested_torch_with_an_error_line(tmp_path: Path) -> None:
    """A torch of another release, as the package metadata says, stops `hpclaunch agent`
    with one Error: paragraph before anything starts (no traceback, no zygote)."""
    fake = tmp_path / "site"
    (fake / "torch-2.5.1.dist-info").mkdir(parents=True)
    (fake / "torch-2.5.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.5.1\n"
    )
    (tmp_path / "train.py").write_text("")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)]),
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_NODELIST": "n1",
        "SLURM_NODEID": "0",
    }
    done = subprocess.run(
        [sys.executable, "-m", "hpclaunch", "agent", "--master-addr", "127.0.0.1", "train.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("Error: torch 2.5.1 is installed"), done.stderr
    assert "Traceback" not in done.stderr and "torch>=2.13,<2.14" in done.stderr
