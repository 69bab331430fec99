"""Shell completion through the installed console script, as docs/cli.md tells users
to set it up (click's ``_HPCLAUNCH_COMPLETE``), lazily loaded commands included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "hpclaunch"


def complete(tmp_path: Path, **env: str) -> str:
    if not SCRIPT.exists():
        pytest.fail(f"{SCRIPT} missing: install the package (scripts/setup)")
    done = subprocess.run(
        [str(SCRIPT)],
        env={**os.environ, **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout


SHELLS = [("bash", "complete -o nosort -F"), ("zsh", "compdef"), ("fish", "complete")]


@pytest.mark.parametrize(("shell", "needle"), SHELLS)
def test_the_console_script_prints_a_completion_script(
    tmp_path: Path, shell: str, needle: str
) -> None:
    text = complete(tmp_path, _HPCLAUNCH_COMPLETE=f"{shell}_source")
    assert "_HPCLAUNCH_COMPLETE" in text and needle in text


def test_it_completes_commands_and_the_options_of_a_lazy_command(tmp_path: Path) -> None:
    words = complete(
        tmp_path, _HPCLAUNCH_COMPLETE="bash_complete", COMP_WORDS="hpclaunch sb", COMP_CWORD="1"
    )
    assert words.split() == ["plain,sbatch"]
    words = complete(
        tmp_path,
        _HPCLAUNCH_COMPLETE="bash_complete",
        COMP_WORDS="hpclaunch sbatch --dep",
        COMP_CWORD="2",
    )
    assert words.split() == ["plain,--dependency"]
