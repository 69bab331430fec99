"""`hpclaunch sbatch` through click's CliRunner, with SLURM's commands scripted
by FakeRunner (the real sbatch is exercised in tests/integration)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from hpclaunch.cli import CliContext, main
from hpclaunch.job.profiles import PROFILE_KEYS
from hpclaunch.slurm.commands import CommandResult, FakeRunner, Slurm


class Sbatch:
    """An sbatch stand-in that keeps what it was asked to submit."""

    def __init__(self, returncode: int = 0, stdout: str = "4242\n", stderr: str = "") -> None:
        self.result = (returncode, stdout, stderr)
        self.scripts: list[str] = []

    def __call__(self, argv: tuple[str, ...]) -> CommandResult:
        self.scripts.append(Path(argv[-1]).read_text())
        return CommandResult(argv, *self.result)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def run(project: Path, args: list[str], runner: FakeRunner | None = None) -> Result:
    obj = CliContext(
        slurm=Slurm(runner or FakeRunner({})), cwd=project, env={"HOME": str(project / "home")}
    )
    return CliRunner().invoke(main, ["sbatch", *args], obj=obj)


def test_dry_run_prints_script_and_submits_nothing(project: Path) -> None:
    fake = FakeRunner({"sbatch": Sbatch()})
    result = run(project, ["--dry-run", "--nodes", "2", "train.py", "--lr", "3e-4"], fake)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=train\n")
    assert "-- \\\n    train.py --lr 3e-4\n" in result.stdout
    assert fake.calls == []
    # Nothing in the project; the compiled template is kept in the user's cache (HOME
    # is project/home here), for the next run.
    assert sorted(p.name for p in project.iterdir()) == ["home", "train.py"]
    cached = project / "home" / ".cache" / "hpclaunch" / "templates"
    assert [p.suffix for p in cached.iterdir()] == [".cache"]
    assert cached.stat().st_mode & 0o777 == 0o700
    again = run(project, ["--dry-run", "--nodes", "2", "train.py", "--lr", "3e-4"], fake)
    assert again.stdout == result.stdout
    # A cache folder others may write to holds code this process would run: not used.
    cached.chmod(0o777)
    for old in cached.iterdir():
        old.write_bytes(b"not a compiled template")
    third = run(project, ["--dry-run", "--nodes", "2", "train.py", "--lr", "3e-4"], fake)
    assert third.stdout == result.stdout
    assert [p.read_bytes() for p in cached.iterdir()] == [b"not a compiled template"]


def test_submit_prints_job_id_alone_and_keeps_the_script(project: Path) -> None:
    sbatch = Sbatch(stdout="4242\n")
    fake = FakeRunner({"sbatch": sbatch})
    result = run(project, ["--nodes", "2", "train.py"], fake)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "4242\n"
    assert fake.calls[0][:2] == ("sbatch", "--parsable")
    kept = project / "hpclaunch-logs" / "4242" / "job.sbatch"
    assert kept.read_text() == sbatch.scripts[0]
    assert "#SBATCH --nodes=2\n" in sbatch.scripts[0]
    assert sorted(p.name for p in (project / "hpclaunch-logs").iterdir()) == ["4242"]


def test_json_output(project: Path) -> None:
    fake = FakeRunner({"sbatch": Sbatch(stdout="77;cluster-a\n")})
    result = run(project, ["--json", "--log-dir", "logs", "train.py"], fake)
    assert result.exit_code == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["job_id"] == 77 and payload["cluster"] == "cluster-a"
    assert payload["script_path"] == str(project / "logs" / "77" / "job.sbatch")
    assert payload["script"] == Path(payload["script_path"]).read_text()
    dry = json.loads(run(project, ["--json", "--dry-run", "train.py"]).stdout)
    assert dry["job_id"] is None and dry["script"].startswith("#!/bin/bash")


def test_sbatch_failure_shows_stderr_and_leaves_nothing(project: Path) -> None:
    stderr = "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
    fake = FakeRunner({"sbatch": Sbatch(returncode=1, stdout="", stderr=stderr)})
    result = run(project, ["--partition", "nope", "train.py"], fake)
    assert result.exit_code == 3
    assert "Invalid partition name specified" in result.stderr
    assert result.stdout == ""
    assert not (project / "hpclaunch-logs").exists()


def test_sbatch_missing_suggests_dry_run(project: Path) -> None:
    result = run(project, ["train.py"], FakeRunner({}))
    assert result.exit_code == 3
    assert "sbatch is not on PATH" in result.stderr and "--dry-run" in result.stderr
    assert not (project / "hpclaunch-logs").exists()


def test_existing_log_dir_is_kept_on_failure(project: Path) -> None:
    (project / "logs").mkdir()
    (project / "logs" / "old.out").write_text("x")
    fake = FakeRunner({"sbatch": Sbatch(returncode=1, stdout="", stderr="boom")})
    assert run(project, ["--log-dir", "logs", "train.py"], fake).exit_code == 3
    assert sorted(p.name for p in (project / "logs").iterdir()) == ["old.out"]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--nodes", "0", "train.py"], ["'--nodes'", "node count 0 is not positive"]),
        (["--nodes", "-3", "train.py"], ["'--nodes'", "node count -3 is not positive"]),
        (["--nodes", "many", "train.py"], ["'--nodes'", "'many' is not a node count", "2:4"]),
        (["--nodes", "8:2", "train.py"], ["'--nodes'", "MIN > MAX; write it as 2:8"]),
        (["--gpus-per-node", "-1", "train.py"], ["--gpus-per-node: -1 is below the minimum of 0"]),
        (["--time", "4h", "train.py"], ["'--time'", "'4h' is not a SLURM time limit", "D-H:M:S"]),
        (["--env", "NCCL_DEBUG", "train.py"], ["'--env'", "'NCCL_DEBUG' has no '='"]),
        (["missing.py"], ["'missing.py'", "is not a file", "-m for a module"]),
        (["--profile", "nope", "train.py"], ["unknown profile 'nope'", "hpclaunch.toml"]),
        (["--template", "absent.j2", "train.py"], ["/absent.j2'", "is not a file"]),
        (
            ["--signal-lead", "900", "--time", "10", "train.py"],
            ["--signal-lead and --time: the warning 900 s"],
        ),
        (["-m", "--no-python", "x"], ["exclude each other"]),
        (["--time", "1", "train.py"], ["--time and the default --signal-lead: the warning 120 s"]),
        (["--etcd-sidecar", "train.py"], ["--etcd-sidecar and the default --rdzv: etcd settings"]),
        (["--job-name", "exp/lr3", "train.py"], ["--job-name: 'exp/lr3' contains '/'"]),
        (["--log-dir", "lo\\gs", "train.py"], ["--log-dir: 'lo\\\\gs' contains a backslash"]),
        (["--sbatch-option", "chdir=/x", "train.py"], ["'chdir' is set by hpclaunch itself"]),
        (["--rdzv", "zk", "train.py"], ["'--rdzv'", "'zk' is not one of"]),
    ],
)
def test_bad_input_is_a_usage_error_and_submits_nothing(
    project: Path, args: list[str], needles: list[str]
) -> None:
    fake = FakeRunner({"sbatch": Sbatch()})
    result = run(project, args, fake)
    assert result.exit_code == 2, result.output
    for needle in needles:
        assert needle in result.stderr
    assert "Traceback" not in result.output
    assert fake.calls == []
    assert not (project / "hpclaunch-logs").exists()


def test_bad_template_is_a_usage_error(project: Path) -> None:
    (project / "t.j2").write_text("{{ oops }}\n")
    result = run(project, ["--template", "t.j2", "--dry-run", "train.py"])
    assert result.exit_code == 2
    assert "undefined variable: 'oops' is undefined" in result.stderr


@pytest.mark.parametrize(("flag", "target"), [("-m", "pkg.train"), ("--no-python", "/bin/true")])
def test_module_and_executable_skip_the_file_check(project: Path, flag: str, target: str) -> None:
    result = run(project, ["--dry-run", flag, target])
    assert result.exit_code == 0, result.stderr
    assert f"-- \\\n    {target}\n" in result.stdout


def test_profile_from_project_file(project: Path) -> None:
    (project / "hpclaunch.toml").write_text(
        '[profiles.gpu]\npartition = "a100"\ngpus_per_node = 4\n'
    )
    result = run(project, ["--profile", "gpu", "--dry-run", "--gpus-per-node", "2", "train.py"])
    assert result.exit_code == 0, result.stderr
    assert "#SBATCH --partition=a100\n" in result.stdout
    assert "#SBATCH --gpus-per-node=2\n" in result.stdout  # the flag beats the profile


def test_training_arguments_that_look_like_options(project: Path) -> None:
    result = run(project, ["--dry-run", "train.py", "--nodes", "9", "--dry-run", "-m"])
    assert result.exit_code == 0, result.stderr
    assert "#SBATCH --nodes=1\n" in result.stdout
    assert "train.py --nodes 9 --dry-run -m\n" in result.stdout


def test_mistyped_option_is_not_taken_for_the_script(project: Path) -> None:
    result = run(project, ["--gpu-per-node", "8", "train.py"])
    assert result.exit_code == 2
    assert "No such option '--gpu-per-node'" in result.stderr
    assert "--gpus-per-node" in result.stderr  # click's suggestion


def test_unwritable_log_dir_is_an_error_without_traceback(project: Path) -> None:
    (project / "file").write_text("")
    fake = FakeRunner({"sbatch": Sbatch()})
    result = run(project, ["--log-dir", "file/logs", "train.py"], fake)
    assert result.exit_code == 1
    assert "cannot write into the log folder" in result.stderr and "file/logs" in result.stderr
    assert fake.calls == []


def test_agent_mistyped_option_is_not_taken_for_the_script(project: Path) -> None:
    obj = CliContext(slurm=Slurm(FakeRunner({})), cwd=project, env={})
    result = CliRunner().invoke(main, ["agent", "--nproc-per-nod", "2", "train.py"], obj=obj)
    assert result.exit_code == 2
    assert "No such option '--nproc-per-nod'" in result.stderr


def agent_dry_run(project: Path, *args: str) -> Result:
    env = {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_NODEID": "0"}
    obj = CliContext(slurm=Slurm(FakeRunner({})), cwd=project, env=env)
    argv = ["agent", "--dry-run", "--master-addr", "10.0.0.1", *args, "train.py"]
    return CliRunner().invoke(main, argv, obj=obj)


def test_agent_options_come_from_the_settings_table(project: Path) -> None:
    result = agent_dry_run(project, "--grace-period", "2.5", "--supervised", "--nnodes", "1:2")
    assert result.exit_code == 0, result.output
    launch = json.loads(result.stdout)["launch"]
    assert launch["shutdown_timeout"] == 3  # torch's whole seconds, rounded up
    assert (launch["min_nodes"], launch["max_nodes"]) == (1, 2)
    assert list(launch) == [
        "min_nodes",
        "max_nodes",
        "nproc_per_node",
        "run_id",
        "rdzv_endpoint",
        "rdzv_backend",
        "rdzv_configs",
        "max_restarts",
        "monitor_interval",
        "start_method",
        "local_addr",
        "signals_to_handle",
        "shutdown_timeout",
        "log_line_prefix_template",
    ]
    both = agent_dry_run(project, "-m", "--no-python")
    assert both.exit_code == 2
    assert "Error: -m/--module and --no-python exclude each other; give one" in both.stderr
    bad = agent_dry_run(project, "--nnodes", "2-4")
    assert bad.exit_code == 2 and "for a range write 2:4" in bad.stderr


def test_sbatch_offers_max_failure_requeues(project: Path) -> None:
    result = CliRunner().invoke(main, ["sbatch", "--help"])
    assert "--max-failure-requeues" in result.stdout


@pytest.mark.skipif(
    "max_failure_requeues" not in {field for field, _ in PROFILE_KEYS.values()},
    reason="needs the profile key max_failure_requeues (the JobSpec/profiles change)",
)
def test_sbatch_passes_max_failure_requeues_to_the_supervisor(project: Path) -> None:
    result = run(project, ["--dry-run", "--max-failure-requeues", "5", "train.py"])
    assert result.exit_code == 0, result.output
    assert "supervise --max-requeues 3 --grace-period 120 --max-failure-requeues 5 " in (
        result.stdout
    )
    bad = run(project, ["--dry-run", "--max-failure-requeues", "-1", "train.py"])
    assert bad.exit_code == 2 and "--max-failure-requeues: -1 is below the minimum" in bad.stderr
