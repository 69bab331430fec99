"""Checkpoints that survive being killed, and the preemption flag a training loop polls.

A training script needs four calls (``Preemption.install``, ``load_latest``,
``should_stop``, ``save``), and ``wait`` when it saves asynchronously. Sharded state
(FSDP2, tensor parallel: any DTensor) is written by every rank and resharded on load::

    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from hpclaunch import checkpoint

    stop = checkpoint.Preemption.install()        # SIGTERM/SIGUSR1/SIGUSR2 set a flag
    dist.init_process_group("gloo")                # or nccl
    ...                                            # build the model, fully_shard it
    def sharded_state():                           # this rank's shards, named
        model_state, optim_state = get_state_dict(model, optimizer)
        return {"model": model_state, "optimizer": optim_state}

    # The function is called only when there is a checkpoint to load: get_state_dict
    # steps a fresh optimizer (at lr 0) to give it state, which a fresh start must not.
    resumed = checkpoint.load_latest(into=sharded_state)   # None on a fresh start
    start = 0
    if resumed is not None:
        set_state_dict(model, optimizer, model_state_dict=resumed.state["model"],
                       optim_state_dict=resumed.state["optimizer"])
        start = resumed.step + 1
    for step in range(start, steps):
        train_one_step(step)
        stopping = stop.should_stop()              # every rank gets the same answer
        if stopping or (step + 1) % every == 0:
            checkpoint.save(sharded_state(), step, asynchronous=not stopping)
        if stopping:
            break
    checkpoint.wait()                              # before destroy_process_group

Save the optimizer as ``get_state_dict`` gives it: ``optimizer.state_dict()`` of a
sharded model numbers its entries and could not be loaded back, so ``save`` refuses it.
Replicated state (DDP: plain tensors, the same on every rank) goes through the same
calls; ``load_latest()`` then returns the saved dict (``into`` is not needed) and
only global rank 0 writes it, as one file.

Every rank calls ``load_latest``, ``should_stop``, ``save`` and ``wait`` at the same
steps (they are collectives; ``if rank == 0: save(...)`` deadlocks). A checkpoint
is committed by one rename once every rank's part is durable, so ``latest`` never
returns a half-written one, and a committed checkpoint is never overwritten.
Checkpoints go into ``HPCLAUNCH_CHECKPOINT_DIR`` (the rendered job script sets
it). torch is imported only by the functions that need it.
"""

from __future__ import annotations

from hpclaunch.checkpoint.loading import (
    CheckpointMismatch,
    CheckpointUnreadable,
    Loaded,
    load_latest,
)
from hpclaunch.checkpoint.preemption import STOP_SIGNALS, Preemption, stop_received
from hpclaunch.checkpoint.saving import in_flight, save, wait
from hpclaunch.checkpoint.store import (
    DEFAULT_KEEP_LAST,
    ENV_VAR,
    MAX_STEP,
    Checkpoint,
    CheckpointError,
    complete,
    directory,
    latest,
    path_for,
    prune,
)
from hpclaunch.jobdir.atomic import write_atomic
from hpclaunch.jobdir.checkpoint_folder import DAMAGED_SUFFIX

__all__ = [
    "DAMAGED_SUFFIX",
    "DEFAULT_KEEP_LAST",
    "ENV_VAR",
    "MAX_STEP",
    "STOP_SIGNALS",
    "Checkpoint",
    "CheckpointError",
    "CheckpointMismatch",
    "CheckpointUnreadable",
    "Loaded",
    "Preemption",
    "complete",
    "directory",
    "in_flight",
    "latest",
    "load_latest",
    "path_for",
    "prune",
    "save",
    "stop_received",
    "wait",
    "write_atomic",
]
