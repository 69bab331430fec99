"""Who may read what hpclaunch makes (hpclaunch.jobdir.modes): the owner, the group
when the job asks, never everyone, whatever the umask."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from hpclaunch.checkpoint import store
from hpclaunch.errors import HpclaunchError
from hpclaunch.jobdir import modes
from hpclaunch.jobdir.atomic import write_atomic


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_group_shares_only_when_asked() -> None:
    assert (modes.folder_mode({}), modes.file_mode({})) == (0o700, 0o600)
    shared = {"HPCLAUNCH_SHARE_WITH_GROUP": "1"}
    assert (modes.folder_mode(shared), modes.file_mode(shared)) == (0o750, 0o640)
    assert modes.folder_mode({"HPCLAUNCH_SHARE_WITH_GROUP": "no"}) == 0o700
    with pytest.raises(HpclaunchError) as raised:
        modes.folder_mode({"HPCLAUNCH_SHARE_WITH_GROUP": "group"})
    assert str(raised.value) == (
        "HPCLAUNCH_SHARE_WITH_GROUP='group' (from the environment) is neither yes nor no; "
        "set HPCLAUNCH_SHARE_WITH_GROUP=1 to let the job's group read its folders, or unset it"
    )


def test_folders_made_are_private_under_umask_000_and_others_are_left(
    tmp_path: Path, open_umask: None
) -> None:
    users = tmp_path / "users"
    users.mkdir(0o755)
    made = modes.make_dirs(users / "a" / "b", 0o700)
    assert made == [users / "a", users / "a" / "b"]
    assert (mode(users), mode(users / "a"), mode(users / "a" / "b")) == (0o755, 0o700, 0o700)
    assert modes.make_dirs(users / "a" / "b", 0o750) == []  # there already: unchanged
    assert mode(users / "a" / "b") == 0o700
    assert modes.make_dirs(users / "g", 0o750) == [users / "g"] and mode(users / "g") == 0o750


def test_a_checkpoint_folder_and_file_are_private_under_umask_000(
    tmp_path: Path, open_umask: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HPCLAUNCH_SHARE_WITH_GROUP", raising=False)
    folder = store.directory(tmp_path / "ckpt")
    assert mode(folder) == 0o700
    target = folder / "step-000000000001.pt"
    assert write_atomic(target, lambda handle: handle.write(b"x"), mode=0o600)
    assert mode(target) == 0o600


@pytest.mark.parametrize(("share", "expected"), [("", 0o600), ("1", 0o640)])
def test_what_a_save_and_the_owner_marker_write_into_a_users_folder_keeps_others_out(
    tmp_path: Path,
    open_umask: None,
    monkeypatch: pytest.MonkeyPatch,
    share: str,
    expected: int,
) -> None:
    """Under umask 000, in a 0755 folder the user made (as --checkpoint-dir may be):
    the checkpoint, its manifest and the owner marker are never writable by others."""
    import torch

    from hpclaunch import checkpoint
    from hpclaunch.checkpoint import manifest, owner

    monkeypatch.setenv("HPCLAUNCH_SHARE_WITH_GROUP", share)
    users = tmp_path / "users"
    users.mkdir(0o755)
    saved = checkpoint.save({"w": torch.ones(2)}, 1, folder=users)
    assert (mode(users), mode(saved), mode(manifest.sidecar(saved))) == (0o755,) + (expected,) * 2
    job = owner.Owner(owner.Kind.SLURM, "41", "train", "someone", "login1")
    assert owner.create(users, job)
    [marker] = users.glob(".hpclaunch-owner.*.json")
    assert mode(marker) == expected

    def no_links(src: str | Path, dst: str | Path) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")  # CIFS, some FUSE mounts

    monkeypatch.setattr(os, "link", no_links)  # the exclusive create's path
    assert owner.take(users, 1, job)
    [marker] = users.glob(".hpclaunch-owner.*.json")
    assert marker.name == ".hpclaunch-owner.2.json" and mode(marker) == expected
