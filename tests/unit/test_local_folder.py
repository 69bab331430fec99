"""The node-local folder (hpclaunch.node.local_folder): named by a key no other job
shares, made afresh and owner-only, and leftovers cleared without touching a live
agent's folder or another user's files."""

from __future__ import annotations

import fcntl
import os
import stat
import threading
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
        removed = local_folder.clear_stale(tmp_path, uid, current.name, current.host)
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


def test_a_lock_file_replaced_between_open_and_lock_is_not_cleared(tmp_path: Path) -> None:
    """Clearer C holds leftover L's lock; clearer D opens the same lock file; C unlinks
    it and lets go; a new agent of L's name makes a new lock and folder. D's lock on the
    old file succeeds, but what it guarded is the new agent's now: D leaves it."""
    uid = os.getuid()
    mine = key(uid)
    lock = tmp_path / f"{mine.name}.lock"
    by_c = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(by_c, fcntl.LOCK_EX)
    by_d = os.open(lock, os.O_RDWR)  # another open file description, same file
    lock.unlink()
    os.close(by_c)
    agent = LocalFolder.open(mine, tmp_path)
    try:
        assert local_folder._claim(by_d, lock, uid) is None
        with pytest.raises(OSError):
            os.fstat(by_d)  # closed by _claim
        assert local_folder.clear_stale(tmp_path, uid, "another", mine.host) == []
        assert agent.path.is_dir() and lock.is_file()
    finally:
        agent.close()


def test_a_lock_file_nobody_holds_is_claimed(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    assert local_folder._claim(fd, lock, os.getuid()) == fd
    other = os.open(lock, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(other)
        os.close(fd)


def test_only_this_nodes_names_are_cleared(tmp_path: Path) -> None:
    """$TMPDIR may be shared by nodes (NFS), where a lock may be seen on its own node
    only: another node's folder is never taken for a leftover."""
    uid = os.getuid()
    own = tmp_path / f"{local_folder.prefix(uid)}gamma-77-5-0-n2"
    others = [
        tmp_path / f"{local_folder.prefix(uid)}gamma-77-5-0-n1",
        tmp_path / f"{local_folder.prefix(uid)}gamma-77-5-0-xn2",
        tmp_path / f"{local_folder.prefix(uid)}gamma-77-5-0-n2.other",
    ]
    for folder in (own, *others):
        folder.mkdir()
    assert local_folder.clear_stale(tmp_path, uid, "none", "n2") == [own]
    assert all(folder.is_dir() for folder in others)
    assert not any(Path(f"{folder}.lock").exists() for folder in others)


@pytest.mark.parametrize(
    ("name", "host", "expected"),
    [
        ("hpclaunch-u7-alpha-77-123-2-n2", "n2", True),
        ("hpclaunch-u7-alpha-77-123-2-n2.lock", "n2", True),
        ("hpclaunch-u7-alpha-77-123-2-n1", "n2", False),
        ("hpclaunch-u7-alpha-77-123-2-an2", "n2", False),
        ("hpclaunch-u7-alpha-77-123-x-n2", "n2", False),
        ("hpclaunch-u8-alpha-77-123-2-n2", "n2", False),
        ("hpclaunch-u7-a-77-1-0-node_1", "node/1", True),  # named as _safe names it
    ],
)
def test_a_name_is_of_this_user_and_node(name: str, host: str, expected: bool) -> None:
    assert local_folder.is_of(name, 7, host) is expected


def _stat(uid: int, mode: int = stat.S_IFREG | 0o600) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, uid, uid, 0, 0, 0, 0))


def test_a_lock_file_of_another_users_refused_is_named_not_ours() -> None:
    """As root here, EACCES cannot be had for real: the classification, given the
    refusal and the lock file's lstat."""
    refused = PermissionError(13, "Permission denied")
    lock = Path("/dev/shm/hpclaunch-u1000-a-1-2-0-n1.lock")
    theirs = local_folder._denied(lock, refused, _stat(4242), 1000)
    assert isinstance(theirs, HpclaunchError)
    assert str(theirs) == (
        f"the node-local path {lock} exists and is a file of uid 4242, not a folder of "
        "this user's (uid 1000); it was not made by this job, so it is neither read nor "
        "removed: ask the node's administrator to remove it"
    )
    assert local_folder._denied(lock, refused, _stat(1000), 1000) is refused
    assert local_folder._denied(lock, refused, None, 1000) is refused
