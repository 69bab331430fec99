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

import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpclaunch.checkpoint import store
from hpclaunch.checkpoint.group import Ranks, attempt_tag
from hpclaunch.checkpoint.store import CheckpointError
from hpclaunch.contract import worker_env
from hpclaunch.jobdir.checkpoint_folder import METADATA

log = logging.getLogger(__name__)

ENV_VAR = worker_env.LOCAL_CHECKPOINT_DIR


def root(ranks: Ranks, env: Mapping[str, str] = os.environ) -> Path:
    """This rank's local folder. Raises CheckpointError when no agent provides one."""
    given = env.get(ENV_VAR, "").strip()
    if not given:
        raise CheckpointError(
            f"save(local_copy=True) needs {ENV_VAR}, the node-local folder hpclaunch's agent "
            "gives its workers; run the script through hpclaunch (sbatch or agent), or set "
            "it to a node-local folder you remove yourself"
        )
    return Path(given) / f"rank-{ranks.rank}-of-{ranks.world}"


def keep(state: dict[str, Any], folder: Path, step: int, keep_last: int) -> None:
    """This rank's copy of a committed checkpoint in ``folder`` (no collective). A copy
    that cannot be written is removed and said: the shared one is committed."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    final = store.path_for(folder, step, sharded=True)
    temp = store.temp_for(final, attempt_tag())
    try:
        store.remove(final)
        store.remove(temp)
        with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp_save(state, storage_writer=FileSystemWriter(temp, sync_files=False), no_dist=True)
        os.replace(temp, final)
        store.prune(folder, keep_last)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        store.remove(temp)
        store.remove(final)
        log.warning(
            "step %d is committed, but its node-local copy in %s failed (%s: %s); a restart "
            "reads the shared one",
            step,
            folder,
            type(exc).__name__,
            exc,
        )


def available(step: int, ranks: Ranks) -> bool:
    """Whether every rank has its local copy of ``step`` (a collective)."""
    try:
        mine = (store.path_for(root(ranks), step, sharded=True) / METADATA).is_file()
    except CheckpointError:
        mine = False
    return ranks.first_true(not mine) is None


def load(into: dict[str, Any], step: int, ranks: Ranks) -> None:
    """Read this rank's copy of ``step`` into ``into`` (no collective)."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    path = store.path_for(root(ranks), step, sharded=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp_load(into, storage_reader=FileSystemReader(path), no_dist=True)
