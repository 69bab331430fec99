"""One checkpoint folder, one job at a time: the pure rule (plain values), the marker
file (real files), the checks at submit and at start with SLURM scripted by
FakeRunner, and `hpclaunch sbatch`'s refusal. The sandbox tier runs real jobs
(tests/integration/test_checkpoint_owner.py)."""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpclaunch.checkpoint import claim, owner
from hpclaunch.checkpoint.claim import FolderTaken
from hpclaunch.checkpoint.owner import Kind, MarkerError, Owner
from hpclaunch.checkpoint.sharing import (
    CLI,
    EXECUTOR,
    Holder,
    Liveness,
    Situation,
    Stage,
    Verdict,
    decide,
    dependency_of,
    waits_for,
)
from hpclaunch.cli import CliContext, main
from hpclaunch.errors import ExitCode
from hpclaunch.slurm.commands import CommandResult, FakeRunner, Slurm

HOLDER = Owner(Kind.SLURM, "41", "train", "ana", "login1")
ME = Owner(Kind.SLURM, "42", "train", "ana", "login1")
ACTIVE = Holder(HOLDER, Liveness.ACTIVE, "RUNNING")
ENDED = Holder(HOLDER, Liveness.ENDED, "COMPLETED")
UNKNOWN = Holder(HOLDER, Liveness.UNKNOWN, "SLURM did not answer: timed out")
# The holder, of the user running the tests (SLURM shows this user's jobs).
HOLDER_HERE = Owner(Kind.SLURM, "41", "train", getpass.getuser(), "login1")


def situation(
    stage: Stage,
    marker: Owner | None,
    holder: Holder | None,
    step: int | None,
    adopt: bool = False,
    dependency: str | None = None,
) -> Situation:
    me = ME if stage is Stage.START else None
    return Situation(
        "/ckpt",
        stage,
        marker,
        holder,
        step,
        adopt,
        me=me,
        dependency=dependency,
        name="train",
        user="ana",
        spell=CLI,
    )


@pytest.mark.parametrize(
    ("case", "verdict"),
    [
        # A requeue of the same job finds its own marker, checkpoints or not.
        (situation(Stage.START, ME, None, 9), Verdict.OWN),
        (situation(Stage.START, None, None, None), Verdict.FREE),
        (situation(Stage.START, HOLDER, ENDED, None), Verdict.FREE),
        (situation(Stage.START, HOLDER, ACTIVE, None), Verdict.IN_USE),
        (situation(Stage.START, HOLDER, ACTIVE, 9, adopt=True), Verdict.IN_USE),
        (situation(Stage.START, HOLDER, UNKNOWN, None), Verdict.UNKNOWN),
        (situation(Stage.START, HOLDER, ENDED, 9), Verdict.LEFT),
        (situation(Stage.START, HOLDER, ENDED, 9, adopt=True), Verdict.ADOPT),
        (situation(Stage.START, None, None, 9), Verdict.UNMARKED),
        (situation(Stage.START, None, None, 9, adopt=True), Verdict.ADOPT),
        # A dependency counts at submit only: at start SLURM has already let the job go.
        (situation(Stage.START, HOLDER, ACTIVE, 9, True, "afterany:41"), Verdict.IN_USE),
        (situation(Stage.SUBMIT, HOLDER, ACTIVE, 9), Verdict.IN_USE),
        (situation(Stage.SUBMIT, HOLDER, ACTIVE, 9, True, "afterany:41"), Verdict.QUEUED),
        (situation(Stage.SUBMIT, HOLDER, UNKNOWN, 9, True, "afterok:41"), Verdict.QUEUED),
        (situation(Stage.SUBMIT, HOLDER, ACTIVE, 9, False, "afterany:41"), Verdict.QUEUED_UNASKED),
        (situation(Stage.SUBMIT, HOLDER, ACTIVE, 9, True, "after:41"), Verdict.IN_USE),
        (situation(Stage.SUBMIT, HOLDER, ENDED, 9), Verdict.LEFT),
        (situation(Stage.SUBMIT, HOLDER, ENDED, 9, adopt=True), Verdict.ADOPT),
        # The job waited for may still be pending, its marker not written yet.
        (situation(Stage.SUBMIT, None, None, None, False, "afterany:41"), Verdict.QUEUED_UNASKED),
        (situation(Stage.SUBMIT, HOLDER, ENDED, None, False, "afterok:41"), Verdict.QUEUED_UNASKED),
        (situation(Stage.SUBMIT, None, None, None, True, "afterany:41"), Verdict.FREE),
        (situation(Stage.START, None, None, None, False, "afterany:41"), Verdict.FREE),
    ],
)
def test_the_rule(case: Situation, verdict: Verdict) -> None:
    assert decide(case).verdict is verdict


