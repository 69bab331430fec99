"""Where a worker's attempt resumed, as its progress file says (hpclaunch.progress), with
real torch in this process: hpclaunch's checkpoints, the step count in the optimizer
state a script restored, the script's own step numbers; and the count each save holds."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim import optimizer as torch_optimizer

from hpclaunch import checkpoint, progress
from hpclaunch.jobdir import progress_notes, saves
from hpclaunch.jobdir.layout import JobFolder

TABLES = (
    torch_optimizer._global_optimizer_pre_hooks,
    torch_optimizer._global_optimizer_post_hooks,
)


@pytest.fixture
def start_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], str]]:
    """Each call starts a worker's progress as ``install`` does in a fresh worker (a new
    progress file, torch's global optimizer hooks registered), and returns its path."""
    kept = [dict(table) for table in TABLES]

    def restore() -> None:
        for table, before in zip(TABLES, kept, strict=True):
            table.clear()
            table.update(before)

    def start() -> str:
        restore()
        path = str(tmp_path / f"worker-{len(list(tmp_path.glob('worker-*')))}.progress")
        monkeypatch.setattr(progress, "_board", progress._Board(path))
        monkeypatch.setattr(progress, "_opened", True)
        monkeypatch.setattr(progress, "_counted", [])
        monkeypatch.setattr(progress, "_look", [])
        progress._hook(torch_optimizer)
        return path

    yield start
    restore()


