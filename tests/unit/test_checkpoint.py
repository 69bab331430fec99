"""hpclaunch.checkpoint's file handling and preemption flag, without torch."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from hpclaunch import checkpoint
from hpclaunch.checkpoint import Checkpoint, CheckpointError


def test_directory_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HPCLAUNCH_CHECKPOINT_DIR", raising=False)
    with pytest.raises(CheckpointError, match="HPCLAUNCH_CHECKPOINT_DIR is not set"):
        checkpoint.directory()
    monkeypatch.setenv("HPCLAUNCH_CHECKPOINT_DIR", str(tmp_path / "a" / "b"))
    assert checkpoint.directory() == tmp_path / "a" / "b" and (tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="cannot create the checkpoint folder"):
        checkpoint.directory(tmp_path / "file" / "x")


def test_latest_sees_only_complete_checkpoints(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path) is None
    for step in (5, 10, 2):
        checkpoint.path_for(tmp_path, step).write_text(str(step))
    (tmp_path / ".step-000000000015.pt.tmp-123").write_text("half")  # a killed writer's
    (tmp_path / "step-15.pt").write_text("not ours")
    assert checkpoint.latest(tmp_path) == Checkpoint(10, tmp_path / "step-000000000010.pt")
    assert [c.step for c in checkpoint.complete(tmp_path)] == [2, 5, 10]
    with pytest.raises(ValueError, match="from 0 to 999999999999, not -1"):
        checkpoint.path_for(tmp_path, -1)


def test_write_atomic_never_leaves_a_partial_file_and_never_overwrites(tmp_path: Path) -> None:
    target = checkpoint.path_for(tmp_path, 3)

    def half_then_fail(handle: object) -> None:
        handle.write(b"half")  # type: ignore[attr-defined]
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        checkpoint.write_atomic(target, half_then_fail)
    assert list(tmp_path.iterdir()) == []
    assert checkpoint.write_atomic(target, lambda h: h.write(b"one")) is True
    assert checkpoint.write_atomic(target, lambda h: h.write(b"two")) is False
    assert target.read_bytes() == b"one"


def test_prune_keeps_the_newest_and_removes_dead_writers_files(tmp_path: Path) -> None:
    for step in range(5):
        checkpoint.path_for(tmp_path, step).write_text("")
    stale = tmp_path / ".step-000000000005.pt.tmp-999"
    stale.write_text("half")
    removed = checkpoint.prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-000000000003.pt",
        "step-000000000004.pt",
    ]
    assert stale in removed and len(removed) == 4
    with pytest.raises(ValueError, match="at least 1"):
        checkpoint.prune(tmp_path, keep_last=0)


def test_preemption_flag_is_set_by_the_signal_only() -> None:
    before = {s: signal.getsignal(s) for s in checkpoint.STOP_SIGNALS}
    try:
        flag = checkpoint.Preemption.install()
        assert not flag.requested and not flag.should_stop()  # not distributed: local flag
        os.kill(os.getpid(), signal.SIGUSR1)
        assert flag.requested and flag.signal is signal.SIGUSR1 and flag.should_stop()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
