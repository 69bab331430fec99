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


def find_sharded(state: Any, prefix: str = "") -> tuple[str, str] | None:
    """(key path, type name) of the first sharded tensor (DTensor, ShardedTensor) in
    ``state``, nested dicts, lists and tuples included; None when there is none."""
    kinds = tuple(
        getattr(sys.modules[module], name)
        for module, name in _SHARDED_TYPES
        if module in sys.modules and hasattr(sys.modules[module], name)
    )
    return _find(state, prefix, kinds) if kinds else None


def _find(state: Any, prefix: str, kinds: tuple[type, ...]) -> tuple[str, str] | None:
    if isinstance(state, kinds):
        return (prefix, type(state).__name__)
    if isinstance(state, Mapping):
        items = [(f"{prefix}.{key}" if prefix else str(key), value) for key, value in state.items()]
    elif isinstance(state, (list, tuple)):
        items = [(f"{prefix}[{i}]", value) for i, value in enumerate(state)]
    else:
        return None
    for path, value in items:
        found = _find(value, path, kinds)
        if found is not None:
            return found
    return None