def trained(
    make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer], steps: int
) -> dict[str, Any]:
    """The state_dict of an optimizer after ``steps`` steps, saved and loaded as a script
    keeps its own checkpoint (torch.save), before any worker's progress is started."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = make(list(model.parameters()))
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.ones(4)).sum().backward()
        optimizer.step()
    return optimizer.state_dict()


def run(
    make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
    steps: int,
    restored: dict[str, Any] | None = None,
) -> torch.optim.Optimizer:
    """``steps`` training steps of a fresh model, its optimizer restored from ``restored``."""
    model = torch.nn.Linear(4, 2)
    optimizer = make(list(model.parameters()))
    if restored is not None:
        optimizer.load_state_dict(restored)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.ones(4)).sum().backward()
        optimizer.step()
    return optimizer


def adamw(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)


def adam(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=1e-3)


def sgd(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9)


def test_the_file_holds_the_resume_point_and_an_old_layout_is_never_misread(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "local-0.progress")
    board = progress._Board(path)
    board.beat(None)
    fresh = progress.read(path)
    assert fresh is not None and (fresh.resumed, fresh.resumed_by, fresh.job_steps) == (
        None,
        None,
        False,
    )
    assert board.resume(40, progress.BY_OPTIMIZER)  # after one counted step: 39 before it
    assert not board.resume(7, progress.BY_CHECKPOINT)  # the first evidence wins
    board.beat(None)
    seen = progress.read(path)
    assert seen is not None and (seen.count, seen.step, seen.resumed) == (2, 41, 39)
    assert seen.resumed_by == "optimizer" and seen.job_steps
    # A file of the layout before (its magic, its size) is no progress, never misread.
    old = struct.Struct("<4sIqqdddqq").pack(b"HPCp", 0, 3, 3, 1.0, 2.0, 0.5, 1, -1)
    (tmp_path / "old.progress").write_bytes(old + bytes(12))
    (tmp_path / "short.progress").write_bytes(old)
    assert progress.read(str(tmp_path / "old.progress")) is None
    assert progress.read(str(tmp_path / "short.progress")) is None
    # The worker's names are the job folder's (the worker imports only progress).
    assert progress.RESUMED_BY == progress_notes.RESUMED_BY


@pytest.mark.parametrize("make", [adam, adamw], ids=["Adam", "AdamW"])
def test_a_restored_adam_says_the_steps_it_had_done(
    start_worker: Callable[[], str],
    make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
) -> None:
    restored = trained(make, 5)
    path = start_worker()
    assert progress._before_first_step in TABLES[0].values()
    run(make, 1, restored)
    assert progress._before_first_step not in TABLES[0].values()  # gone after the first step
    assert progress._look == []
    run(make, 2, restored)
    seen = progress.read(path)
    assert seen is not None and (seen.resumed, seen.resumed_by) == (5, "optimizer")
    assert (seen.count, seen.step, seen.job_steps) == (3, 8, True)


@pytest.mark.parametrize(
    ("make", "restored_steps"),
    [(adam, None), (sgd, 5), (adamw, 0)],
    ids=["fresh Adam", "restored SGD with momentum", "AdamW restored before any step"],
)
def test_an_optimizer_without_a_step_count_is_no_evidence(
    start_worker: Callable[[], str],
    make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
    restored_steps: int | None,
) -> None:
    restored = None if restored_steps is None else trained(make, restored_steps)
    path = start_worker()
    run(make, 3, restored)
    seen = progress.read(path)
    assert seen is not None and (seen.count, seen.step) == (3, 3)
    assert (seen.resumed, seen.resumed_by, seen.job_steps) == (None, None, False)  # never 0
    assert progress._before_first_step not in TABLES[0].values()


def test_the_optimizer_look_takes_plain_numbers_and_only_counts_that_agree() -> None:
    class Held:
        def __init__(self, *steps: object) -> None:
            self.state = {index: {"step": step, "exp_avg": 0} for index, step in enumerate(steps)}

    assert progress.optimizer_steps(Held(12, torch.tensor(12.0))) == 12
    assert progress.optimizer_steps(Held(12, 11)) is None  # disagree: no evidence
    assert progress.optimizer_steps(Held(2.5)) is None
    assert progress.optimizer_steps(Held()) is None


def test_a_checkpoint_seen_first_wins_over_the_optimizer(start_worker: Callable[[], str]) -> None:
    restored = trained(adamw, 5)
    path = start_worker()
    progress.resumed_from(39, by=progress.BY_CHECKPOINT)  # as load_latest says it
    run(adamw, 2, restored)
    seen = progress.read(path)
    assert seen is not None and (seen.resumed, seen.resumed_by, seen.step) == (40, "checkpoint", 42)


def test_a_script_that_beats_its_own_steps_drops_the_optimizers_count(
    start_worker: Callable[[], str],
) -> None:
    restored = trained(adamw, 5)
    path = start_worker()
    run(adamw, 1, restored)  # the look: 5 optimizer steps
    progress.beat()  # the script counts its own steps (per micro-batch, for all we know)
    seen = progress.read(path)
    assert seen is not None and (seen.resumed, seen.resumed_by, seen.job_steps) == (
        None,
        None,
        False,
    )


def test_the_first_numbered_beat_says_where_the_script_resumed(
    start_worker: Callable[[], str],
) -> None:
    path = start_worker()
    for step in range(100, 105):
        progress.beat(step=step)
    seen = progress.read(path)
    assert seen is not None and (seen.count, seen.step) == (5, 105)
    assert (seen.resumed, seen.resumed_by) == (100, "script")  # indices 0..99 were done before


def test_resumed_from_takes_a_held_count_and_refuses_what_is_not_one(
    start_worker: Callable[[], str],
) -> None:
    path = start_worker()
    with pytest.raises(ValueError, match="pass step= or held="):
        progress.resumed_from()
    with pytest.raises(ValueError, match="holds -3 steps"):
        progress.resumed_from(held=-3)
    with pytest.raises(ValueError, match="by='epoch' is none of"):
        progress.resumed_from(3, by="epoch")
    progress.resumed_from(3, held=480)  # the checkpoint labelled 3 (an epoch) holds 480
    seen = progress.read(path)
    assert seen is not None and (seen.resumed, seen.resumed_by) == (480, "script")


def test_the_steps_done_are_the_jobs_on_its_first_attempt_or_once_the_resume_is_seen(
    tmp_path: Path,
) -> None:
    board = progress._Board(str(tmp_path / "local-0.progress"))
    first = {"HPCLAUNCH_REQUEUE_COUNT": "0", "HPCLAUNCH_ATTEMPT": "0"}
    later = {"HPCLAUNCH_REQUEUE_COUNT": "1", "HPCLAUNCH_ATTEMPT": "0"}
    assert board.steps_done(first) is None  # nothing counted: no count at all
    board.beat(None)
    board.beat(None)
    assert board.steps_done(first) == 2 and board.steps_done({}) == 2
    assert board.steps_done(later) is None
    assert board.steps_done({"HPCLAUNCH_ATTEMPT": "2"}) is None  # an in-place restart
    board.resume(12, progress.BY_CHECKPOINT)
    assert board.steps_done(later) == 12


@pytest.fixture
def job_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobFolder:
    monkeypatch.setenv("HPCLAUNCH_JOB_DIR", str(tmp_path / "job"))
    monkeypatch.setenv("HPCLAUNCH_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("HPCLAUNCH_REQUEUE_COUNT", "0")
    monkeypatch.setenv("HPCLAUNCH_ATTEMPT", "0")
    (tmp_path / "job").mkdir()
    return JobFolder(tmp_path / "job")


def epochs(model: torch.nn.Module, optimizer: torch.optim.Optimizer, first: int, last: int) -> None:
    """Epochs ``first`` to ``last`` of 4 steps each, saved per epoch: save(step=epoch)."""
    for epoch in range(first, last + 1):
        for _ in range(4):
            optimizer.zero_grad()
            model(torch.ones(4)).sum().backward()
            optimizer.step()
        checkpoint.save({"model": model.state_dict()}, epoch)


def test_per_epoch_saves_hold_the_steps_counted_and_a_load_resumes_from_them(
    start_worker: Callable[[], str], job_env: JobFolder, monkeypatch: pytest.MonkeyPatch
) -> None:
    start_worker()
    model = torch.nn.Linear(4, 2)
    epochs(model, torch.optim.SGD(model.parameters(), lr=1e-3), 0, 2)
    assert [(r.step, r.steps_done) for r in saves.read(job_env.saves)] == [
        (0, 4),
        (1, 8),
        (2, 12),
    ]
    # The requeued run: its count is not the job's until the load says where it is.
    monkeypatch.setenv("HPCLAUNCH_REQUEUE_COUNT", "1")
    path = start_worker()
    loaded = checkpoint.load_latest()
    assert loaded is not None and loaded.step == 2
    seen = progress.read(path)
    assert seen is not None and (seen.resumed, seen.resumed_by) == (12, "checkpoint")
    model.load_state_dict(loaded.state["model"])
    epochs(model, torch.optim.SGD(model.parameters(), lr=1e-3), 3, 3)
    record = saves.read(job_env.saves)[-1]
    assert (record.step, record.steps_done) == (3, 16)


def test_a_checkpoint_without_a_count_of_this_job_tells_nothing(
    start_worker: Callable[[], str], job_env: JobFolder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCLAUNCH_REQUEUE_COUNT", "1")
    path = start_worker()
    model = torch.nn.Linear(4, 2)
    checkpoint.save({"model": model.state_dict()}, 7)  # a count not the job's: none recorded
    assert [(r.step, r.steps_done) for r in saves.read(job_env.saves)] == [(7, None)]
    path = start_worker()
    assert checkpoint.load_latest() is not None
    seen = progress.read(path)
    # Its label (7) may be an epoch: no count is taken from it.
    assert seen is not None and (seen.resumed, seen.resumed_by) == (None, None)


def test_no_checkpoint_to_load_is_a_start_from_step_0(
    start_worker: Callable[[], str], job_env: JobFolder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCLAUNCH_REQUEUE_COUNT", "1")  # requeued before any save
    path = start_worker()
    assert checkpoint.load_latest() is None
    seen = progress.read(path)
    assert seen is not None and (seen.resumed, seen.resumed_by) == (0, "checkpoint")
