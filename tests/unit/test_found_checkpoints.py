"""Checkpoints a job writes its own way (--checkpoint-pattern, and the Lightning
callback's folder): the search on plain files with set mtimes, what `hpclaunch status`
makes of it next to hpclaunch's own checkpoints (a file older than the job is not the
job's), and the option's validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from hpclaunch.cli import CliContext, main
from hpclaunch.cli.format import render_status
from hpclaunch.errors import SpecError
from hpclaunch.job.spec import JobSpec
from hpclaunch.jobdir import found_checkpoints
from hpclaunch.jobdir.found_checkpoints import Found, absolute, base_folder, search
from hpclaunch.jobdir.history import History, Run
from hpclaunch.ops.follow import changes
from hpclaunch.ops.status import JobStatus, gather
from hpclaunch.recovery.supervisor import supervise
from hpclaunch.slurm.commands import FakeRunner, Slurm

JOB = 31


def touch(path: Path, mtime: float, *, folder: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if folder:
        path.mkdir()
    else:
        path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))
    return path


def test_the_newest_match_of_any_pattern_wins(tmp_path: Path) -> None:
    touch(tmp_path / "run" / "snapshot.pt", 1000.0)
    touch(tmp_path / "ckpt" / "a" / "epoch=1.ckpt", 1100.0)
    deep = touch(tmp_path / "ckpt" / "b" / "c" / "epoch=2.ckpt", 1200.0)
    touch(tmp_path / "ckpt" / "b" / "c" / "epoch=3.ckpt.tmp", 1300.0)  # a save in progress
    touch(tmp_path / "ckpt" / "b" / ".epoch=4.ckpt", 1400.0)  # written before its rename
    patterns = [str(tmp_path / "run" / "snapshot.pt"), str(tmp_path / "ckpt" / "**" / "*ckpt*")]
    assert search(patterns).newest() == Found(deep, 1200.0)
    assert [f.written for f in search(patterns).found] == [1000.0, 1100.0, 1200.0]
    assert search(patterns).newest(since=1150.0) == Found(deep, 1200.0)
    assert search(patterns[:1]).newest(since=1150.0) is None  # older than the job
    assert search(patterns[:1]).newest() == Found(tmp_path / "run" / "snapshot.pt", 1000.0)
    assert search([str(tmp_path / "absent" / "*.pt")]) == found_checkpoints.Search()


def test_a_folder_can_be_the_checkpoint_and_ties_go_to_the_greater_name(tmp_path: Path) -> None:
    touch(tmp_path / "step-1", 500.0, folder=True)
    touch(tmp_path / "step-2", 500.0, folder=True)
    assert search([str(tmp_path / "step-*")]).newest() == Found(tmp_path / "step-2", 500.0)


def test_the_lightning_callbacks_folder_is_always_looked_at(tmp_path: Path) -> None:
    folder = job_folder(tmp_path, [], {})
    ckpt = folder / "ckpt"
    touch(ckpt / "lightning" / "step-000000000010.ckpt", 10.0)
    touch(ckpt / "lightning" / "step-000000000020.ckpt.tmp", 20.0)
    touch(ckpt / "lightning" / "last.ckpt", 30.0)  # not the callback's name
    status = status_of(folder)
    assert status.last_checkpoint == str(ckpt / "lightning" / "step-000000000010.ckpt")


def test_a_file_older_than_the_job_is_not_its_checkpoint(tmp_path: Path) -> None:
    """A snapshot left by an earlier job, matching the pattern: not this job's."""
    snapshot = str(tmp_path / "run" / "snapshot.pt")
    folder = job_folder(tmp_path, [snapshot], {})
    history = History.load(folder, JOB)
    history.runs.append(Run(0, "n1", 5000.0, None))
    history.save(folder)
    touch(Path(snapshot), 1000.0)
    assert status_of(folder).found_checkpoint is None
    assert "last checkpoint: none seen" in render_status(status_of(folder))
    os.utime(snapshot, (5100.0, 5100.0))  # the job wrote it
    assert status_of(folder).found_checkpoint == snapshot


def test_relative_patterns_start_from_the_submit_folder() -> None:
    assert absolute(["snap.pt", "/abs/*.pt", "../x/**/*.pt"], "/home/u/p[2]") == [
        "/home/u/p[[]2]/snap.pt",
        "/abs/*.pt",
        "/home/u/p[[]2]/../x/**/*.pt",
    ]
    assert found_checkpoints.submit_dir({"SLURM_SUBMIT_DIR": "/s"}) == "/s"


