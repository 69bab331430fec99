"""The checkpoint folder's marker under races and on odd filesystems, and the holders
SLURM cannot tell about (another cluster, another user's hidden jobs)."""

from __future__ import annotations

import errno
import getpass
import os
from pathlib import Path

import pytest

from hpclaunch.checkpoint import claim, owner
from hpclaunch.checkpoint.claim import FolderTaken
from hpclaunch.checkpoint.owner import Kind, MarkerError, Owner
from hpclaunch.checkpoint.sharing import Verdict
from hpclaunch.slurm.commands import CommandResult, FakeRunner, Slurm

USER = getpass.getuser()
ENDED = Owner(Kind.SLURM, "41", "train", USER, "login1")  # SLURM no longer knows it
TAKER = Owner(Kind.SLURM, "42", "train", USER, "login1")
OTHER = Owner(Kind.SLURM, "43", "train", USER, "login1")  # running


def _slurm(running: set[str]) -> Slurm:
    """scontrol that knows the jobs in ``running`` (RUNNING) and no other."""

    def show(argv: tuple[str, ...]) -> CommandResult:
        if argv[-1] in running:
            return CommandResult(argv, 0, f"JobId={argv[-1]} JobName=train JobState=RUNNING\n")
        return CommandResult(argv, 1, "", "slurm_load_jobs error: Invalid job id specified\n")

    def sacct(argv: tuple[str, ...]) -> CommandResult:
        return CommandResult(argv, 1, "", "Slurm accounting storage is disabled\n")

    return Slurm(FakeRunner({"scontrol": show, "sacct": sacct}))


def test_a_taker_that_lost_never_leaves_the_folder_without_its_holders_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TAKER reads the ended job's marker; OTHER takes the folder before TAKER writes.
    At every link TAKER makes, a third job starting then must read OTHER's marker."""
    owner.create(tmp_path, ENDED)
    real_read, real_link = owner.read, os.link
    seen_by_third: list[Owner | None] = []

    def read_then_other_takes(folder: Path) -> tuple[Owner | None, object]:
        found = real_read(folder)
        if not seen_by_third and found[0] == ENDED:
            monkeypatch.setattr(owner, "read", real_read)
            claim.claim_start(tmp_path, OTHER, adopt=False, slurm=_slurm(set()))
            monkeypatch.setattr(os, "link", third_looks)
        return found  # TAKER goes on with what it read

    def third_looks(src: str | Path, dst: str | Path) -> None:
        seen_by_third.append(real_read(tmp_path)[0])
        real_link(src, dst)

    monkeypatch.setattr(owner, "read", read_then_other_takes)
    with pytest.raises(FolderTaken, match="in use by job 43"):
        claim.claim_start(tmp_path, TAKER, adopt=False, slurm=_slurm({"43"}))
    assert seen_by_third and all(found == OTHER for found in seen_by_third)
    assert real_read(tmp_path)[0] == OTHER


def test_a_folder_without_hard_links_is_taken_with_an_exclusive_create(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: str | Path, dst: str | Path) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")  # CIFS, some FUSE mounts

    monkeypatch.setattr(os, "link", no_links)
    assert claim.claim_start(tmp_path, TAKER, adopt=False, slurm=None).verdict is Verdict.FREE
    assert owner.read(tmp_path)[0] == TAKER
    with pytest.raises(FolderTaken, match="in use by job 42"):
        claim.claim_start(tmp_path, OTHER, adopt=False, slurm=_slurm({"42"}))
    assert owner.read(tmp_path)[0] == TAKER
    assert [p.name for p in tmp_path.iterdir()] == [".hpclaunch-owner.1.json"]


def test_the_same_job_id_on_another_cluster_is_another_job(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "41", "SLURM_JOB_NAME": "train", "SLURM_JOB_USER": USER}
    alpha = claim.slurm_job({**env, "SLURM_CLUSTER_NAME": "alpha"})
    beta = claim.slurm_job({**env, "SLURM_CLUSTER_NAME": "beta"})
    assert Owner.from_json(alpha.to_json()) == alpha
    assert alpha.same_job(claim.slurm_job({**env, "SLURM_CLUSTER_NAME": "alpha"}))
    assert alpha.same_job(claim.slurm_job(env))  # a marker that does not name its cluster
    owner.create(tmp_path, alpha)
    with pytest.raises(
        FolderTaken,
        match=r"job 41 \(train, user .*, cluster alpha\).*\(it ran on cluster alpha, "
        r".* this cluster's \(beta\)",
    ):
        claim.claim_start(tmp_path, beta, adopt=False, slurm=_slurm({"41"}))
    assert owner.read(tmp_path)[0] == alpha


