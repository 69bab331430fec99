"""Hostile strings survive rendering and a real shell byte for byte.

The rendered script is run by bash with SLURM's variables set and a stub
``srun`` on PATH that records the argv and environment it receives; the real
``hpclaunch supervise`` runs in between.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.helpers import base_env

pytestmark = pytest.mark.integration

HOSTILE = [
    "it's",
    'say "hi"',
    "$(touch PWNED)",
    "`touch PWNED`",
    "a; touch PWNED",
    "x && touch PWNED",
    "line one\nline two; touch PWNED",
    "  two  spaces ",
    "naïve ünïcode ✓ 日本",
    "$HOME ${PATH} $1 $@",
    "back\\slash\\",
    "*",
    "~",
    "",
    "--",
    "-m",
    "#not a comment",
    "!event",
    "tab\there",
    "|&<>(){}",
]
ONE_LINE = [s for s in HOSTILE if "\n" not in s and "\t" not in s and s.strip()]

STUB_SRUN = """#!/bin/bash
printf '%s\\0' "$@" > "$SRUN_RECORD.argv"
env -0 > "$SRUN_RECORD.env"
"""


def run_rendered(
    tmp_path: Path, hpclaunch_bin: Path, extra: list[str], script_name: str, args: list[str]
) -> tuple[subprocess.CompletedProcess[bytes], Path]:
    workdir = tmp_path / "work dir $(x)"
    workdir.mkdir()
    (workdir / script_name).write_text("print('hi')\n")
    render = subprocess.run(
        [str(hpclaunch_bin), "sbatch", "--dry-run", *extra, "--", script_name, *args],
        cwd=workdir,
        env=base_env(),
        capture_output=True,
        check=False,
    )
    assert render.returncode == 0, render.stderr.decode()
    job = workdir / "job.sbatch"
    job.write_bytes(render.stdout)
    syntax = subprocess.run(["bash", "-n", str(job)], capture_output=True, check=False)
    assert syntax.returncode == 0, syntax.stderr.decode()

    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "srun").write_text(STUB_SRUN)
    (stubs / "srun").chmod(0o755)
    env = base_env(
        SLURM_SUBMIT_DIR=str(workdir),
        SLURM_JOB_ID="7",
        SLURM_JOB_NUM_NODES="2",
        SRUN_RECORD=str(tmp_path / "record"),
    )
    env["PATH"] = f"{stubs}:{env['PATH']}"
    ran = subprocess.run(["bash", str(job)], cwd=workdir, env=env, capture_output=True, check=False)
    return ran, workdir


def test_hostile_strings_reach_the_training_command_byte_for_byte(
    tmp_path: Path, hpclaunch_bin: Path
) -> None:
    script_name = "my train's $(touch PWNED) ✓.py"
    env_values = {f"HOSTILE_{i}": value for i, value in enumerate(HOSTILE)}
    extra = [
        "--nodes",
        "2",
        "--job-name",
        "".join(ONE_LINE),
        "--log-dir",
        "logs it's $(touch PWNED) `x` ; ✓",
        "--checkpoint-dir",
        'ckpt "dir"\n$(touch PWNED)',
        "--partition",
        "p;touch PWNED",
        "--sbatch-option",
        "comment=" + "".join(ONE_LINE),
    ]
    for key, value in env_values.items():
        extra += ["--env", f"{key}={value}"]
    ran, workdir = run_rendered(tmp_path, hpclaunch_bin, extra, script_name, HOSTILE)
    assert ran.returncode == 0, ran.stderr.decode()

    argv = (tmp_path / "record.argv").read_bytes().split(b"\0")[:-1]
    decoded = [a.decode() for a in argv]
    training = decoded[decoded.index("--", decoded.index("agent")) + 1 :]
    assert training == [script_name, *HOSTILE]
    assert decoded[:4] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]

    recorded_env = dict(
        item.decode().split("=", 1)
        for item in (tmp_path / "record.env").read_bytes().split(b"\0")
        if item
    )
    for key, value in env_values.items():
        assert recorded_env[key] == value
    assert recorded_env["HPCLAUNCH_CHECKPOINT_DIR"] == str(workdir / 'ckpt "dir"\n$(touch PWNED)')
    job_dir = workdir / "logs it's $(touch PWNED) `x` ; ✓" / "7"
    assert recorded_env["HPCLAUNCH_JOB_DIR"] == str(job_dir)
    assert job_dir.is_dir()
    assert not list(tmp_path.rglob("PWNED")), "an injected command ran"


def test_one_line_values_with_line_breaks_are_refused(tmp_path: Path, hpclaunch_bin: Path) -> None:
    (tmp_path / "t.py").write_text("")
    for flag in ("--job-name", "--log-dir", "--partition"):
        result = subprocess.run(
            [str(hpclaunch_bin), "sbatch", "--dry-run", flag, "x\ntouch PWNED", "t.py"],
            cwd=tmp_path,
            env=base_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 2
        assert "line break" in result.stderr and flag in result.stderr
        assert result.stdout == ""
