"""What a state holds that only the sharded form can save exactly."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

# Where torch defines its sharded tensor types: none can exist before its module
# is imported, so nothing is imported here.
_SHARDED_TYPES = (
    ("torch.distributed.tensor", "DTensor"),
    ("torch.distributed._shard.sharded_tensor", "ShardedTensor"),
)
_SHARD = "of which each rank holds only its own shard: one writer would save rank 0's part alone"
_STATEFUL = (
    "an object with state_dict() and load_state_dict() (a model, an optimizer), whose "
    "state torch's distributed checkpoint takes from every rank"
)


def find_sharded(state: Any, prefix: str = "") -> tuple[str, str, str] | None:
    """(key path, type name, why) of the first value in ``state`` that one writer
    cannot save for all ranks: a sharded tensor (DTensor, ShardedTensor), or a
    ``Stateful`` object (a model, an optimizer, which may hold them). Nested dicts,
    lists and tuples are searched; None when there is none."""
    kinds = tuple(
        getattr(sys.modules[module], name)
        for module, name in _SHARDED_TYPES
        if module in sys.modules and hasattr(sys.modules[module], name)
    )
    return _find(state, prefix, kinds)


def _find(state: Any, prefix: str, kinds: tuple[type, ...]) -> tuple[str, str, str] | None:
    if kinds and isinstance(state, kinds):
        return (prefix, type(state).__name__, _SHARD)
    if isinstance(state, Mapping):
        items = [(f"{prefix}.{key}" if prefix else str(key), value) for key, value in state.items()]
    elif isinstance(state, (list, tuple)):
        items = [(f"{prefix}[{i}]", value) for i, value in enumerate(state)]
    elif callable(getattr(state, "state_dict", None)) and callable(
        getattr(state, "load_state_dict", None)
    ):
        return (prefix, type(state).__name__, _STATEFUL)
    else:
        return None
    for path, value in items:
        found = _find(value, path, kinds)
        if found is not None:
            return found
    return None


def find_numbered_optimizer(state: Any, prefix: str = "") -> str | None:
    """The key path of the first optimizer state in ``state`` in the form
    ``optimizer.state_dict()`` gives it: ``state`` and ``param_groups``, its parameters
    numbered (ints) rather than named; or of a torch optimizer itself, whose
    ``state_dict()`` torch's distributed checkpoint would take. Saved sharded, such a
    state cannot be loaded back the way a sharded checkpoint loads (a fresh optimizer's
    ``state_dict()`` has no entries to load it into, and ``get_state_dict``'s are
    named); None when there is none. Nested dicts, lists and tuples are searched."""
    optimizer = getattr(sys.modules.get("torch.optim.optimizer"), "Optimizer", None)
    if optimizer is not None and isinstance(state, optimizer):
        return prefix or "(the state itself)"  # DCP would take its state_dict(): numbered
    if isinstance(state, Mapping):
        if _numbered(state):
            return prefix or "(the state itself)"
        items = [(f"{prefix}.{key}" if prefix else str(key), value) for key, value in state.items()]
    elif isinstance(state, (list, tuple)):
        items = [(f"{prefix}[{i}]", value) for i, value in enumerate(state)]
    else:
        return None
    for path, value in items:
        found = find_numbered_optimizer(value, path)
        if found is not None:
            return found
    return None


def _numbered(state: Mapping[Any, Any]) -> bool:
    groups = state.get("param_groups")
    if not isinstance(state.get("state"), Mapping) or not isinstance(groups, (list, tuple)):
        return False
    params = [p for g in groups if isinstance(g, Mapping) for p in g.get("params", ())]
    return bool(params) and all(isinstance(p, int) for p in params)
