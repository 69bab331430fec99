"""The node-local tier: with ``save(..., local_copy=True)`` every rank also keeps
its own shards of each committed sharded checkpoint in its node's memory
(``HPCLAUNCH_LOCAL_CHECKPOINT_DIR``, which hpclaunch's agent sets and removes when
it exits). After an in-place restart on the same nodes (a worker crash, a hang),
``load_latest`` reads them from there when every rank has its copy of the chosen
step, and from the shared folder otherwise (a requeue, other nodes, another world
size). A copy is written only after its shared checkpoint is committed, so it is
never newer than what the shared folder holds.

Layout: ``LOCAL/rank-R-of-W/step-N/`` (torch's distributed checkpoint of this
rank's part alone), written under a temporary name and renamed.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from hpclaunch.checkpoint import group, store
from hpclaunch.checkpoint.store import CheckpointError
from hpclaunch.node import worker_env

ENV_VAR = worker_env.LOCAL_CHECKPOINT_DIR


def root() -> Path:
    """This rank's local folder. Raises CheckpointError when no agent provides one."""
    given = os.environ.get(ENV_VAR, "").strip()
    if not given:
        raise CheckpointError(
            f"save(local_copy=True) needs {ENV_VAR}, the node-local folder hpclaunch's agent "
            "gives its workers; run the script through hpclaunch (sbatch or agent), or set "
            "it to a node-local folder you remove yourself"
        )
    return Path(given) / f"rank-{group.rank()}-of-{group.world()}"


def path_of(step: int) -> Path:
    return store.path_for(root(), step, sharded=True)


def keep(state: dict[str, Any], step: int, keep_last: int) -> None:
    """This rank's copy of a committed checkpoint (no collective). A copy that cannot
    be written is removed and skipped: the shared one is committed."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    final = path_of(step)
    temp = store.temp_for(final, group.attempt_tag())
    try:
        store.remove(temp)
        with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp_save(state, storage_writer=FileSystemWriter(temp, sync_files=False), no_dist=True)
        store.remove(final)
        os.replace(temp, final)
        store.prune(final.parent, keep_last)
    except OSError as exc:
        store.remove(temp)
        store.remove(final)
        warnings.warn(f"no node-local copy of step {step} in {final.parent}: {exc}", stacklevel=2)


def available(step: int) -> bool:
    """Whether every rank has its local copy of ``step`` (a collective)."""
    try:
        mine = (path_of(step) / store.METADATA).is_file()
    except CheckpointError:
        mine = False
    return not group.any_true(not mine)


def load(into: dict[str, Any], step: int) -> None:
    """Read this rank's copy of ``step`` into ``into`` (no collective)."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp_load(into, storage_reader=FileSystemReader(path_of(step)), no_dist=True)