@pytest.mark.parametrize(
    ("pattern", "base"),
    [
        ("/a/b/snapshot.pt", "/a/b"),
        ("/a/b*/c/*.pt", "/a"),
        ("/a/**/x.ckpt", "/a"),
        ("/*.pt", "/"),
        ("x.pt", "."),
    ],
)
def test_the_folder_a_pattern_starts_from(pattern: str, base: str) -> None:
    assert base_folder(pattern) == base


def refusing(locked: Path) -> found_checkpoints.Listable:
    """Every folder but ``locked`` can be listed (as for a user without its read
    permission: the tests may run as root, who reads any folder)."""

    def can_list(folder: str) -> bool:
        return Path(folder) != locked

    return can_list


def test_an_unreadable_folder_is_a_note(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    touch(locked / "snapshot.pt", 1.0)
    touch(tmp_path / "open" / "other.pt", 2.0)
    patterns = [str(locked / "*.pt"), str(tmp_path / "open" / "*.pt")]
    found = search(patterns, refusing(locked))
    assert found.newest() == Found(tmp_path / "open" / "other.pt", 2.0)
    assert found.notes == (
        f"checkpoint folder {locked} (of {locked}/*.pt) cannot be read: Permission denied",
    )


def job_folder(root: Path, patterns: list[str], own: dict[int, float]) -> Path:
    """A job folder whose history declares ``patterns``, with hpclaunch's own
    checkpoints at ``own`` (step: mtime)."""
    folder = root / "logs" / str(JOB)
    History(JOB, 3, checkpoint_dir=str(folder / "ckpt"), checkpoint_patterns=patterns).save(folder)
    (folder / "ckpt").mkdir()
    for step, mtime in own.items():
        touch(folder / "ckpt" / f"step-{step:012d}.pt", mtime)
    return folder


def status_of(folder: Path) -> JobStatus:
    return gather(JOB, None, {"HOME": str(folder / "home")}, folder)


def test_status_shows_the_newer_of_its_own_and_the_jobs_checkpoints(tmp_path: Path) -> None:
    snapshot = str(tmp_path / "run" / "snapshot.pt")
    folder = job_folder(tmp_path, [snapshot], {5: 2000.0})
    touch(Path(snapshot), 1000.0)
    older = status_of(folder)
    assert (older.found_checkpoint, older.found_checkpoint_written) == (snapshot, 1000.0)
    assert not older.found_is_last and older.last_checkpoint == older.checkpoint_path
    assert "  last checkpoint: step 5 (" in render_status(older)
    os.utime(snapshot, (3000.0, 3000.0))
    newer = status_of(folder)
    assert newer.found_is_last and newer.last_checkpoint == snapshot
    line = f"\n  last checkpoint: {snapshot} (written {when(3000.0)})\n"
    assert line in render_status(newer)
    data = newer.to_json()
    assert (data["last_checkpoint"], data["checkpoint_patterns"]) == (snapshot, [snapshot])
    assert (data["checkpoint_step"], data["checkpoint_written"]) == (5, 2000.0)
    assert data["found_checkpoint_written"] == 3000.0


def when(seconds: float) -> str:
    from hpclaunch.cli.format import when as format_when

    return format_when(seconds)


def test_status_without_any_checkpoint_names_where_it_looked(tmp_path: Path) -> None:
    pattern = str(tmp_path / "run" / "*.pt")
    folder = job_folder(tmp_path, [pattern, "/x/y.pt"], {})
    report = render_status(status_of(folder))
    assert (
        f"  last checkpoint: none seen in {folder / 'ckpt'}, nor matching {pattern}, /x/y.pt\n"
        in (report + "\n")
    )
    lightning = touch(folder / "ckpt" / "lightning" / "step-000000000007.ckpt", 50.0)
    found = status_of(folder)
    assert found.last_checkpoint == str(lightning) and found.checkpoint_step is None


def test_a_job_with_only_hpclaunchs_checkpoints_reads_as_before(tmp_path: Path) -> None:
    folder = job_folder(tmp_path, [], {5: 100.0, 10: 200.0})
    status = status_of(folder)
    own = folder / "ckpt" / f"step-{10:012d}.pt"
    assert f"\n  last checkpoint: step 10 ({own})\n" in render_status(status)
    assert status.found_checkpoint is None and status.last_checkpoint == str(own)
    empty = job_folder(tmp_path / "other", [], {})
    assert f"\n  last checkpoint: none seen in {empty / 'ckpt'}\n" in render_status(
        status_of(empty)
    )


def test_follow_tells_each_new_checkpoint_found_by_pattern(tmp_path: Path) -> None:
    before = JobStatus(JOB, found_checkpoint="/r/snapshot.pt", found_checkpoint_written=1.0)
    after = JobStatus(JOB, found_checkpoint="/r/snapshot.pt", found_checkpoint_written=2.0)
    assert changes(before, after) == ["checkpoint: /r/snapshot.pt"]
    assert changes(after, after) == []


def test_an_older_history_without_patterns_still_loads(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    History(JOB, 3).save(folder)
    data = json.loads((folder / "history.json").read_text())
    del data["checkpoint_patterns"]
    (folder / "history.json").write_text(json.dumps(data))
    assert History.load(folder, JOB).checkpoint_patterns == []


def test_the_supervisor_records_the_patterns_from_the_submit_folder(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": str(JOB), "SLURM_SUBMIT_DIR": str(tmp_path / "sub"), "PATH": "/bin"}
    status = supervise(
        [sys.executable, "-c", "pass"],
        env=env,
        slurm=Slurm(FakeRunner({})),
        job_dir=tmp_path / "job",
        max_requeues=3,
        checkpoint_patterns=("snapshot.pt", "/abs/**/*.ckpt"),
    )
    assert status == 0
    assert History.load(tmp_path / "job", JOB).checkpoint_patterns == [
        str(tmp_path / "sub" / "snapshot.pt"),
        "/abs/**/*.ckpt",
    ]


# --- hpclaunch sbatch --checkpoint-pattern -------------------------------------------------


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "ckpts").mkdir()
    return tmp_path


def sbatch(project: Path, *args: str, runner: FakeRunner | None = None) -> Result:
    obj = CliContext(
        slurm=Slurm(runner or FakeRunner({})), cwd=project, env={"HOME": str(project / "home")}
    )
    return CliRunner().invoke(main, ["sbatch", *args], obj=obj)


def test_sbatch_passes_each_pattern_to_the_supervisor(project: Path) -> None:
    result = sbatch(
        project,
        "--dry-run",
        "--checkpoint-pattern",
        "snapshot.pt",
        "--checkpoint-pattern",
        "out dir/**/*.ckpt",
        "train.py",
    )
    assert result.exit_code == 0, result.output
    assert (
        "--checkpoint-pattern snapshot.pt --checkpoint-pattern 'out dir/**/*.ckpt' --job-dir"
    ) in result.stdout
    assert "--checkpoint-pattern" not in sbatch(project, "--dry-run", "train.py").stdout


def test_a_profile_and_the_flags_add_up(project: Path) -> None:
    (project / "hpclaunch.toml").write_text(
        '[profiles.default]\ncheckpoint_patterns = ["lightning_logs/**/*.ckpt"]\n'
    )
    result = sbatch(project, "--dry-run", "--checkpoint-pattern", "snapshot.pt", "train.py")
    assert result.exit_code == 0, result.output
    assert (
        "--checkpoint-pattern 'lightning_logs/**/*.ckpt' --checkpoint-pattern snapshot.pt"
    ) in result.stdout


@pytest.mark.parametrize(
    ("pattern", "needles"),
    [
        ("", ["--checkpoint-pattern: '' is empty; give a glob such as 'snapshot.pt'"]),
        ("  ", ["--checkpoint-pattern: '  ' is empty"]),
        ("a.pt\nb.pt", ["--checkpoint-pattern: 'a.pt\\nb.pt' contains a line break"]),
        ("ckpt/**.pt", ["--checkpoint-pattern: 'ckpt/**.pt' has '**' inside a name", "'ckpt/**/"]),
        ("ckpts", ["--checkpoint-pattern: 'ckpts' names the folder 'ckpts'", "give 'ckpts/*'"]),
        ("out/", ["--checkpoint-pattern: 'out/' names the folder 'out'", "give 'out/*'"]),
    ],
)
def test_a_bad_pattern_is_a_usage_error_and_submits_nothing(
    project: Path, pattern: str, needles: list[str]
) -> None:
    runner = FakeRunner({})
    result = sbatch(project, "--checkpoint-pattern", pattern, "train.py", runner=runner)
    assert result.exit_code == 2, result.output
    for needle in needles:
        assert needle in result.stderr
    assert "Traceback" not in result.output and runner.calls == []
    assert not (project / "hpclaunch-logs").exists()


def test_the_spec_checks_patterns_from_the_python_api_too() -> None:
    assert JobSpec("t.py", checkpoint_patterns=("snapshot.pt", "ckpt/**/*.ckpt", "/a/*/"))
    with pytest.raises(SpecError, match="is not a tuple"):
        JobSpec("t.py", checkpoint_patterns=["x.pt"])  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="NUL byte"):
        JobSpec("t.py", checkpoint_patterns=("x\0.pt",))


def test_a_script_with_a_pattern_passes_bash_n(project: Path) -> None:
    result = sbatch(project, "--dry-run", "--checkpoint-pattern", "a'b $(x)/*.pt", "train.py")
    assert result.exit_code == 0, result.output
    subprocess.run(["bash", "-n"], input=result.stdout, text=True, check=True)