def test_another_users_job_slurm_does_not_show_is_not_taken_for_ended(tmp_path: Path) -> None:
    theirs = Owner(Kind.SLURM, "41", "train", f"not-{USER}", "login1")
    owner.create(tmp_path, theirs)
    with pytest.raises(FolderTaken, match=rf"it is user not-{USER}'s, .* hpclaunch cannot see"):
        claim.claim_start(tmp_path, TAKER, adopt=True, slurm=_slurm(set()))
    assert owner.read(tmp_path)[0] == theirs
    # This user's own job that SLURM no longer knows has ended.
    owner.take(tmp_path, owner.read(tmp_path)[1], ENDED)
    assert claim.claim_start(tmp_path, TAKER, adopt=False, slurm=_slurm(set())).allowed


def test_a_refused_run_records_why_and_not_the_other_jobs_folder(tmp_path: Path) -> None:
    from hpclaunch.contract.worker_env import CHECKPOINT_DIR
    from hpclaunch.jobdir.history import History
    from hpclaunch.ops.status import gather
    from hpclaunch.recovery.supervisor import Supervisor

    ckpt, job_dir = tmp_path / "ckpt", tmp_path / "logs" / "42"
    ckpt.mkdir()
    owner.create(ckpt, OTHER)
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_USER": USER, CHECKPOINT_DIR: str(ckpt)}
    supervisor = Supervisor(env, _slurm({"43"}), job_dir, 3, 1)
    assert supervisor.claim_checkpoints(adopt=False) == 1
    history = History.load(job_dir, 42)
    assert history.checkpoint_dir is None
    refusal = f"checkpoint folder {ckpt} is in use by job 43"
    assert (history.runs[-1].verdict or "").startswith(refusal)
    status = gather(42, None, {"HOME": str(tmp_path)}, job_dir)
    assert status.checkpoint_dir != str(ckpt)
    assert (status.verdict or "").startswith(refusal)
    # A job that takes its folder records it.
    mine = Supervisor({**env, "SLURM_JOB_ID": "44"}, _slurm(set()), tmp_path / "44", 3, 1)
    (ckpt / ".hpclaunch-owner.1.json").unlink()
    assert mine.claim_checkpoints(adopt=False) is None
    assert mine.history is not None and mine.history.checkpoint_dir == str(ckpt)


def test_a_local_map_array_with_one_checkpoint_folder_is_refused_before_any_job_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hpclaunch
    from hpclaunch.executor import api

    started: list[str] = []

    def start(self: object, command: str) -> None:
        started.append(command)
        raise RuntimeError("a job was started")

    monkeypatch.setattr(api._LocalBackend, "_submit_command", start)
    monkeypatch.chdir(tmp_path)
    executor = hpclaunch.Executor(tmp_path / "ex", cluster="local", checkpoint_dir="ckpt")
    with pytest.raises(hpclaunch.HpclaunchError, match=r"ckpt' .* shared by the 2 jobs of this"):
        executor.map_array(abs, [1, 2])
    assert started == []
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS])
def test_a_full_or_read_only_folder_is_left_to_the_storage_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int
) -> None:
    def refused(folder: Path, seen: object, me: Owner) -> bool:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(owner, "take", refused)
    said = claim.take(tmp_path, TAKER, adopt=False, slurm=None)
    assert said is not None and said.startswith(
        f"cannot mark the checkpoint folder {tmp_path} as this job's: {os.strerror(error)}; "
        "going on without the mark"
    ), said
    assert owner.read(tmp_path)[0] is None  # nothing written

    def other(folder: Path, seen: object, me: Owner) -> bool:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(owner, "take", other)
    with pytest.raises(MarkerError, match="cannot take the checkpoint folder"):
        claim.take(tmp_path, TAKER, adopt=False, slurm=None)
