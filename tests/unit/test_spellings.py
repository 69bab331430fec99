"""The names users bring from torchrun and sbatch, a bare value after a flag, the
managed sbatch options, --dependency/--after and job arrays: `hpclaunch sbatch` and
`hpclaunch agent` through CliRunner, SLURM's commands scripted by FakeRunner (the
real sbatch takes --after in tests/integration/test_dead_ends.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from hpclaunch.cli import CliContext, main
from hpclaunch.errors import SpecError
from hpclaunch.job.values import after_dependency, parse_dependency
from hpclaunch.slurm.commands import CommandResult, FakeRunner, Slurm


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def sbatch(project: Path, *args: str, fake: FakeRunner | None = None) -> Result:
    obj = CliContext(slurm=Slurm(fake or FakeRunner({})), cwd=project, env={"HOME": str(project)})
    return CliRunner().invoke(main, ["sbatch", *args], obj=obj)


def agent(project: Path, *args: str) -> Result:
    env = {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_NODEID": "0"}
    obj = CliContext(slurm=Slurm(FakeRunner({})), cwd=project, env=env)
    return CliRunner().invoke(main, ["agent", *args], obj=obj)


@pytest.mark.parametrize(
    ("args", "directive"),
    [
        (["--nnodes", "2"], "#SBATCH --nodes=2\n"),  # torchrun's
        (["--nnodes", "2:4"], "#SBATCH --nodes=2-4\n"),  # torchrun's elastic form is ours
        (["-N", "3"], "#SBATCH --nodes=3\n"),  # sbatch's
        (["-N3"], "#SBATCH --nodes=3\n"),
        (["-p", "debug"], "#SBATCH --partition=debug\n"),
        (["-t", "10"], "#SBATCH --time=0-00:10:00\n"),
        (["-A", "proj"], "#SBATCH --account=proj\n"),
        (["-q", "high"], "#SBATCH --qos=high\n"),
        (["-C", "a100"], "#SBATCH --constraint=a100\n"),
        (["-x", "n1"], "#SBATCH --exclude=n1\n"),
        (["-c", "8"], "#SBATCH --cpus-per-task=8\n"),
        (["-J", "exp"], "#SBATCH --job-name=exp\n"),
        (["--nproc_per_node", "4"], " --nproc-per-node 4 "),
        (["--max_restarts", "5"], " --max-restarts 5 "),
        (["--master_port", "29500"], " --master-port 29500 "),
    ],
)
def test_aliases_with_the_same_meaning_render_as_ours(
    project: Path, args: list[str], directive: str
) -> None:
    result = sbatch(project, "--dry-run", *args, "train.py")
    assert result.exit_code == 0, result.stderr
    assert directive in result.stdout


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--gpus", "8"], ["--gpus is sbatch's GPU count for the whole job", "--gpus-per-node G"]),
        (["-G", "8"], ["-G is sbatch's", "--gpus-per-node G"]),
        (["--gpus-per-task=1"], ["--gpus-per-task is sbatch's", "--gpus-per-node G"]),
        (["--gres", "gpu:2"], ["--gres is sbatch's", "gpu_directive = 'gres'"]),
        (["--ntasks-per-node", "2"], ["one agent task per node", "--nproc-per-node P"]),
        (["-n", "8"], ["-n is sbatch's task count", "--nodes N"]),
        (["-o", "x.out"], ["-o is sbatch's --output", "--log-dir"]),
        (["--array", "0-3"], ["--array is sbatch's", "Executor.map_array"]),
        (["--rdzv_backend", "c10d"], ["--rdzv_backend is torchrun's name: use --rdzv"]),
        (["--rdzv-endpoint", "h:1"], ["the first node and --master-port"]),
        (["--standalone"], ["--standalone is torchrun's", "--nodes 1"]),
        (["--tee", "3"], ["--tee is torchrun's", "hpclaunch logs JOBID --rank R"]),
        (["--master_addr", "h"], ["the first node of the allocation is the master"]),
        # a bare value after a flag of ours would be SCRIPT
        (["--follow", "3"], ["--follow takes no value, so '3' after it would be taken as SCRIPT"]),
        (["--no-kill", "true"], ["--no-kill takes no value"]),
    ],
)
def test_other_tools_spellings_are_refused_with_ours(
    project: Path, args: list[str], needles: list[str]
) -> None:
    fake = FakeRunner({})
    result = sbatch(project, *args, "train.py", fake=fake)
    assert result.exit_code == 2, result.output
    for needle in needles:
        assert needle in result.stderr
    assert "No such option" not in result.stderr  # not click's guess
    assert fake.calls == []


@pytest.mark.parametrize("before", [["--nodes", "2"], ["--no-python"], ["--dry-run", "--"]])
def test_a_script_named_like_a_value_is_fine_after_a_value_or_a_kind(
    project: Path, before: list[str]
) -> None:
    (project / "true").write_text("")
    result = sbatch(project, "--dry-run", "--no-python", *before, "true")
    assert result.exit_code == 0, result.stderr
    assert "-- \\\n    true\n" in result.stdout


def test_agent_refuses_torchruns_tee_value_before_anything_starts(project: Path) -> None:
    result = agent(project, "--dry-run", "--tee", "3", "train.py")
    assert result.exit_code == 2, result.output
    assert "--tee takes no value, so '3' after it would be taken as SCRIPT" in result.stderr
    assert "torchrun's --tee 3 is --tee here" in result.stderr


@pytest.mark.parametrize(
    ("flag", "needle"),
    [
        ("--redirects", "--redirects is torchrun's: every rank's output goes to its own log"),
        ("--rdzv_endpoint", "--master-addr and --master-port"),
        ("--log_dir", "use --job-dir"),
        ("--node_rank", "comes from SLURM"),
    ],
)
def test_agent_refuses_torchruns_other_names(project: Path, flag: str, needle: str) -> None:
    result = agent(project, "--dry-run", flag, "3", "train.py")
    assert result.exit_code == 2, result.output
    assert needle in result.stderr


def test_agent_takes_torchruns_underscore_names(project: Path) -> None:
    result = agent(
        project,
        "--dry-run",
        "--master-addr",
        "10.0.0.1",
        "--nproc_per_node",
        "3",
        "--max_restarts",
        "7",
        "train.py",
    )
    assert result.exit_code == 0, result.stderr
    assert '"nproc_per_node": 3' in result.stdout
    assert '"max_restarts": 7' in result.stdout


@pytest.mark.parametrize(
    ("option", "needle"),
    [
        (
            "ntasks-per-node=2",
            "'ntasks-per-node' is set by hpclaunch itself; it runs one agent "
            "task per node; use --nproc-per-node",
        ),
        (
            "gpus=8",
            "'gpus' is set by hpclaunch itself; it asks for GPUs per node; use --gpus-per-node G",
        ),
        ("gpus-per-task=1", "'gpus-per-task' is set by hpclaunch itself"),
        ("G=2", "'G' is set by hpclaunch itself"),
        ("open-mode=truncate", "it appends, so that a requeued job keeps one log; leave it out"),
        (
            "array=0-3",
            "--sbatch-option array (or a profile's sbatch_options): `hpclaunch list/status/logs`",
        ),
        ("a=0-3", "Executor.map_array"),
        (
            "dependency=afterok=3",
            "--sbatch-option dependency: 'afterok=3' is not a SLURM dependency",
        ),
    ],
)
def test_managed_sbatch_options_say_what_to_use(project: Path, option: str, needle: str) -> None:
    result = sbatch(project, "--dry-run", "--sbatch-option", option, "train.py")
    assert result.exit_code == 2, result.output
    assert needle in result.stderr
    assert "use (" not in result.stderr  # the old broken sentence


def test_array_from_a_profile_is_refused_too(project: Path) -> None:
    (project / "hpclaunch.toml").write_text(
        '[profiles.default]\nsbatch_options = {array = "0-3"}\n'
    )
    result = sbatch(project, "--dry-run", "train.py")
    assert result.exit_code == 2, result.output
    assert "Executor.map_array" in result.stderr


@pytest.mark.parametrize(
    ("args", "directive"),
    [
        (["--after", "12"], "#SBATCH --dependency=afterok:12\n"),
        (["--after", "12", "--after", "13"], "#SBATCH --dependency=afterok:12:13\n"),
        (["--dependency", "afterany:12"], "#SBATCH --dependency=afterany:12\n"),
        (["-d", "afterok:12,afternotok:14+5"], "#SBATCH --dependency=afterok:12,afternotok:14+5\n"),
        (["-d", "singleton"], "#SBATCH --dependency=singleton\n"),
        (["--sbatch-option", "dependency=afterok:9"], "#SBATCH --dependency=afterok:9\n"),
    ],
)
def test_dependency_and_after_render_sbatchs_dependency(
    project: Path, args: list[str], directive: str
) -> None:
    result = sbatch(project, "--dry-run", *args, "train.py")
    assert result.exit_code == 0, result.stderr
    assert directive in result.stdout
    assert result.stdout.count("--dependency") == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--dependency", "afterok=12"], "'afterok=12' is not a SLURM dependency"),
        (["--dependency", "afterok:12,afterany:3?afterok:4"], "not both"),
        (["--dependency", "afterok:x"], "TYPE:JOBID"),
        (["--after", "abc"], "'abc' is not a valid integer"),
        (["--after", "0"], "--after 0: a job id is a positive number"),
        (["--after", "1", "-d", "afterany:2"], "--dependency and --after each set the job's"),
        (["--after", "1", "--sbatch-option", "dependency=afterok:2"], "give one"),
    ],
)
def test_bad_dependencies_are_refused(project: Path, args: list[str], needle: str) -> None:
    fake = FakeRunner({})
    result = sbatch(project, *args, "train.py", fake=fake)
    assert result.exit_code == 2, result.output
    assert needle in result.stderr
    assert fake.calls == []


def test_after_reaches_the_submitted_script(project: Path) -> None:
    scripts: list[str] = []

    def submit(argv: tuple[str, ...]) -> CommandResult:
        scripts.append(Path(argv[-1]).read_text())
        return CommandResult(argv, 0, "51\n")

    result = sbatch(project, "--after", "50", "train.py", fake=FakeRunner({"sbatch": submit}))
    assert result.exit_code == 0, result.stderr
    assert "#SBATCH --dependency=afterok:50\n" in scripts[0]


@pytest.mark.parametrize(
    "text", ["after:1", "afterany:1:2", "afterok:3_4", "aftercorr:1?afterok:2"]
)
def test_parse_dependency_takes_slurms_forms(text: str) -> None:
    assert parse_dependency(text) == text


@pytest.mark.parametrize(
    "text", ["", "afterok", "afterok:", "later:1", "afterok:1,", "singleton:1"]
)
def test_parse_dependency_refuses_others(text: str) -> None:
    with pytest.raises(SpecError, match="is not a SLURM dependency"):
        parse_dependency(text)


def test_after_dependency_is_afterok() -> None:
    assert after_dependency((4, 5)) == "afterok:4:5"
