"""``load_latest``: the newest committed checkpoint every rank can load, in either
form. A committed checkpoint that fails to load (truncated, bit rot, wrong shapes)
is named on stderr, renamed ``step-N.damaged`` out of the committed set, and the
previous one is tried: a job never loops on a bad checkpoint, and never quietly
starts from step 0 while committed checkpoints exist.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpclaunch.checkpoint import group, local, saving, store
from hpclaunch.checkpoint.store import Checkpoint, CheckpointError

_SHARDED_HELP = (
    "build it as torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer) "
    "gives it (which also initialises the optimizer's state), the same way the saved one "
    "was built"
)


@dataclass(frozen=True)
class Loaded:
    """What ``load_latest`` returns: the step it was saved at, the state (``into``,
    filled in place, for a sharded checkpoint), and where it was read from."""

    step: int
    state: Any
    path: Path


class _Unusable(CheckpointError):
    """The caller's mistake, the same on every rank: raised, never set aside."""


def load_latest(
    folder: str | os.PathLike[str] | None = None,
    *,
    into: Mapping[str, Any] | None = None,
    map_location: Any = "cpu",
    weights_only: bool = True,
) -> Loaded | None:
    """Load the newest committed checkpoint, or return None when there is none. Every
    rank loads the step global rank 0 chose (a collective).

    A sharded checkpoint loads into ``into``, in place, resharded to this job's ranks
    (so ``into`` is required for it: the state as the training built it, with the
    same keys as the saved one). A one-file checkpoint is returned as saved
    (``into`` is not needed). Raises CheckpointError when the folder is unusable,
    ``into`` does not fit, or committed checkpoints exist and none of them loads."""
    saving.wait()
    root = store.directory(folder)
    damaged: list[str] = []
    while True:
        found = store.complete(root) if group.rank() == 0 else []
        step = group.from_rank0(found[-1].step if found else -1)
        if step < 0:
            if damaged:
                raise CheckpointError(
                    f"no checkpoint in {root} can be loaded: {'; '.join(damaged)}; each was "
                    "renamed step-N.damaged (rename one back to try it again)"
                )
            return None
        sharded = bool(group.from_rank0(int(found[-1].sharded) if found else 0))
        chosen = Checkpoint(step, store.path_for(root, step, sharded=sharded))
        error: BaseException | None = None
        try:
            state = _load(chosen, into, map_location, weights_only)
        except (_Unusable, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # damaged (DCP's CheckpointException is a BaseException)
            error = exc
        if not group.any_true(error is not None):
            return Loaded(step, state, chosen.path)
        damaged.append(_set_aside(chosen, error))


def _load(chosen: Checkpoint, into: Mapping[str, Any] | None, map_location: Any,
          weights_only: bool) -> Any:  # fmt: skip
    import torch

    if not chosen.sharded:
        return torch.load(chosen.path, map_location=map_location, weights_only=weights_only)
    if into is None:
        raise _Unusable(
            f"{chosen.path} is a sharded checkpoint: pass the state to load it into, "
            f"load_latest(into=state); {_SHARDED_HELP}"
        )
    # DCP replaces the top level's non-tensor values in the dict it is given: give it
    # the caller's own, so that ``into`` holds what was loaded, as documented.
    return _load_sharded(chosen, into if isinstance(into, dict) else dict(into))


def _load_sharded(chosen: Checkpoint, into: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    path = chosen.path
    reader = FileSystemReader(path)
    saved = set(reader.read_metadata().state_dict_metadata)
    wanted = set(flatten_state_dict(into)[0])
    left_out = sorted(saved - wanted)
    if left_out:
        raise _Unusable(
            f"{path} holds {len(left_out)} entries the state given to load_latest(into=...) "
            f"lacks, such as {', '.join(left_out[:3])}: they would not be restored; "
            f"{_SHARDED_HELP}"
        )
    if local.available(chosen.step) and _from_local(into, chosen.step):
        return into
    dcp_load(into, storage_reader=reader, process_group=group.get(), no_dist=not group.on())
    return into


def _from_local(into: dict[str, Any], step: int) -> bool:
    """Load every rank's node-local copy of ``step``; False (shared copy next) when
    any rank cannot."""
    error: BaseException | None = None
    try:
        local.load(into, step)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        error = exc
        _say(f"node-local copy of step {step} unusable on rank {group.rank()}: {exc!r}")
    if group.any_true(error is not None):
        return False
    if group.rank() == 0:
        _say(f"step {step} read from the node-local copies")
    return True


def _set_aside(chosen: Checkpoint, error: BaseException | None) -> str:
    """Every rank: say why this rank could not load it; rank 0 renames it."""
    why = f"{type(error).__name__}: {_first_line(error)}" if error else "failed on another rank"
    _say(f"{chosen.path} cannot be loaded on rank {group.rank()} ({why})")
    if group.rank() == 0:
        try:
            target = store.set_aside(chosen)
        except OSError as exc:
            raise CheckpointError(
                f"{chosen.path} cannot be loaded ({why}), and renaming it aside failed: {exc}; "
                "move it out of the checkpoint folder by hand"
            ) from exc
        _say(f"set aside as {target}; trying the previous checkpoint")
    group.any_true(False)  # every rank waits for the rename before listing again
    return f"step {chosen.step} ({why})"


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _say(message: str) -> None:
    sys.stderr.write(f"hpclaunch checkpoint: {message}\n")
    sys.stderr.flush()
