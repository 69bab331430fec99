"""PyTorch Lightning under hpclaunch: the Trainer's size from the job, and a callback
that saves a checkpoint at a step boundary when the job is being stopped::

    import lightning as L
    from hpclaunch.frameworks import lightning as hl

    trainer = L.Trainer(**hl.trainer_args(), max_epochs=10,
                        callbacks=[hl.StopCheckpoint(every_n_steps=100)])
    trainer.fit(model, datamodule=data, ckpt_path=hl.resume_path())

Why each part is needed:

- ``trainer_args()``: Lightning's own defaults are one device on one node; under a
  larger launch every rank then trains a model of its own (a single-device strategy, no
  error), or with ``strategy="ddp"`` Lightning refuses the launch. hpclaunch's agent sets
  ``PL_TRAINER_NUM_NODES`` and ``PL_TRAINER_DEVICES``, which Lightning takes as those
  defaults, so a plain ``Trainer()`` is right under hpclaunch; ``trainer_args()`` says the
  same explicitly (and under torchrun): ``LOCAL_WORLD_SIZE`` workers on each of
  ``WORLD_SIZE / LOCAL_WORLD_SIZE`` nodes. ``StopCheckpoint`` refuses a Trainer whose
  world is not the launch's.
- ``StopCheckpoint``: under hpclaunch Lightning picks torch's elastic environment, in
  which it does not catch the time-limit warning (SIGUSR1 kills the worker with
  nothing saved), and on SIGTERM it runs a collective inside its signal handler and
  stops without saving. The callback takes SIGTERM, SIGUSR1 and SIGUSR2 over (a flag,
  as ``hpclaunch.checkpoint.Preemption``), and at the end of each training batch that
  ends with an optimizer step every rank learns whether any rank got one; if so every
  rank saves Lightning's checkpoint and the run stops, the job is requeued, and
  ``resume_path()`` gives ``fit(ckpt_path=...)`` the newest checkpoint. With
  ``every_n_steps`` it also saves every that many optimizer steps, for the faults that
  give no warning (a lost node), and it saves when training ends.
- Checkpoints go to ``$HPCLAUNCH_CHECKPOINT_DIR/lightning/step-NNNNNNNNNNNN.ckpt``, each
  committed by one rename once written (a killed save leaves only a ``.tmp``), so
  ``resume_path()`` never returns a half-written one; ``hpclaunch status`` shows them.

Lightning resumes mid-epoch exactly only with a resumable dataloader (one with
``state_dict``/``load_state_dict``, such as torchdata's ``StatefulDataLoader``);
with a plain ``DataLoader`` it warns, and the rest of that epoch sees the epoch's first
batches again.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from hpclaunch import progress
from hpclaunch.checkpoint import store
from hpclaunch.checkpoint.preemption import STOP_SIGNALS, Preemption, device
from hpclaunch.jobdir.atomic import fsync_folder
from hpclaunch.jobdir.checkpoint_folder import LIGHTNING_FOLDER, LIGHTNING_NAME

SUBFOLDER = LIGHTNING_FOLDER  # of the job's checkpoint folder


def trainer_args(env: dict[str, str] | None = None) -> dict[str, int]:
    """``num_nodes`` and ``devices`` for ``Trainer(...)``, from the agent's launch."""
    env = dict(os.environ if env is None else env)
    try:
        world, local = int(env["WORLD_SIZE"]), int(env["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        raise RuntimeError(
            "trainer_args() reads WORLD_SIZE and LOCAL_WORLD_SIZE, which the hpclaunch agent "
            f"(or torchrun) sets for each worker; here they are WORLD_SIZE="
            f"{env.get('WORLD_SIZE')!r}, LOCAL_WORLD_SIZE={env.get('LOCAL_WORLD_SIZE')!r}. "
            "Run the script through hpclaunch sbatch, or pass num_nodes and devices yourself"
        ) from None
    if local < 1 or world % local:
        raise RuntimeError(
            f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local}: Lightning needs "
            "the same number of workers on every node (hpclaunch sbatch --nproc-per-node)"
        )
    return {"num_nodes": world // local, "devices": local}


def folder(dirpath: str | os.PathLike[str] | None = None) -> Path:
    """Where the callback's checkpoints go: ``dirpath``, else the job's checkpoint
    folder's ``lightning/`` (created if missing)."""
    if dirpath is not None:
        return store.directory(dirpath)
    return store.directory(store.directory() / SUBFOLDER)


def committed(dirpath: str | os.PathLike[str] | None = None) -> list[tuple[int, Path]]:
    """The committed checkpoints in the callback's folder: (global step, path), oldest first."""
    root = folder(dirpath)
    matches = map(LIGHTNING_NAME.match, os.listdir(root))
    return sorted((int(m.group(1)), root / m.group(0)) for m in matches if m)


def resume_path(dirpath: str | os.PathLike[str] | None = None) -> str | None:
    """The newest committed checkpoint for ``fit(ckpt_path=...)``; None on a fresh start."""
    found = committed(dirpath)
    return str(found[-1][1]) if found else None


class StopCheckpoint(pl.Callback):
    """Saves Lightning's checkpoint on every rank at an optimizer-step boundary when the
    job is being stopped (SIGTERM, SIGUSR1, SIGUSR2), then stops the run, which the job's
    supervisor requeues; every ``every_n_steps`` optimizer steps, when given; and when
    training ends. Keeps the newest ``keep_last`` of its checkpoints.

    It saves in ``on_train_batch_end``, so it must come after every other callback that
    has that hook (Lightning's own checkpoint callbacks excepted): one after it would not
    have seen the saved batch, which the resumed run counts as done. ``setup`` refuses
    such an order. The LightningModule's own ``on_train_batch_end`` runs after the save:
    what it changes in that batch is not in the checkpoint."""

    def __init__(
        self,
        every_n_steps: int | None = None,
        dirpath: str | os.PathLike[str] | None = None,
        keep_last: int = 2,
    ) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be at least 1 or None, not {every_n_steps}")
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, not {keep_last}")
        self.every_n_steps, self.keep_last = every_n_steps, keep_last
        self._dirpath = dirpath
        self._flag = Preemption()
        self._saved_step = -1
        self._step_before = -1  # global_step when the current batch started
        self._next_metrics = 0.0  # when the logged metrics are next read (monotonic)
        self._pausing = False  # this callback began the pause it is in (see on_*_start)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if trainer.world_size != launched:  # each rank would train and save on its own
            raise RuntimeError(
                f"Lightning runs a world of {trainer.world_size} rank(s) but the launch started "
                f"{launched} (WORLD_SIZE): every rank would train a model of its own. Leave "
                "devices and num_nodes unset (the agent sets PL_TRAINER_DEVICES and "
                "PL_TRAINER_NUM_NODES) or pass Trainer(**trainer_args())"
            )
        callbacks = list(getattr(trainer, "callbacks", []))
        later = callbacks[callbacks.index(self) + 1 :]
        late = [type(c).__name__ for c in later if _ends_batches(c)]
        if late:
            raise RuntimeError(
                f"StopCheckpoint comes before {', '.join(late)} in Trainer(callbacks=...), and "
                "saves at the end of a batch: a checkpoint would not hold what those do at that "
                "batch, which the resumed run counts as done. Put StopCheckpoint after them"
            )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After Lightning installed its own handlers (Trainer._run does that before the
        # loops start): its SIGTERM handler runs a collective inside the handler, which
        # blocks when ranks are elsewhere; Lightning restores what it found at the end.
        self._flag = Preemption.install(STOP_SIGNALS)
        self._saved_step = trainer.global_step  # loaded from a checkpoint, or 0
        _same_step_everywhere(trainer)
        _report_progress(trainer)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_before = trainer.global_step

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        if step == self._step_before:  # within gradient accumulation: not a boundary
            return
        now = time.monotonic()
        if now >= self._next_metrics:
            self._next_metrics = now + progress.METRICS_EVERY_S
            _report_metrics(trainer)
        stopping = self._flag.should_stop()  # a collective: every rank, every step
        due = self.every_n_steps is not None and step % self.every_n_steps == 0
        if (stopping or due) and step != self._saved_step:
            self.save(trainer)
        if stopping:
            sig = self._flag.signal
            rank_zero_info(
                f"hpclaunch: stopping at step {step} on "
                f"{sig.name if sig is not None else 'another rank signal'}; saved"
            )
            raise SIGTERMException  # ends fit() on every rank; the job is requeued

    # Validation and testing take no optimizer steps: hpclaunch's hang watch judges them
    # as a pause (hpclaunch.progress.paused, bounded by --pause-timeout), not by the time
    # since the last step. Only a pause this callback began is ended by it: a user's own
    # paused() around trainer.validate() holds until the user's block ends.
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._unpause()

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause()

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._unpause()

    def _pause(self) -> None:
        if not self._pausing:
            self._pausing = progress.set_paused(True)

    def _unpause(self) -> None:
        if self._pausing:
            self._pausing = False
            progress.set_paused(False)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A stop that came after the last batch would otherwise requeue a finished run
        # that resumes from an older checkpoint; from this one, fit() returns at once.
        if trainer.global_step != self._saved_step:
            self.save(trainer)

    def save(self, trainer: pl.Trainer) -> Path:
        """Save Lightning's checkpoint of this step on every rank (a collective), and
        commit it by one rename; returns its path."""
        root = folder(self._dirpath)
        final = root / f"step-{trainer.global_step:012d}.ckpt"
        partial = root / f"{final.name}.tmp"
        trainer.save_checkpoint(partial, weights_only=False)  # rank 0 writes; then a barrier
        if trainer.is_global_zero:
            commit(partial, final)
            for _step, old in committed(root)[: -self.keep_last]:
                store.remove(old)
        trainer.strategy.barrier("hpclaunch.StopCheckpoint.save")
        self._saved_step = trainer.global_step
        return final


def commit(partial: Path, final: Path) -> None:
    """Make ``partial`` (a file, or the folder a sharded strategy writes) durable, then
    give it its final name in one rename."""
    files = [partial] if partial.is_file() else [p for p in partial.rglob("*") if p.is_file()]
    for path in files:
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    for sub in {p.parent for p in files} - {partial.parent}:
        fsync_folder(sub)
    os.replace(partial, final)
    fsync_folder(final.parent)


def _ends_batches(callback: pl.Callback) -> bool:
    """Whether ``callback`` does something at the end of a training batch (Lightning's
    checkpoint callbacks excepted: they only save)."""
    if isinstance(callback, Checkpoint):
        return False
    return type(callback).on_train_batch_end is not pl.Callback.on_train_batch_end


def _report_progress(trainer: pl.Trainer) -> None:
    """Tell hpclaunch's progress the step training resumed from (its count is the
    job's then, as ``hpclaunch status`` and the lost work need) and the run's length."""
    # Lightning's global step counts every optimizer's steps; hpclaunch's count is the
    # first optimizer's: they are the same count with one optimizer only (a GAN's two
    # would double it), so only then does the global step tell where training resumed.
    if trainer.global_step > 0 and len(trainer.optimizers) == 1:
        progress.resumed_from(held=trainer.global_step, by=progress.BY_LIGHTNING)
    try:
        total = trainer.max_steps if trainer.max_steps > 0 else trainer.estimated_stepping_batches
    except (AttributeError, RuntimeError, TypeError, ValueError):  # not known: none shown
        return
    if isinstance(total, int) or (isinstance(total, float) and math.isfinite(total)):
        progress.report(total=int(total))


def _report_metrics(trainer: pl.Trainer) -> None:
    """The scalars the module logged (``self.log``), for ``hpclaunch status``: each
    is read off the device, so only every METRICS_EVERY_S."""
    metrics = {}
    for key, value in trainer.callback_metrics.items():
        if getattr(value, "numel", lambda: 1)() == 1:
            metrics[key] = float(value)
    if metrics:
        progress.report(metrics=metrics)


def _same_step_everywhere(trainer: pl.Trainer) -> None:
    """Every rank resumed from the same step (each lists the folder on its own; a stale
    listing on one node would make its saves and stops fall at other steps)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or trainer.world_size < 2:
        return
    import torch

    step = trainer.global_step
    spread = torch.tensor([step, -step], dtype=torch.float64, device=device())
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    highest, lowest = int(spread[0].item()), -int(spread[1].item())
    if highest != lowest:
        raise RuntimeError(
            f"the ranks resumed from different checkpoints (steps {lowest} to {highest}): "
            f"the folder {folder()} looked different from different nodes; resume_path() "
            "needs a folder every node sees the same"
        )