def test_a_refusal_names_the_folder_the_job_and_the_fixes() -> None:
    start = decide(situation(Stage.START, HOLDER, ACTIVE, None)).message
    assert start == (
        "checkpoint folder /ckpt is in use by job 41 (train, user ana, submitted from login1), "
        "which is RUNNING: two jobs in one folder would train on each other's checkpoints. "
        "This job ends without training; submit it again with another --checkpoint-dir, or "
        "once job 41 has ended (scancel 41 ends it now) with --adopt-checkpoints to continue "
        "from its checkpoints"
    )
    submit = decide(situation(Stage.SUBMIT, HOLDER, ACTIVE, None)).message
    assert submit.endswith(
        "or make it wait for that job (--sbatch-option "
        "dependency=afterany:41) with --adopt-checkpoints"
    )
    executor = Situation("/ckpt", Stage.SUBMIT, HOLDER, ACTIVE, None, False, spell=EXECUTOR)
    assert decide(executor).message.endswith(
        "Submit it with another checkpoint_dir, or once job 41 has ended (scancel 41 ends it "
        "now) with adopt_checkpoints=True to continue from its checkpoints, or make it wait "
        'for that job (sbatch_options={"dependency": "afterany:41"}) with adopt_checkpoints=True'
    )
    left = decide(situation(Stage.SUBMIT, HOLDER, ENDED, 9)).message
    assert left == (
        "checkpoint folder /ckpt holds checkpoints up to step 9 left by job 41 (train, user "
        "ana, submitted from login1), which has ended (COMPLETED); this job would start from "
        "them. Submit it with --adopt-checkpoints to continue from them on purpose, or with "
        "another --checkpoint-dir to start afresh"
    )
    unmarked = decide(situation(Stage.START, None, None, 9)).message
    assert "up to step 9 that no hpclaunch job marked as its own" in unmarked
    unknown = decide(situation(Stage.START, HOLDER, UNKNOWN, None)).message
    assert "cannot be told (SLURM did not answer: timed out); refusing rather than" in unknown


@pytest.mark.parametrize(
    ("dependency", "waits"),
    [
        ("afterany:41", True),
        ("afterok:40:41", True),
        ("afternotok:41", True),
        ("afterany:7,afterok:41", True),
        ("singleton", True),
        ("afterany:410", False),
        ("after:41", False),
        ("after:41+5", False),
        ("afterany:41?afterany:7", False),
        ("aftercorr:41", False),
        (None, False),
        ("", False),
    ],
)
def test_which_dependencies_wait_for_the_holder(dependency: str | None, waits: bool) -> None:
    assert waits_for(dependency, HOLDER, "train", "ana") is waits


def test_singleton_waits_only_for_the_same_name_and_user() -> None:
    assert not waits_for("singleton", HOLDER, "other", "ana")
    assert not waits_for("singleton", HOLDER, "train", "bob")
    assert dependency_of((("exclusive", None), ("dependency", "afterany:41"))) == "afterany:41"
    assert dependency_of((("d", "singleton"),)) == "singleton"
    assert dependency_of(()) is None


