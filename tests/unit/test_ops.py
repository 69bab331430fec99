"""The operating logic that exists once: the follow loop (status/sbatch/logs --follow),
the job-list note on submit (sbatch and the Executor), cancel, and the rows of
``hpclaunch list``; SLURM scripted by FakeRunner."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpclaunch.cli import CliContext, main
from hpclaunch.ops import follow, listing, registry
from hpclaunch.ops.cancel import cancel
from hpclaunch.ops.logs import LogSelection, follow_logs
from hpclaunch.ops.status import JobNotFound, JobStatus
from hpclaunch.slurm.commands import CommandResult, FakeRunner, Slurm

JOB = 55


def test_the_loop_starts_from_a_given_look_and_keeps_the_last_when_lost() -> None:
    seen: list[str | None] = []
    looks = iter([JobStatus(JOB, state="RUNNING"), JobStatus(JOB, state="COMPLETED")])
    last = follow.loop(
        lambda: next(looks),
        lambda now: seen.append(now.state),
        lambda s: None,
        first=JobStatus(JOB, state="PENDING"),
    )
    assert seen == ["PENDING", "RUNNING", "COMPLETED"] and last.state == "COMPLETED"
    forgotten = JobStatus(JOB, slurm_forgot=True, notes=["gone"])
    with pytest.raises(follow.LostTrack) as lost:
        follow.loop(lambda: forgotten, lambda now: None, lambda s: None)
    assert lost.value.last is forgotten and "gone" in str(lost.value)


def test_following_logs_writes_what_came_then_the_rest(tmp_path: Path) -> None:
    log = tmp_path / "train-55.out"
    log.write_text("one\n")
    first = JobStatus(JOB, state="RUNNING", batch_log=str(log), job_dir=str(tmp_path))

    def look() -> JobStatus:
        log.write_text("one\ntwo\nthree")  # the last line not yet ended
        return JobStatus(
            JOB,
            slurm_forgot=True,
            notes=["scontrol: Invalid job id"],
            batch_log=str(log),
            job_dir=str(tmp_path),
        )

    out: list[str] = []
    warned: list[str] = []
    follow_logs(LogSelection(), first, look, out.extend, warned.append, lambda s: None)
    assert "".join(out) == "one\ntwo\nthree\n"
    assert warned == [f"hpclaunch: lost track of job {JOB}'s state: scontrol: Invalid job id"]


def test_ranks_logs_need_the_folder() -> None:
    unknown = JobStatus(JOB, state="RUNNING", notes=["not in the job list"])
    with pytest.raises(JobNotFound, match="folder is unknown: not in the job list"):
        LogSelection(rank=0).folder(unknown)
    assert LogSelection().folder(unknown) == Path()  # the batch log may still be known


def test_the_job_list_note_says_what_failed(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    assert registry.note(env, 1, tmp_path / "1", "a", tmp_path) is None
    (entry,) = registry.entries(env)
    assert (entry.job_id, entry.job_dir, entry.workdir) == (1, str(tmp_path / "1"), str(tmp_path))
    blocked = tmp_path / "file"
    blocked.write_text("")
    problem = registry.note({"XDG_STATE_HOME": str(blocked)}, 2, tmp_path / "2", "b", tmp_path)
    assert problem is not None
    assert problem.startswith(f"job 2 was submitted, but could not be added to {blocked}/")


def test_sbatch_and_the_executor_warn_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    (tmp_path / "train.py").write_text("")
    obj = CliContext(
        slurm=Slurm(FakeRunner({"sbatch": lambda a: CommandResult(a, 0, "77\n")})),
        cwd=tmp_path,
        env={"XDG_STATE_HOME": str(blocked)},
    )
    result = CliRunner().invoke(main, ["sbatch", "train.py"], obj=obj)
    assert result.exit_code == 0 and result.stdout == "77\n"
    assert result.stderr.startswith("hpclaunch: warning: job 77 was submitted, but could not")
    assert f"give `hpclaunch status` --job-dir {tmp_path / 'hpclaunch-logs' / '77'}" in (
        result.stderr
    )
    from hpclaunch.executor.api import _note_job

    monkeypatch.setenv("XDG_STATE_HOME", str(blocked))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _note_job(78, tmp_path / "logs", "f")
    assert [str(w.message).split(" (")[0] for w in caught] == [
        f"job 78 was submitted, but could not be added to {blocked}/hpclaunch/jobs.jsonl"
    ]


def _scontrol(state: str) -> FakeRunner:
    return FakeRunner(
        {
            "scontrol": lambda a: CommandResult(
                a, 0, f"JobId={JOB} JobState={state} NodeList=n1\n"
            ),
            "scancel": lambda a: CommandResult(a, 0),
        }
    )


def test_cancel_without_a_folder_promises_less(tmp_path: Path) -> None:
    fake = _scontrol("RUNNING")
    done = cancel(JOB, Slurm(fake), {"HOME": str(tmp_path)})
    assert not done.noted and done.was.state == "RUNNING"
    assert fake.calls[-1] == ("scancel", str(JOB))


def test_the_list_rows_are_the_json_keys(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path)}
    registry.add(env, registry.Entry(JOB, str(tmp_path / "55"), "train", 5.0))
    (row,) = listing.latest(env, Slurm(_scontrol("PENDING")), 20)
    assert row == listing.ListedJob(JOB, "train", "PENDING", "n1", None, 5.0, str(tmp_path / "55"))
    obj = CliContext(slurm=Slurm(_scontrol("PENDING")), cwd=tmp_path, env=env)
    rows = json.loads(CliRunner().invoke(main, ["list", "--json"], obj=obj).stdout)
    assert list(rows[0]) == [
        "job_id",
        "name",
        "state",
        "nodes",
        "requeues",
        "submitted",
        "job_dir",
        "error",
    ]


def test_a_broken_entry_is_listed_as_unreadable_and_the_others_all_the_same(
    tmp_path: Path,
) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path)}
    for job in (55, 56, 57):
        (tmp_path / str(job)).mkdir()
    registry.add(env, registry.Entry(55, str(tmp_path / "55"), "train", 5.0))
    # A name no file name can hold (accepted before names were checked at submit): its
    # batch log cannot even be looked for by that name.
    registry.add(env, registry.Entry(56, str(tmp_path / "56"), "a" * 300, 6.0))
    broken = tmp_path / ("d" * 300) / "57"  # stat() of it fails: File name too long
    registry.add(env, registry.Entry(57, str(broken), "train", 7.0))
    registry.add(env, registry.Entry(58, str(tmp_path / "58"), "train", 8.0))
    obj = CliContext(slurm=Slurm(_scontrol("RUNNING")), cwd=tmp_path, env=env)
    done = CliRunner().invoke(main, ["list"], obj=obj)
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert [line.split()[:3] for line in lines[1:5]] == [
        ["55", "train", "RUNNING"],
        ["56", "a" * 37 + "...", "RUNNING"],
        [
            "57",
            "train",
            "RUNNING",
        ],
        ["58", "train", "RUNNING"],
    ]
    assert "(unreadable)" in lines[3]
    assert lines[5] == (
        f"job 57 is unreadable: job folder {str(broken)[:60]}...{str(broken)[-40:]} "
        f"({len(str(broken))} characters) cannot be read: File name too long"
    )
    for job in (56, 55):  # status of each job, the long-named one too
        shown = CliRunner().invoke(main, ["status", str(job)], obj=obj)
        assert shown.exit_code == 0 and f"job {job} (" in shown.stdout, shown.output
