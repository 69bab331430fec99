"""Records of the job folder from their JSON, with every field's type checked.

Each file of the job folder is a frozen dataclass written as JSON (``asdict``). A reader
must not take ``Record(**json.loads(text))`` at its word: that accepts a string where a
number belongs, and the mistake shows up far away. ``load`` builds the dataclass field by
field from its annotations, and raises ValueError naming the field that does not fit.
Fields a newer hpclaunch added are ignored, fields an older one lacked take their
defaults, so a folder written by another version still reads. Pure.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, cast

T = TypeVar("T")


def load(cls: type[T], data: object) -> T:
    """``cls`` (a dataclass) from ``data`` (what ``json.loads`` gave). Raises ValueError
    naming the first field whose value does not fit its type."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{cls.__name__}: not a JSON object but {type(data).__name__}")
    hints = _hints(cast(Any, cls))
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.name not in data:
            if (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise ValueError(f"{cls.__name__}: no {field.name}")
            continue
        try:
            values[field.name] = _convert(hints[field.name], data[field.name])
        except ValueError as exc:
            raise ValueError(f"{cls.__name__}.{field.name}: {exc}") from None
    return cls(**values)


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(kind: Any, value: object) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(kind)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError("; ".join(errors))
    if origin is tuple:
        item = typing.get_args(kind)[0]
        if not isinstance(value, list | tuple):
            raise ValueError(f"not a list: {value!r}")
        return tuple(_convert(item, v) for v in value)
    if origin is list:
        item = typing.get_args(kind)[0]
        if not isinstance(value, list):
            raise ValueError(f"not a list: {value!r}")
        return [_convert(item, v) for v in value]
    if origin is dict:
        key, item = typing.get_args(kind)
        if not isinstance(value, Mapping):
            raise ValueError(f"not an object: {value!r}")
        return {_convert(key, k): _convert(item, v) for k, v in value.items()}
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        return load(kind, value)
    return _plain(kind, value)


def _plain(kind: Any, value: object) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, str):
            return value
    elif kind is Any or kind is object:
        return value
    else:
        raise ValueError(f"cannot read a {kind!r}")
    article = "an" if kind.__name__[0] in "aeiou" else "a"
    raise ValueError(f"{value!r} is not {article} {kind.__name__}")
