"""The wheel ships the templates: build it, install it into a fresh venv outside
the checkout, and render a script from there."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import click
import jinja2
import pytest

from tests.integration.helpers import base_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout}\n{result.stderr}"
    return result


def test_wheel_renders_from_a_fresh_venv(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(ROOT),
        ]
    )
    (wheel,) = dist.glob("hpclaunch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hpclaunch/job/templates/sbatch.sh.j2" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "hpclaunch = hpclaunch.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    fresh = tmp_path / "fresh venv"
    venv.create(fresh, with_pip=False)
    python = fresh / "bin" / "python"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ]
    )
    # click and jinja2 come from the test venv's site-packages, added as a plain path
    # (its .pth files, including the editable checkout's, are not processed).
    site = Path(
        run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
        ).stdout.strip()
    )
    (site / "deps.pth").write_text(
        f"{Path(click.__file__).parents[1]}\n{Path(jinja2.__file__).parents[1]}\n"
    )

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "train.py").write_text("")
    where = run(
        [str(python), "-c", "import hpclaunch.job.render as r; print(r.templates_dir())"],
        cwd=work,
        env=base_env(),
    )
    assert Path(where.stdout.strip()) == site / "hpclaunch" / "job" / "templates"
    rendered = run(
        [
            str(fresh / "bin" / "hpclaunch"),
            "sbatch",
            "--dry-run",
            "--nodes",
            "2",
            "train.py",
            "--lr",
            "1",
        ],
        cwd=work,
        env=base_env(PATH="/usr/bin:/bin"),
    )
    assert rendered.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=train\n#SBATCH --nodes=2\n")
    assert rendered.stdout.rstrip().endswith("train.py --lr 1")
