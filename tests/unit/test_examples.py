"""The ready examples in ``examples/sbatch/`` render exactly to their golden ``job.sbatch``.

Every folder there is one example: ``hpclaunch.toml`` (its profile), ``README.md`` (which
shows the command), ``args`` (that command's arguments after ``hpclaunch``, one per line)
and the golden ``job.sbatch``. The test runs the command in-process, in the folder, with
no user configuration, and compares the output byte for byte; ``pytest --update-golden``
rewrites the golden files instead.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpclaunch.cli import CliContext, main
from hpclaunch.slurm.commands import FakeRunner, Slurm

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sbatch"
GOLDEN = "job.sbatch"
ARGS = "args"
REQUIRED = (ARGS, "hpclaunch.toml", "README.md")

# What each example is there to show, as (how a line starts, what that line holds). Every
# example folder must have an entry: a new example states its point here.
FEATURES: dict[str, list[tuple[str, str]]] = {
    "cpu": [
        ("#SBATCH --nodes=", "=2"),
        ("#SBATCH --partition=", "=cpu"),
        ("#SBATCH --mem=", "=64G"),
        ("hpclaunch agent ", " --nproc-per-node 4 "),
        ("hpclaunch agent ", " --module -- "),
        ("export OMP_NUM_THREADS=", "=8"),
    ],
    "gpu-8": [
        ("#SBATCH --nodes=", "=4"),
        ("#SBATCH --gpus-per-node=", "=8"),
        ("#SBATCH --account=", "=proj-llm"),
        ("#SBATCH --qos=", "=high"),
        ("#SBATCH --exclusive", "--exclusive"),
        ("module load ", " cuda/"),
        ("source ", "/bin/activate"),
        ("export NCCL_DEBUG=", "=WARN"),
        ("export HPCLAUNCH_CHECKPOINT_DIR=", "=/scratch/"),
        ("exec hpclaunch supervise ", " --adopt-checkpoints "),
        ("hpclaunch agent ", " --nproc-per-node 8 "),
    ],
    "pyxis": [
        ("srun ", " --container-image="),
        ("srun ", " --container-mounts="),
        ("srun ", " --container-workdir="),
        # The launcher stays hpclaunch, run inside the image.
        ("hpclaunch agent ", " --nproc-per-node 8 "),
    ],
    "apptainer": [
        ("#SBATCH --gres=", "=gpu:4"),
        ("apptainer exec --nv ", ".sif hpclaunch agent "),
        # Added by the example's own template, after the profile's setup lines.
        ("if [[ ! -r ", ".sif ]]; then"),
    ],
}

# What an example must not render, as (how a line starts, what that line must not hold).
ABSENT: dict[str, list[tuple[str, str]]] = {
    "cpu": [("#SBATCH ", "--gpus-per-node"), ("#SBATCH ", "--gres")],
    "gpu-8": [("#SBATCH ", "--gres")],
    "pyxis": [("#SBATCH ", "--container")],
    "apptainer": [("#SBATCH ", "--gpus-per-node")],
}


def example_dirs() -> list[Path]:
    return sorted(path for path in EXAMPLES.iterdir() if path.is_dir())


def read_args(folder: Path) -> list[str]:
    """The example's command after ``hpclaunch``: one argument per line."""
    return (folder / ARGS).read_text(encoding="utf-8").splitlines()


def render_example(folder: Path) -> str:
    """Run the example's command in ``folder``, with no user config, and return stdout."""
    args = read_args(folder)
    assert "--dry-run" in args, f"{folder / ARGS}: the command must render, not submit"
    context = CliContext(
        # A SLURM without commands: submitting by mistake fails instead of reaching sbatch.
        slurm=Slurm(runner=FakeRunner({})),
        cwd=folder,
        env={"HOME": "/nonexistent"},
    )
    result = CliRunner().invoke(main, args, obj=context, catch_exceptions=False)
    assert result.exit_code == 0, f"hpclaunch {shlex.join(args)} failed:\n{result.output}"
    assert result.stderr == ""
    return result.stdout


def lines_starting(text: str, start: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith(start)]


@pytest.fixture(params=example_dirs(), ids=lambda path: path.name)
def example(request: pytest.FixtureRequest) -> Path:
    folder: Path = request.param
    return folder


def test_examples_are_complete_and_covered(update_golden: bool) -> None:
    names = [folder.name for folder in example_dirs()]
    assert {"cpu", "gpu-8", "pyxis", "apptainer"} <= set(names)
    assert set(names) == set(FEATURES), (
        "every example folder needs an entry in FEATURES, and every entry a folder"
    )
    assert set(ABSENT) <= set(FEATURES)
    needed = REQUIRED if update_golden else (*REQUIRED, GOLDEN)
    missing = [
        f"{folder.name}/{name}"
        for folder in example_dirs()
        for name in needed
        if not (folder / name).is_file()
    ]
    assert not missing, f"missing in {EXAMPLES}: {missing} (goldens: pytest --update-golden)"


def test_example_matches_golden(example: Path, update_golden: bool) -> None:
    rendered = render_example(example)
    golden = example / GOLDEN
    if update_golden:
        golden.write_bytes(rendered.encode("utf-8"))
    assert golden.is_file(), f"{golden} is missing; create it with pytest --update-golden"
    expected = golden.read_bytes().decode("utf-8")
    assert rendered == expected, (
        f"{golden} differs from the rendered script; if the change is intended, "
        "rewrite it with pytest --update-golden and review the diff"
    )


def test_golden_passes_bash_n(example: Path) -> None:
    golden = example / GOLDEN
    assert golden.is_file(), f"{golden} is missing; create it with pytest --update-golden"
    check = subprocess.run(
        ["/bin/bash", "-n", str(golden)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, f"bash -n {golden}:\n{check.stderr}"


def test_example_shows_its_feature(example: Path) -> None:
    text = (example / GOLDEN).read_text(encoding="utf-8")
    for start, fragment in FEATURES[example.name]:
        lines = lines_starting(text, start)
        assert any(fragment in line for line in lines), (
            f"{example.name}: no line starting {start!r} holds {fragment!r}; lines: {lines}"
        )
    for start, fragment in ABSENT.get(example.name, []):
        lines = lines_starting(text, start)
        assert not any(fragment in line for line in lines), (
            f"{example.name}: a line starting {start!r} holds {fragment!r}: {lines}"
        )


def test_readme_shows_the_command(example: Path) -> None:
    readme = (example / "README.md").read_text(encoding="utf-8")
    command = "hpclaunch " + shlex.join(read_args(example))
    assert command in readme, f"{example.name}/README.md does not show {command!r}"
