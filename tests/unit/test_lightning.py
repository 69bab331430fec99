"""hpclaunch.frameworks.lightning's pure parts: the Trainer's size from the launch's
variables, and which of the callback's files count as committed checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpclaunch.frameworks import lightning as hl


def test_trainer_args_are_the_launchs_nodes_and_workers_per_node() -> None:
    assert hl.trainer_args({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2"}) == {
        "num_nodes": 4,
        "devices": 2,
    }


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({}, "WORLD_SIZE=None, LOCAL_WORLD_SIZE=None. Run the script through hpclaunch sbatch"),
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "x"}, "LOCAL_WORLD_SIZE='x'"),
        ({"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"}, "WORLD_SIZE=6 is not a multiple of"),
    ],
)
def test_trainer_args_outside_a_launch_name_the_values_and_the_fix(
    env: dict[str, str], says: str
) -> None:
    with pytest.raises(RuntimeError, match=says.replace("(", r"\(").replace(".", r"\.")):
        hl.trainer_args(env)


def test_resume_path_is_the_newest_committed_checkpoint(tmp_path: Path) -> None:
    assert hl.resume_path(tmp_path) is None
    for name in (
        "step-000000000005.ckpt",
        "step-000000000040.ckpt",
        "step-000000000010.ckpt",
        "step-000000000050.ckpt.tmp",
        "last.ckpt",
        "step-7.ckpt",
    ):
        (tmp_path / name).write_bytes(b"")
    assert hl.resume_path(tmp_path) == str(tmp_path / "step-000000000040.ckpt")
    assert [step for step, _ in hl.committed(tmp_path)] == [5, 10, 40]


def test_resume_path_outside_a_job_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCLAUNCH_CHECKPOINT_DIR", raising=False)
    with pytest.raises(hl.store.CheckpointError, match="HPCLAUNCH_CHECKPOINT_DIR is not set"):
        hl.resume_path()


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"every_n_steps": 0}, "every_n_steps must be at least 1 or None, not 0"),
        ({"keep_last": 0}, "keep_last must be at least 1, not 0"),
    ],
)
def test_stop_checkpoint_refuses_bad_settings(kwargs: dict[str, int], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        hl.StopCheckpoint(**kwargs)


@pytest.mark.filterwarnings("ignore:The `srun` command is available")  # Lightning, on this host
def test_stop_checkpoint_refuses_a_trainer_smaller_than_the_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """devices=1 under a launch of 4 ranks: each rank would train and save on its own."""
    import lightning as L

    monkeypatch.setenv("WORLD_SIZE", "4")
    trainer = L.Trainer(devices=1, accelerator="cpu", logger=False, enable_progress_bar=False)
    with pytest.raises(RuntimeError, match=r"world of 1 rank\(s\) but the launch started 4"):
        hl.StopCheckpoint().setup(trainer, L.LightningModule(), "fit")


@pytest.mark.parametrize("sharded", [False, True])
def test_commit_gives_a_file_or_a_folder_its_name_in_one_rename(
    tmp_path: Path, sharded: bool
) -> None:
    partial, final = tmp_path / "step-000000000007.ckpt.tmp", tmp_path / "step-000000000007.ckpt"
    if sharded:  # a strategy that writes a folder of shards
        (partial / "shards").mkdir(parents=True)
        (partial / "shards" / "rank-0.distcp").write_bytes(b"0")
        (partial / "meta").write_bytes(b"m")
    else:
        partial.write_bytes(b"state")
    hl.commit(partial, final)
    assert not partial.exists() and hl.resume_path(tmp_path) == str(final)
    if sharded:
        assert (final / "shards" / "rank-0.distcp").read_bytes() == b"0"
    else:
        assert final.read_bytes() == b"state"


def test_the_callback_ends_only_the_pause_it_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validation is a pause; a user's own paused() around trainer.validate() goes on after
    the callback's on_validation_end, until the user's block ends."""
    from hpclaunch import progress

    path = str(tmp_path / "local-0.progress")
    monkeypatch.setattr(progress, "_board", progress._Board(path))
    monkeypatch.setattr(progress, "_opened", True)
    callback = hl.StopCheckpoint()

    def stretch() -> progress.Stretch | None:
        read = progress.read(path)
        assert read is not None
        return read.stretch

    callback.on_validation_start(None, None)  # type: ignore[arg-type]
    assert stretch() == progress.PAUSE
    callback.on_validation_end(None, None)  # type: ignore[arg-type]
    assert stretch() is None
    with progress.paused():
        callback.on_validation_start(None, None)  # type: ignore[arg-type]
        callback.on_validation_end(None, None)  # type: ignore[arg-type]
        assert stretch() == progress.PAUSE  # the user's pause holds
        callback.on_test_end(None, None)  # type: ignore[arg-type]  # began nothing: ends nothing
        assert stretch() == progress.PAUSE
    assert stretch() is None
