"""Operating jobs without SLURM: the job list, the status gathered from a job folder
written as the supervisor and agents write it (scontrol and sacct scripted by
FakeRunner), the changes `--follow` prints, and the commands through CliRunner.
The same commands run against real jobs in tests/integration/test_operate.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from hpclaunch.cli import CliContext, main
from hpclaunch.jobdir import saves, set_aside
from hpclaunch.jobdir.history import Action, History, Reason, Run, finish
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.ops import registry
from hpclaunch.ops.follow import Tail, changes, watch
from hpclaunch.ops.status import Exclusion, JobStatus, exit_status, gather
from hpclaunch.recovery.policy import Decision
from hpclaunch.slurm.commands import CommandResult, FakeRunner, Slurm

JOB = 812


def scontrol(**fields: str) -> Callable[[tuple[str, ...]], CommandResult]:
    """scontrol show job, answering with ``fields``; no fields: SLURM forgot the job."""

    def answer(argv: tuple[str, ...]) -> CommandResult:
        if argv[1] == "show" and not fields:
            return CommandResult(argv, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
        if argv[1] == "show":
            return CommandResult(argv, 0, " ".join(f"{k}={v}" for k, v in fields.items()) + "\n")
        return CommandResult(argv, 0)

    return answer


def no_sacct(argv: tuple[str, ...]) -> CommandResult:
    return CommandResult(argv, 1, "", "sacct: error: Slurm accounting storage is disabled\n")


def job_folder(root: Path) -> Path:
    """A job folder as a run that lost n2, then was requeued and is running, leaves it."""
    folder = root / "logs" / str(JOB)
    history = History(JOB, 3, checkpoint_dir=str(folder / "ckpt"))
    history.runs = [
        Run(
            0,
            "n[1-3]",
            1000.0,
            1060.0,
            1,
            None,
            "bad nodes",
            "requeue",
            ["n2"],
            "RuntimeError: CUDA error",
        ),
        Run(1, "n[1,3-4]", 1100.0),
    ]
    history.save(folder)
    for requeue_count, attempt, nodes in (
        (0, 0, {"n1": [0, 1], "n2": [2, 3]}),
        (0, 1, {"n1": [0, 1], "n2": [2, 3]}),
        (1, 0, {"n1": [0, 1], "n4": [2, 3]}),
    ):
        logs = folder / "logs" / f"requeue-{requeue_count}" / "step-0" / f"attempt-{attempt}"
        logs.mkdir(parents=True)
        for node, ranks in nodes.items():
            (logs / f"node-{node}.ranks").write_text(json.dumps(ranks) + "\n")
            for rank in ranks:
                (logs / f"rank-{rank}.out").write_text(f"r{requeue_count}a{attempt} rank {rank}\n")
    (folder / "ckpt").mkdir()
    for step in (5, 10):
        (folder / "ckpt" / f"step-{step:012d}.pt").write_bytes(b"x")
    (folder / "ckpt" / ".step-000000000015.pt.tmp-9").write_bytes(b"half")  # not complete
    return folder


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")}


def test_the_job_list_appends_and_skips_damaged_lines(env: dict[str, str]) -> None:
    assert registry.entries(env) == []
    registry.add(env, registry.Entry(1, "/jobs/1", "a", 10.0))
    with registry.path(env).open("a") as handle:
        handle.write("{not json\n")
    registry.add(env, registry.Entry(2, "/jobs/2", "b", 11.0, "c1", "/work"))
    registry.add(env, registry.Entry(1, "/other/1", "a2", 12.0))  # the id came round again
    assert [e.job_id for e in registry.entries(env)] == [1, 2, 1]
    found = registry.find(env, 1)
    assert found is not None and found.job_dir == "/other/1"
    assert registry.find(env, 3) is None
    assert registry.path({"HOME": "/home/u"}) == Path("/home/u/.local/state/hpclaunch/jobs.jsonl")


def test_status_joins_slurm_and_the_job_folder(tmp_path: Path, env: dict[str, str]) -> None:
    folder = job_folder(tmp_path)
    slurm = Slurm(
        FakeRunner(
            {
                "scontrol": scontrol(
                    JobId=str(JOB),
                    JobName="train",
                    JobState="RUNNING",
                    Restarts="1",
                    NodeList="n[1,3-4]",
                    ExitCode="0:0",
                    StdOut=str(tmp_path / "logs" / f"train-{JOB}.out"),
                    Reason="None",
                )
            }
        )
    )
    status = gather(JOB, slurm, env)  # found by StdOut: not in the job list
    assert (status.state, status.state_source, status.name) == ("RUNNING", "scontrol", "train")
    assert status.nodes == ["n1", "n3", "n4"] and status.requeues == 1
    assert status.max_requeues == 3
    assert status.excluded == [Exclusion("n2", "bad nodes: RuntimeError: CUDA error")]
    assert (status.attempts, status.attempts_total) == (1, 3)
    assert status.checkpoint_step == 10
    assert status.checkpoint_path == str(folder / "ckpt" / f"step-{10:012d}.pt")
    assert status.job_dir == str(folder) and not status.ended and status.notes == []
    assert [run.reason for run in status.runs] == ["bad nodes", None]


def test_status_from_the_folder_alone_once_slurm_forgot(
    tmp_path: Path, env: dict[str, str]
) -> None:
    folder = job_folder(tmp_path)
    history = History.load(folder, JOB, 3)
    finish(history.runs[-1], 0, None, Decision(Action.NONE, Reason.COMPLETED, 0))
    history.save(folder)
    slurm = Slurm(FakeRunner({"scontrol": scontrol(), "sacct": no_sacct}))
    status = gather(JOB, slurm, env, folder)
    assert (status.state, status.state_source) == ("COMPLETED", "history")
    assert status.ended and exit_status(status) == 0
    assert status.requeues == 1  # from history.json, as SLURM cannot say
    assert (
        "Invalid job id" in status.notes[0] and "accounting storage is disabled" in status.notes[0]
    )


def test_status_without_the_folder_names_the_fix(env: dict[str, str]) -> None:
    slurm = Slurm(FakeRunner({"scontrol": scontrol(JobState="PENDING", Reason="Resources")}))
    status = gather(JOB, slurm, env)
    assert status.state == "PENDING" and status.pending_reason == "Resources"
    assert status.job_dir is None and "pass --job-dir" in status.notes[0]


def test_attempts_are_in_run_order(tmp_path: Path) -> None:
    folder = job_folder(tmp_path)
    found = JobFolder(folder).attempts()
    assert [(a.requeue, a.step, a.attempt) for a in found] == [
        (0, "0", 0),
        (0, "0", 1),
        (1, "0", 0),
    ]
    assert found[2].node_ranks() == {"n1": [0, 1], "n4": [2, 3]}


def test_changes_are_told_once_each() -> None:
    pending = JobStatus(JOB, state="PENDING", pending_reason="Priority")
    running = JobStatus(JOB, state="RUNNING", nodes=["n1", "n2"], requeues=0, attempts=1)
    assert changes(None, pending) == ["state PENDING (Priority)"]
    assert changes(pending, running) == ["state RUNNING on n[1-2]"]
    assert changes(running, running) == []
    why = "attempt 1 began after attempt 0 failed: rank 3 on n2: ValueError: boom"
    restarted = JobStatus(
        JOB,
        state="RUNNING",
        nodes=["n1", "n2"],
        requeues=0,
        attempts=2,
        checkpoint_step=10,
        restarts=[why],
    )
    assert changes(running, restarted) == [
        f"worker group restarted in place: {why}",
        "checkpoint: step 10",
    ]
    assert changes(restarted, restarted) == []
    from hpclaunch.ops.status import RunSummary

    requeued = JobStatus(
        JOB,
        state="PENDING",
        requeues=1,
        max_requeues=3,
        checkpoint_step=10,
        excluded=[Exclusion("n2", "bad nodes: boom")],
        pending_reason="BeginTime",
        runs=[RunSummary(0, ["n1", "n2"], 1.0, 2.0, "bad nodes", "requeue")],
    )
    assert changes(restarted, requeued) == [
        "requeued (1 of 3): bad nodes",
        "node n2 kept out: bad nodes: boom",
        "state PENDING (BeginTime)",
    ]
    done = JobStatus(JOB, state="FAILED", exit_code="1:0", requeues=1, checkpoint_step=12)
    # The last checkpoint and the end seen in one look: the end comes last.
    assert changes(requeued, done) == ["checkpoint: step 12", "state FAILED, exit code 1:0"]
    assert exit_status(done) == 1


def test_watch_stops_at_the_end_and_sleeps_between_looks() -> None:
    looks = iter(
        [
            JobStatus(JOB, state="PENDING"),
            JobStatus(JOB, state="RUNNING"),
            JobStatus(JOB, state="COMPLETED", exit_code="0:0"),
        ]
    )
    lines: list[str] = []
    sleeps: list[float] = []
    last = watch(lambda: next(looks), lines.append, sleeps.append)
    assert last.state == "COMPLETED" and exit_status(last) == 0
    assert lines == ["state PENDING", "state RUNNING", "state COMPLETED, exit code 0:0"]
    assert len(sleeps) == 2


def test_tail_gives_whole_lines_as_they_come(tmp_path: Path) -> None:
    first, second = tmp_path / "a.out", tmp_path / "b.out"
    first.write_text("one\ntw")
    tail = Tail()
    files = [("a", first), ("b", second)]
    assert "".join(tail.read(files, headers=True)) == f"==> a: {first} <==\none\n"
    with first.open("a") as handle:
        handle.write("o\n")
    second.write_text("three")
    assert "".join(tail.read(files, headers=True)) == "two\n"
    assert "".join(tail.rest(files, headers=True)) == f"==> b: {second} <==\nthree\n"
    assert "".join(tail.rest(files, headers=True)) == ""


def cli(tmp_path: Path, env: dict[str, str], runner: FakeRunner, *args: str) -> Result:
    obj = CliContext(slurm=Slurm(runner), cwd=tmp_path, env=env)
    return CliRunner().invoke(main, list(args), obj=obj)


def test_status_command_human_and_json(tmp_path: Path, env: dict[str, str]) -> None:
    folder = job_folder(tmp_path)
    registry.add(env, registry.Entry(JOB, str(folder), "train", 1000.0))
    fake = FakeRunner(
        {
            "scontrol": scontrol(
                JobState="RUNNING", NodeList="n[1,3-4]", Restarts="1", JobName="train"
            )
        }
    )
    human = cli(tmp_path, env, fake, "status", str(JOB))
    assert human.exit_code == 0, human.output
    assert human.stdout.startswith(f"job {JOB} (train): RUNNING\n")
    assert "  nodes:           n[1,3-4] (3)\n" in human.stdout
    assert "  requeues:        1 of at most 3\n" in human.stdout
    assert "  kept out:        n2: bad nodes: RuntimeError: CUDA error\n" in human.stdout
    assert "  last checkpoint: step 10 (" in human.stdout
    data = json.loads(cli(tmp_path, env, fake, "status", "--json", str(JOB)).stdout)
    assert data["state"] == "RUNNING" and data["checkpoint_step"] == 10
    assert data["excluded"] == [{"node": "n2", "reason": "bad nodes: RuntimeError: CUDA error"}]
    bad = cli(tmp_path, env, fake, "status", "12x")
    assert bad.exit_code == 2 and "'12x' is not a job id" in bad.stderr


def test_status_shows_the_last_save_its_lead_warning_and_damaged_ones(
    tmp_path: Path, env: dict[str, str]
) -> None:
    folder = job_folder(tmp_path)
    history = History.load(folder, JOB)
    history.signal_lead_s = 20  # the workers get 15 s after the warning
    history.save(folder)
    for step, total in ((5, 18.0), (10, 3.5)):
        saves.append(
            JobFolder(folder).saves,
            saves.SaveRecord(
                step=step,
                sharded=True,
                asynchronous=True,
                blocked_s=0.5,
                total_s=total,
                bytes=2 * 1024**3,
                ranks=8,
                ended=1100.0,
            ),
        )
    (folder / "ckpt" / "step-000000000007.damaged").mkdir()
    # One load_latest set aside and noted why (an earlier hpclaunch, or a hand, did not).
    noted = folder / "ckpt" / "step-000000000015.damaged"
    noted.mkdir()
    set_aside.append(
        JobFolder(folder).set_aside,
        set_aside.SetAside(15, "checksum mismatch", "__1_0.distcp", "crc32 ...", str(noted), 1.0),
    )
    fake = FakeRunner({"scontrol": scontrol(JobState="RUNNING", JobName="train")})
    human = cli(tmp_path, env, fake, "status", "--job-dir", str(folder), str(JOB))
    assert human.exit_code == 0, human.output
    assert (
        "  last save:       step 10: 2.0 GiB sharded by 8 ranks, asynchronous, blocked "
        "training 0.50 s, committed after 3.50 s\n"
    ) in human.stdout
    assert "note: the checkpoint save of step 5 took 18.0 s, but after the time-limit " in (
        human.stdout
    )
    assert (
        "note: set aside as damaged (failed to load; the previous checkpoint was used): "
        f"step-000000000007.damaged in {folder / 'ckpt'}\n"
    ) in human.stdout
    assert (
        f"note: checkpoint step 15 set aside: checksum mismatch in __1_0.distcp (now {noted})\n"
    ) in human.stdout


def test_an_unknown_job_is_an_error_naming_the_fix(tmp_path: Path, env: dict[str, str]) -> None:
    result = cli(
        tmp_path, env, FakeRunner({"scontrol": scontrol(), "sacct": no_sacct}), "status", "99"
    )
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: job 99 (from JOBID) is unknown: scontrol: ")
    assert "pass --job-dir LOG_DIR/JOBID" in result.stderr


def test_logs_of_a_rank_and_of_a_node_across_attempts(tmp_path: Path, env: dict[str, str]) -> None:
    folder = job_folder(tmp_path)
    fake = FakeRunner({"scontrol": scontrol(JobState="RUNNING")})
    by_rank = cli(tmp_path, env, fake, "logs", "--job-dir", str(folder), "--rank", "2", str(JOB))
    assert by_rank.exit_code == 0, by_rank.output
    assert [line for line in by_rank.stdout.splitlines() if not line.startswith("==>")] == [
        "r0a0 rank 2",
        "r0a1 rank 2",
        "r1a0 rank 2",
    ]
    assert "==> rank 2, requeue 1, step 0, attempt 0: " in by_rank.stdout
    by_node = cli(tmp_path, env, fake, "logs", "--job-dir", str(folder), "--node", "n4", str(JOB))
    assert [line for line in by_node.stdout.splitlines() if not line.startswith("==>")] == [
        "r1a0 rank 2",
        "r1a0 rank 3",
    ]
    nowhere = cli(tmp_path, env, fake, "logs", "--job-dir", str(folder), "--node", "n9", str(JOB))
    assert nowhere.exit_code == 1 and "nodes it ran on: n1, n2, n4" in nowhere.stderr


def test_cancel_notes_it_for_the_supervisor_then_scancels(
    tmp_path: Path, env: dict[str, str]
) -> None:
    folder = job_folder(tmp_path)
    registry.add(env, registry.Entry(JOB, str(folder), "train", 1000.0))
    fake = FakeRunner(
        {
            "scontrol": scontrol(JobState="RUNNING", NodeList="n1"),
            "scancel": lambda argv: CommandResult(argv, 0),
        }
    )
    result = cli(tmp_path, env, fake, "cancel", str(JOB))
    assert result.exit_code == 0, result.output
    assert result.stdout == f"job {JOB}: cancelled (was RUNNING on n1); it will not be requeued\n"
    assert ("scancel", str(JOB)) in fake.calls
    assert (folder / "cancelled").exists()


def test_a_refused_cancel_leaves_no_note(tmp_path: Path, env: dict[str, str]) -> None:
    folder = job_folder(tmp_path)

    def denied(argv: tuple[str, ...]) -> CommandResult:
        return CommandResult(argv, 1, "", "Access denied\n")

    refused = FakeRunner({"scontrol": scontrol(JobState="RUNNING"), "scancel": denied})
    result = cli(tmp_path, env, refused, "cancel", "--job-dir", str(folder), str(JOB))
    assert result.exit_code == 3 and "Access denied" in result.stderr
    assert not (folder / "cancelled").exists()
    ended = FakeRunner({"scontrol": scontrol(JobState="COMPLETED")})
    result = cli(tmp_path, env, ended, "cancel", "--job-dir", str(folder), str(JOB))
    assert result.exit_code == 1 and "already ended (COMPLETED); nothing to cancel" in result.stderr
    assert not any(call[0] == "scancel" for call in ended.calls)


def test_list_shows_the_latest_jobs_with_their_state(tmp_path: Path, env: dict[str, str]) -> None:
    folder = job_folder(tmp_path)
    fake = FakeRunner({"scontrol": scontrol(JobState="RUNNING", NodeList="n[1,3-4]", Restarts="1")})
    empty = cli(tmp_path, env, fake, "list")
    assert empty.exit_code == 0 and empty.stdout.startswith("no jobs submitted")
    registry.add(env, registry.Entry(7, str(tmp_path / "gone"), "old", 900.0))
    registry.add(env, registry.Entry(JOB, str(folder), "train", 1000.0))
    rows = json.loads(cli(tmp_path, env, fake, "list", "--json").stdout)
    listed = [(r["job_id"], r["state"], r["requeues"]) for r in rows]
    assert listed == [(7, "RUNNING", 1), (JOB, "RUNNING", 1)]
    table = cli(tmp_path, env, fake, "list", "-n", "1").stdout.splitlines()
    assert table[0].split()[:5] == ["JOBID", "NAME", "STATE", "NODES", "REQUEUES"]
    assert table[1].split()[:5] == [str(JOB), "train", "RUNNING", "n[1,3-4]", "1"]
    assert len(table) == 2


def test_a_lost_node_is_kept_out_after_slurms_requeue() -> None:
    from hpclaunch.recovery.job_commands import keep_lost_out
    from hpclaunch.slurm.retry import Window

    now = Window(0.0, "test")  # closed: one try each

    def sinfo(argv: tuple[str, ...]) -> CommandResult:
        return CommandResult(argv, 0, "n1 allocated\nn2 down*\nn3 mixed*\nn4 idle\nn5 drained\n")

    fake = FakeRunner({"sinfo": sinfo, "scontrol": lambda argv: CommandResult(argv, 0)})
    kept = keep_lost_out(Slurm(fake), JOB, ["n1", "n2", "n3", "n5"], ["n7"], now)
    assert kept == ("n2", "n3")  # down, or not responding; drained is an admin's choice
    assert fake.calls[-1] == ("scontrol", "update", f"JobId={JOB}", "ExcNodeList=n7,n2,n3")
    healthy = FakeRunner({"sinfo": lambda argv: CommandResult(argv, 0, "n1 allocated\n")})
    assert keep_lost_out(Slurm(healthy), JOB, ["n1"], [], now) == ()
    assert [call[0] for call in healthy.calls] == ["sinfo"]  # nothing to update
    assert keep_lost_out(Slurm(FakeRunner({})), JOB, ["n1"], [], now) == ()  # no sinfo here


def test_history_tells_the_state_only_once_slurm_forgot(
    tmp_path: Path, env: dict[str, str]
) -> None:
    folder = job_folder(tmp_path)
    history = History.load(folder, JOB)
    finish(history.runs[-1], 1, None, Decision(Action.REQUEUE, Reason.BAD_NODES, 0, ("n3",)))
    history.save(folder)

    def timed_out(argv: tuple[str, ...]) -> CommandResult:
        return CommandResult(argv, 1, "", "slurm_load_jobs error: Socket timed out\n")

    unreachable = Slurm(FakeRunner({"scontrol": timed_out, "sacct": no_sacct}))
    status = gather(JOB, unreachable, env, folder)
    assert status.state is None and not status.ended and status.slurm_unreachable
    forgot = Slurm(FakeRunner({"scontrol": scontrol(), "sacct": no_sacct}))
    status = gather(JOB, forgot, env, folder)
    # Requeued, then forgotten: cancelled while pending, or lost; it is over, without a verdict.
    assert (status.state, status.state_source) == ("ENDED", "history") and status.ended
    assert "did not record how it ended" in status.notes[-1]
    finish(history.runs[-1], 1, None, Decision(Action.REQUEUE_FAILED, Reason.TIME_LIMIT, 3))
    history.save(folder)
    assert gather(JOB, forgot, env, folder).state == "FAILED"


def test_following_a_job_nobody_can_place_gives_up() -> None:
    from hpclaunch.ops.follow import LostTrack

    forgotten = JobStatus(JOB, slurm_forgot=True, notes=["scontrol: Invalid job id"])
    with pytest.raises(LostTrack, match=f"cannot tell whether job {JOB} is still running"):
        watch(lambda: forgotten, lambda line: None, lambda s: None)
    blind = JobStatus(JOB, slurm_unreachable=True, notes=["scontrol: Socket timed out"])
    sleeps: list[float] = []
    with pytest.raises(LostTrack, match="Socket timed out"):
        watch(lambda: blind, lambda line: None, sleeps.append, blind_looks=3)
    assert len(sleeps) == 2


def test_the_batch_log_and_name_outlive_slurms_memory(tmp_path: Path, env: dict[str, str]) -> None:
    folder = job_folder(tmp_path)
    (folder.parent / f"train-{JOB}.out").write_bytes(b"supervisor: \xff job completed\n")
    registry.add(env, registry.Entry(JOB, str(folder), "train", 1000.0))
    status = gather(JOB, Slurm(FakeRunner({"scontrol": scontrol(), "sacct": no_sacct})), env)
    assert status.name == "train" and status.batch_log == str(folder.parent / f"train-{JOB}.out")
    shown = cli(
        tmp_path, env, FakeRunner({"scontrol": scontrol(), "sacct": no_sacct}), "logs", str(JOB)
    )
    assert shown.exit_code == 0 and "job completed" in shown.stdout


def test_a_damaged_root_cause_or_a_future_job_list_line_is_read(
    tmp_path: Path, env: dict[str, str]
) -> None:
    folder = job_folder(tmp_path)
    block = folder / "failures" / "requeue-1" / "root-cause-n1.txt"
    block.parent.mkdir(parents=True)
    block.write_bytes(b"root cause: rank 0 \xff\xfe\n")
    assert "root cause: rank 0" in (
        gather(JOB, Slurm(FakeRunner({})), env, folder).root_cause or ""
    )
    target = registry.path(env)
    target.parent.mkdir(parents=True)
    target.write_text(
        json.dumps({"job_id": 5, "job_dir": "/j/5", "name": "a", "submitted": 1.0, "new": 1})
        + "\n"
        + json.dumps({"job_id": 6, "job_dir": "/j/6", "name": "b", "submitted": "x"})
        + "\n"
    )
    assert [e.job_id for e in registry.entries(env)] == [5]  # extra key kept, bad type skipped


def test_bad_job_ids_and_flags_are_usage_errors(tmp_path: Path, env: dict[str, str]) -> None:
    fake = FakeRunner({})
    odd = cli(tmp_path, env, fake, "status", "\u00b2")
    assert odd.exit_code == 2 and "is not a job id" in odd.stderr and "Traceback" not in odd.output
    (tmp_path / "train.py").write_text("")
    both = cli(tmp_path, env, fake, "sbatch", "--dry-run", "--follow", "train.py")
    assert both.exit_code == 2 and "--dry-run submits none" in both.stderr
    unreachable = cli(tmp_path, env, fake, "status", "12")  # no SLURM commands, no folder
    assert unreachable.exit_code == 3 and "not on PATH here" in unreachable.stderr
