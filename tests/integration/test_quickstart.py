"""docs/quickstart.md runs as written: its commands, in order, on a sandbox of their own
(``hpclaunch sandbox up`` as the page says, in a temporary state folder), from a folder
that stands for the checkout's root. What each prints must hold the lines the page shows
after it (see tests/integration/quickstart_page.py for the rule)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from hpclaunch.sandbox.daemons import SBIN_PATH
from tests.integration import quickstart_page as page
from tests.integration.helpers import VENV_BIN, base_env
from tests.integration.sandbox_fixture import require_sandbox

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 420  # the page's job runs about a minute; a requeue adds the sandbox's hold


def run_page(folder: Path, env: dict[str, str]) -> str:
    commands = page.steps(page.PAGE.read_text())
    shell = subprocess.Popen(
        ["bash", "-c", page.script(commands)],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = shell.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)  # the shell and the commands it started
        output, _ = shell.communicate()
    return output


def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    require_sandbox()
    checkout = tmp_path / "checkout"  # stands for the checkout's root
    checkout.mkdir()
    (checkout / "examples").symlink_to(ROOT / "examples")
    env = base_env(
        PATH=f"{VENV_BIN}:{SBIN_PATH}",
        HPCLAUNCH_SANDBOX_DIR=str(tmp_path / "sandbox"),  # the page's `sandbox up`, here
        XDG_STATE_HOME=str(tmp_path / "state"),  # the job list, here
    )
    try:
        output = run_page(checkout, env)
    finally:
        down = subprocess.run(
            ["hpclaunch", "sandbox", "down"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert down.returncode == 0, down.stderr
    commands = page.steps(page.PAGE.read_text())
    results = page.split_output(output)
    for number, step in enumerate(commands):
        where = f"docs/quickstart.md:{step.line}: $ {step.command}"
        assert number in results, f"{where}: never ran; the script printed:\n{output}"
        status, printed = results[number]
        shown = "\n".join(printed)
        assert status == 0, f"{where}: exit status {status}; it printed:\n{shown}"
        lost = page.missing(step.shown, printed)
        assert lost is None, f"{where}: the page shows {lost!r}; the command printed:\n{shown}"
    logs = checkout / "hpclaunch-logs"
    assert logs.is_dir(), "the job's logs went somewhere other than the page says"


@pytest.mark.parametrize(
    ("shown", "printed", "ok"),
    [
        (("submitted job <JOBID>",), ["submitted job 17"], True),
        (("submitted job <JOBID>",), ["submitted job x"], False),
        (("a", "...", "c"), ["a", "b", "c"], True),
        (("c", "a"), ["a", "b", "c"], False),
        (("[...] job <JOBID>: state ...",), ["[12:00:01] job 3: state RUNNING on n1"], True),
    ],
)
def test_the_matching_rule(shown: tuple[str, ...], printed: list[str], ok: bool) -> None:
    assert (page.missing(shown, printed) is None) is ok
