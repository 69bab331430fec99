"""The node-local folder (hpclaunch.node.local_folder): named by a key no other job
shares, made afresh and owner-only, and leftovers cleared without touching a live
agent's folder or another user's files."""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpclaunch.errors import HpclaunchError
from hpclaunch.node import local_folder
from hpclaunch.node.local_folder import LocalFolder, LocalKey
from hpclaunch.slurm.commands import Slurm
from hpclaunch.slurm.env import NodeContext
from hpclaunch.slurm.submit import stamped

ENV = {
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_NODEID": "1",
    "SLURM_RESTART_COUNT": "2",
    "SLURM_CLUSTER_NAME": "alpha",
    "HPCLAUNCH_SUBMITTED": "1764323100123456789",
}
CTX = NodeContext.from_env(ENV)


def key(uid: int = 1000, **env: str) -> LocalKey:
    return local_folder.key(CTX, {**ENV, **env}, uid, "p42.99")


def test_the_name_holds_owner_cluster_job_submission_run_and_node() -> None:
    assert key().name == "hpclaunch-u1000-alpha-77-1764323100123456789-2-n2"
    # Another cluster's job 77, or another submission of a job 77, is another folder.
    others = {key(SLURM_CLUSTER_NAME="beta").name, key(HPCLAUNCH_SUBMITTED="17").name}
    assert key().name not in others and len(others) == 2
    assert local_folder.key(CTX, ENV, 1001, "p42.99").name != key().name
    assert key().name.startswith(local_folder.prefix(1000))


def test_without_a_submission_stamp_the_agent_uses_its_own() -> None:
    bare = {k: v for k, v in ENV.items() if k not in ("HPCLAUNCH_SUBMITTED", "SLURM_CLUSTER_NAME")}
    assert local_folder.key(CTX, bare, 1000, "p42.99").name == (
        "hpclaunch-u1000-nocluster-77-p42.99-2-n2"
    )
    own = local_folder.own_stamp()
    assert own == f"p{os.getpid()}.{own.split('.')[1]}" and own == local_folder.own_stamp()


def test_a_name_is_one_path_component_whatever_slurm_says() -> None:
    odd = key(SLURM_CLUSTER_NAME="../x y", HPCLAUNCH_SUBMITTED="1/2")
    assert odd.name == "hpclaunch-u1000-.._x_y-77-1_2-2-n2"
    assert "/" not in odd.name


def test_sbatch_carries_the_submission_stamp() -> None:
    slurm = stamped(Slurm(env={"PATH": "/bin"}), 1234)
    assert slurm.env == {"PATH": "/bin", "HPCLAUNCH_SUBMITTED": "1234"}


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_a_folder_is_made_afresh_owner_only_and_removed(tmp_path: Path, open_umask: None) -> None:
    mine = key(os.getuid())
    left = tmp_path / mine.name
    left.mkdir()
    (left / "progress").write_text("an earlier agent's of this job and run")
    folder = LocalFolder.open(mine, tmp_path)
    assert folder.path == left and list(left.iterdir()) == []  # removed, not read
    assert stat.S_IMODE(left.stat().st_mode) == 0o700
    lock = tmp_path / f"{mine.name}.lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    folder.close()
    assert not left.exists() and not lock.exists()


def test_a_name_held_by_a_live_agent_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_folder, "CLAIM_WAIT_S", 0.2)  # a live agent's is held for good
    live = LocalFolder.open(key(os.getuid()), tmp_path)
    try:
        with pytest.raises(HpclaunchError, match="held by another live agent"):
            LocalFolder.open(key(os.getuid()), tmp_path)
        assert live.path.is_dir()
    finally:
        live.close()


def test_another_users_folder_under_the_name_is_neither_read_nor_removed(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("making another user's folder needs root")
    mine = key(os.getuid())
    theirs = tmp_path / mine.name
    theirs.mkdir()
    (theirs / "progress").write_text("theirs")
    os.chown(theirs, 4242, 4242)
    with pytest.raises(
        HpclaunchError, match="is a folder of uid 4242, not a folder of this user's"
    ):
        LocalFolder.open(mine, tmp_path)
    assert (theirs / "progress").read_text() == "theirs"


def test_leftovers_no_live_agent_holds_are_cleared(tmp_path: Path) -> None:
    uid = os.getuid()
    current = local_folder.key(CTX, ENV, uid, "p1.1")
    mine = LocalFolder.open(current, tmp_path)
    other_job = local_folder.key(CTX, {**ENV, "SLURM_CLUSTER_NAME": "beta"}, uid, "p1.1")
    live = LocalFolder.open(other_job, tmp_path)
    dead = tmp_path / f"{local_folder.prefix(uid)}gamma-77-5-0-n2"
    (dead / "progress").mkdir(parents=True)
    unlocked = tmp_path / f"{local_folder.prefix(uid)}delta-77-5-0-n2"
    unlocked.mkdir()
    Path(f"{unlocked}.lock").touch()  # its agent died holding it: the lock went with it
    lone_lock = Path(f"{tmp_path / local_folder.prefix(uid)}eps-1-5-0-n2.lock")
    lone_lock.touch()
    old_naming = tmp_path / "hpclaunch-77-2-n2"  # before the key: left alone
    old_naming.mkdir()
    if uid == 0:
        foreign = tmp_path / f"{local_folder.prefix(uid)}zeta-77-5-0-n2"
        foreign.mkdir()
        os.chown(foreign, 4242, 4242)
    try:
        removed = local_folder.clear_stale(tmp_path, uid, current.name)
        assert sorted(removed) == sorted([dead, unlocked])
        assert not lone_lock.exists() and not Path(f"{unlocked}.lock").exists()
        assert mine.path.is_dir() and live.path.is_dir() and old_naming.is_dir()
        if uid == 0:
            assert foreign.is_dir()
    finally:
        live.close()
        mine.close()


def test_a_lock_a_clearing_agent_holds_for_a_moment_is_waited_for(tmp_path: Path) -> None:
    mine = key(os.getuid())
    lock = tmp_path / f"{mine.name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)

    def cleared() -> None:  # what clear_stale does with a lock it took: unlink, release
        lock.unlink()
        os.close(fd)

    clearing = threading.Timer(0.3, cleared)
    clearing.start()
    folder = LocalFolder.open(mine, tmp_path)
    clearing.join()
    try:
        assert folder.path.is_dir() and lock.is_file()  # a lock file of its own, made anew
    finally:
        folder.close()
