"""hpclaunch.checkpoint's file handling and preemption flag, without torch."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from hpclaunch import checkpoint
from hpclaunch.checkpoint import Checkpoint, CheckpointError, group, store
from hpclaunch.checkpoint.manifest import sidecar
from hpclaunch.checkpoint.state import find_numbered_optimizer, find_sharded
from hpclaunch.jobdir import saves
from hpclaunch.jobdir.checkpoint_folder import scan
from hpclaunch.record import checkpoints


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


def _sharded(folder: Path, step: int, *, metadata: bool = True) -> Path:
    """A committed sharded checkpoint's folder, as torch's distributed checkpoint leaves it."""
    path = checkpoint.path_for(folder, step, sharded=True)
    path.mkdir()
    (path / "__0_0.distcp").write_bytes(b"shard")
    if metadata:
        (path / ".metadata").write_bytes(b"meta")
    return path


def test_both_forms_count_and_only_committed_ones(tmp_path: Path) -> None:
    checkpoint.path_for(tmp_path, 3).write_text("one file")
    sharded = _sharded(tmp_path, 7)
    _sharded(tmp_path, 9, metadata=False)  # DCP never finished: not committed
    temp = tmp_path / ".step-000000000011.tmp-77-0-1"  # a save in flight, or killed
    temp.mkdir()
    (tmp_path / "step-000000000005.damaged").mkdir()  # set aside: never again
    found = checkpoint.complete(tmp_path)
    assert [(c.step, c.sharded) for c in found] == [(3, False), (7, True)]
    assert checkpoint.latest(tmp_path) == Checkpoint(7, sharded)
    # A step saved in both forms counts once, as its sharded form.
    checkpoint.path_for(tmp_path, 7).write_text("one file")
    assert [c.path for c in checkpoint.complete(tmp_path)][-1] == sharded


def test_prune_removes_old_sharded_folders_and_dead_writers_folders(tmp_path: Path) -> None:
    for step in range(4):
        _sharded(tmp_path, step)
    dead = tmp_path / ".step-000000000004.tmp-77-0-0"
    dead.mkdir()
    (dead / "__1_0.distcp").write_bytes(b"half")
    removed = checkpoint.prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-000000000002",
        "step-000000000003",
    ]
    assert dead in removed and len(removed) == 3


def test_a_damaged_checkpoint_is_set_aside_out_of_the_committed_set(tmp_path: Path) -> None:
    one = checkpoint.path_for(tmp_path, 4)
    one.write_text("truncated")
    shards = _sharded(tmp_path, 8)
    for found in reversed(checkpoint.complete(tmp_path)):
        store.set_aside(found)
    assert checkpoint.complete(tmp_path) == []
    assert (tmp_path / "step-000000000004.pt.damaged").read_text() == "truncated"
    assert (tmp_path / "step-000000000008.damaged" / ".metadata").exists()
    assert not one.exists() and not shards.exists()
    assert checkpoint.prune(tmp_path, keep_last=1) == []  # kept for inspection


def test_a_step_set_aside_twice_keeps_both_under_their_own_names(tmp_path: Path) -> None:
    """Nothing set aside is deleted: a second step 8 (saved again after the first was
    set aside) goes to step-N.damaged.2, a one-file one with its manifest; status's
    listing names each."""
    for content in ("first", "second", "third"):
        shards = _sharded(tmp_path, 8)
        (shards / "__0_0.distcp").write_text(content)
        one = checkpoint.path_for(tmp_path, 4)
        one.write_text(content)
        sidecar(one).write_text(content)
        assert store.set_aside(Checkpoint(8, shards)).name.startswith("step-000000000008.damaged")
        store.set_aside(Checkpoint(4, one))
    assert (tmp_path / "step-000000000008.damaged" / "__0_0.distcp").read_text() == "first"
    assert (tmp_path / "step-000000000008.damaged.2" / "__0_0.distcp").read_text() == "second"
    assert (tmp_path / "step-000000000008.damaged.3" / "__0_0.distcp").read_text() == "third"
    assert (tmp_path / "step-000000000004.pt.damaged.3").read_text() == "third"
    assert (tmp_path / "step-000000000004.pt.damaged.3.manifest.json").read_text() == "third"
    assert scan(tmp_path).damaged == (
        "step-000000000004.pt.damaged",
        "step-000000000004.pt.damaged.2",
        "step-000000000004.pt.damaged.3",
        "step-000000000008.damaged",
        "step-000000000008.damaged.2",
        "step-000000000008.damaged.3",
    )


def test_the_temporary_name_holds_the_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCLAUNCH_JOB_ID", "77")
    monkeypatch.setenv("HPCLAUNCH_REQUEUE_COUNT", "1")
    monkeypatch.setenv("HPCLAUNCH_ATTEMPT", "2")
    final = Path("/c/step-000000000042")
    assert store.temp_for(final, group.attempt_tag()) == Path("/c/.step-000000000042.tmp-77-1-2")
    monkeypatch.delenv("HPCLAUNCH_JOB_ID")
    monkeypatch.delenv("HPCLAUNCH_ATTEMPT")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run/x")  # torchrun's, made safe for a name
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    assert group.attempt_tag() == "run_x-1-3"


def test_a_stateful_object_is_found_where_one_writer_would_miss_its_shards() -> None:
    class Model:  # as an nn.Module or an optimizer: DCP asks each rank for its state
        def state_dict(self) -> dict[str, float]:
            return {}

        def load_state_dict(self, state: dict[str, float]) -> None:
            pass

    state = {"model": {"w": [1.0, 2.0]}, "step": 3, "nested": [{"a": (1, 2)}]}
    assert find_sharded(state) is None
    found = find_sharded({**state, "nested": [{"a": 1}, {"opt": Model()}]})
    assert found is not None and found[:2] == ("nested[1].opt", "Model")
    assert "state_dict() and load_state_dict()" in found[2]


def test_an_optimizer_state_numbered_as_optimizer_state_dict_gives_it_is_found() -> None:
    numbered = {"state": {0: {"step": 1.0}}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}
    named = {"state": {"w": {"step": 1.0}}, "param_groups": [{"lr": 0.1, "params": ["w"]}]}
    assert find_numbered_optimizer({"model": {"w": 1.0}, "optimizer": named}) is None
    assert find_numbered_optimizer({"model": {}, "opts": [named, numbered]}) == "opts[1]"
    fresh = {"state": {}, "param_groups": [{"params": [0]}]}  # no step yet: as numbered
    assert find_numbered_optimizer({"optimizer": fresh}) == "optimizer"
    assert find_numbered_optimizer(numbered) == "(the state itself)"
    # A dict that merely has the two keys is not an optimizer's state.
    assert find_numbered_optimizer({"state": {}, "param_groups": []}) is None


def test_save_records_say_the_last_and_slowest_save(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint-saves.jsonl"
    assert saves.read(path) == []
    for step, total in ((10, 4.0), (20, 9.5), (30, 2.0)):
        saves.append(
            path,
            saves.SaveRecord(
                step=step,
                sharded=True,
                asynchronous=True,
                blocked_s=0.25,
                total_s=total,
                bytes=3 * 1024**3 // 2,
                ranks=4,
                ended=1.0,
            ),
        )
    with open(path, "a") as handle:
        handle.write('{"step": 40, "torn')  # a torn last line is skipped
    records = saves.read(path)
    last = records[-1]
    assert last.step == 30 and len(records) == 3
    assert last.describe() == (
        "step 30: 1.5 GiB sharded by 4 ranks, asynchronous, blocked training 0.25 s, "
        "committed after 2.00 s"
    )
    slowest = saves.slowest(records)
    assert slowest is not None and slowest.step == 20
    assert checkpoints.lead_warning(slowest, signal_lead_s=120) is None
    # The workers get three quarters of the lead: 7 s of 10, less than the 9.5 s it took.
    warning = checkpoints.lead_warning(slowest, signal_lead_s=10)
    assert warning == (
        "the checkpoint save of step 20 took 9.5 s, but after the time-limit warning "
        "(--signal-lead 10 s) the workers get 7 s: a save on the warning would not finish; "
        "raise --signal-lead to at least 33 s, or make the save smaller"
    )


def test_remove_takes_a_file_a_folder_or_nothing(tmp_path: Path) -> None:
    single, shards = tmp_path / "step-000000000001.pt", _sharded(tmp_path, 2)
    single.write_text("x")
    for path in (single, shards, tmp_path / "never-there"):
        store.remove(path)
        assert not path.exists()


def test_waiting_for_an_asynchronous_save_is_in_the_saves_stretch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """checkpoint.wait() after the last step, and the interpreter's join of a save in
    flight at exit, are the save's stretch on the worker's board (bounded by
    --checkpoint-timeout), not time without a step; with nothing in flight, no stretch."""
    from concurrent.futures import Future

    from hpclaunch import progress
    from hpclaunch.checkpoint import saving

    path = str(tmp_path / "local-0.progress")
    monkeypatch.setattr(progress, "_board", progress._Board(path))
    monkeypatch.setattr(progress, "_opened", True)

    class Reading(Future):  # type: ignore[type-arg]
        """A save whose result is the board as its waiter sees it."""

        def result(self, timeout: float | None = None) -> object:
            return progress.read(path)

    class Save:
        step = 29
        asynchronous = True

    monkeypatch.setattr(saving._saver, "pending", (Save(), Reading()))
    during = checkpoint.wait()
    assert isinstance(during, progress.Progress) and during.stretch == progress.SAVE
    after = progress.read(path)
    assert after is not None and after.stretch is None and after.since >= during.since
    assert checkpoint.wait() is None
    assert progress.read(path) == after  # nothing in flight: the board is left alone
    running: Future[object] = Future()
    monkeypatch.setattr(saving._saver, "pending", (Save(), running))
    saving._exiting()
    exiting = progress.read(path)
    assert exiting is not None and exiting.stretch == progress.SAVE