def test_the_marker_is_created_once_and_replaced_only_as_it_was_read(tmp_path: Path) -> None:
    assert owner.read(tmp_path) == (None, 0)
    assert owner.create(tmp_path, HOLDER)
    assert not owner.create(tmp_path, ME)  # the first one stays
    found, seen = owner.read(tmp_path)
    assert found == HOLDER and seen == 1
    other = Owner(Kind.SLURM, "43")
    assert not owner.take(tmp_path, seen - 1, other)  # changed since
    assert owner.read(tmp_path)[0] == HOLDER
    assert owner.take(tmp_path, seen, ME)
    assert owner.read(tmp_path) == (ME, 2)
    assert not owner.take(tmp_path, seen, other)  # read before ME took it
    assert owner.read(tmp_path) == (ME, 2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [".hpclaunch-owner.2.json"]  # no temporaries, the older one pruned


def test_a_marker_hpclaunch_did_not_write_is_named(tmp_path: Path) -> None:
    (tmp_path / ".hpclaunch-owner.1.json").write_text("{not json}\n")
    with pytest.raises(MarkerError, match=r"is not a marker hpclaunch wrote .* Remove it once"):
        owner.read(tmp_path)


def _scontrol(*states: str) -> FakeRunner:
    """scontrol answering each state in turn (then the last again)."""
    answers = list(states)

    def show(argv: tuple[str, ...]) -> CommandResult:
        state = answers.pop(0) if len(answers) > 1 else answers[0]
        if state == "forgotten":
            return CommandResult(argv, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
        if state == "down":
            return CommandResult(argv, 1, "", "Unable to contact slurm controller\n")
        return CommandResult(argv, 0, f"JobId={argv[-1]} JobName=train JobState={state}\n")

    def sacct(argv: tuple[str, ...]) -> CommandResult:
        return CommandResult(argv, 1, "", "Slurm accounting storage is disabled\n")

    return FakeRunner({"scontrol": show, "sacct": sacct})


def _commit(folder: Path, step: int) -> None:
    (folder / f"step-{step:012d}.pt").write_bytes(b"x")


def test_a_folder_of_a_running_job_is_refused_at_start_and_left_as_it_was(tmp_path: Path) -> None:
    owner.create(tmp_path, HOLDER)
    _commit(tmp_path, 4)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(FolderTaken, match="in use by job 41") as caught:
        claim.claim_start(tmp_path, ME, adopt=True, slurm=Slurm(_scontrol("PENDING")))
    assert caught.value.exit_code is ExitCode.FAILURE
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_an_ended_jobs_folder_is_taken_only_when_asked(tmp_path: Path) -> None:
    owner.create(tmp_path, HOLDER_HERE)
    _commit(tmp_path, 4)
    slurm = Slurm(_scontrol("forgotten"))  # ended longer ago than MinJobAge, no accounting
    with pytest.raises(
        FolderTaken, match=r"up to step 4 left by job 41 .*\(SLURM no longer knows it\)"
    ):
        claim.claim_start(tmp_path, ME, adopt=False, slurm=slurm)
    assert owner.read(tmp_path)[0] == HOLDER_HERE
    assert claim.claim_start(tmp_path, ME, adopt=True, slurm=slurm).verdict is Verdict.ADOPT
    assert owner.read(tmp_path)[0] == ME
    # The same job again (a requeue) owns it without asking SLURM.
    asked = FakeRunner({})
    assert claim.claim_start(tmp_path, ME, adopt=False, slurm=Slurm(asked)).verdict is Verdict.OWN
    assert asked.calls == []


def test_a_controller_that_does_not_answer_refuses_rather_than_guesses(tmp_path: Path) -> None:
    owner.create(tmp_path, HOLDER)
    with pytest.raises(FolderTaken, match="Unable to contact slurm controller") as caught:
        claim.claim_start(tmp_path, ME, adopt=False, slurm=Slurm(_scontrol("down")))
    assert caught.value.exit_code is ExitCode.SLURM


def test_a_completing_holder_is_waited_for(tmp_path: Path) -> None:
    runner = _scontrol("COMPLETING", "COMPLETING", "COMPLETED")
    held = claim.holder(HOLDER, Slurm(runner), poll_s=0.01)
    assert (held.liveness, held.detail) == (Liveness.ENDED, "COMPLETED")
    assert len(runner.calls) == 3
    stuck = claim.holder(
        HOLDER, Slurm(_scontrol("COMPLETING")), completing_wait_s=0.05, poll_s=0.01
    )
    assert stuck.liveness is Liveness.ACTIVE


def test_a_fresh_folder_gets_a_marker_at_start(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "ckpt"
    assert claim.claim_start(folder, ME, adopt=False, slurm=None).verdict is Verdict.FREE
    assert owner.read(folder)[0] == ME


def test_a_folder_holding_only_lightnings_checkpoints_is_not_free(tmp_path: Path) -> None:
    """hpclaunch.frameworks.lightning resumes from lightning/step-N.ckpt: a new job must
    not take another job's Lightning run for a fresh start."""
    (tmp_path / "lightning").mkdir()
    (tmp_path / "lightning" / "step-000000000040.ckpt").write_bytes(b"")
    (tmp_path / "lightning" / "step-000000000050.ckpt.tmp").write_bytes(b"")  # never committed
    with pytest.raises(FolderTaken, match="holds checkpoints up to step 40 that no hpclaunch"):
        claim.claim_start(tmp_path, ME, adopt=False, slurm=None)
    assert claim.claim_start(tmp_path, ME, adopt=True, slurm=None).verdict is Verdict.ADOPT


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: the pid names no process now
    return proc.pid


@pytest.mark.parametrize(
    ("make", "liveness"),
    [
        (lambda: claim.local_job(str(os.getpid())), Liveness.ACTIVE),
        (lambda: claim.local_job(str(_dead_pid())), Liveness.ENDED),
        # Another pid now in the place of the one that took the folder.
        (
            lambda: Owner(Kind.LOCAL, str(os.getpid()), host=socket.gethostname(), pid_start="1"),
            Liveness.ENDED,
        ),
        (lambda: Owner(Kind.LOCAL, str(os.getpid()), host="elsewhere"), Liveness.UNKNOWN),
    ],
)
def test_a_local_holder_is_judged_by_its_process(
    make: Callable[[], Owner], liveness: Liveness
) -> None:
    assert claim.holder(make(), None).liveness is liveness


def _sbatch_cli(project: Path, args: list[str], runner: FakeRunner) -> tuple[int, str]:
    obj = CliContext(slurm=Slurm(runner), cwd=project, env={"HOME": str(project / "home")})
    result = CliRunner().invoke(main, ["sbatch", *args], obj=obj)
    return result.exit_code, result.stderr


def test_sbatch_refuses_a_folder_in_use_before_submitting(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "ckpt").mkdir()
    owner.create(tmp_path / "ckpt", HOLDER)
    runner = _scontrol("RUNNING")
    runner.handlers = {**runner.handlers, "sbatch": lambda a: CommandResult(a, 0, "42\n")}
    code, err = _sbatch_cli(tmp_path, ["--checkpoint-dir", "ckpt", "train.py"], runner)
    assert code == 1
    assert err.startswith(f"Error: checkpoint folder {tmp_path / 'ckpt'} is in use by job 41")
    assert not [c for c in runner.calls if c[0] == "sbatch"]
    assert not (tmp_path / "hpclaunch-logs").exists()
    chained = ["--checkpoint-dir", "ckpt", "--sbatch-option", "dependency=afterany:41"]
    code, err = _sbatch_cli(tmp_path, [*chained, "train.py"], runner)
    assert code == 1 and "Say so with --adopt-checkpoints" in err
    code, err = _sbatch_cli(tmp_path, [*chained, "--adopt-checkpoints", "train.py"], runner)
    assert code == 0, err
    script = (tmp_path / "hpclaunch-logs" / "42" / "job.sbatch").read_text()
    assert "hpclaunch supervise --max-requeues 3 --grace-period 120 --adopt-checkpoints" in script


def test_sbatch_refuses_a_job_that_waits_for_another_without_saying_it_continues(
    tmp_path: Path,
) -> None:
    """The job waited for is still pending: it has not marked the folder yet."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    runner = _scontrol("PENDING")
    runner.handlers = {**runner.handlers, "sbatch": lambda a: CommandResult(a, 0, "42\n")}
    chained = ["--checkpoint-dir", "ckpt", "--sbatch-option", "dependency=afterany:41"]
    code, err = _sbatch_cli(tmp_path, [*chained, "train.py"], runner)
    assert code == 1
    assert err.startswith(f"Error: checkpoint folder {tmp_path / 'ckpt'}: this job waits for")
    assert "Say so with --adopt-checkpoints" in err
    assert not [c for c in runner.calls if c[0] == "sbatch"]
    code, err = _sbatch_cli(tmp_path, [*chained, "--adopt-checkpoints", "train.py"], runner)
    assert code == 0, err
