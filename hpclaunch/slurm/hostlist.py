"""SLURM hostlists: ``n[1-4]``, ``gpu-a[001-003,010],gpu-b7``, ``rack[1-2]-node[01-02]``.

Pure functions. ``expand`` keeps SLURM's order (which is the order of node
ranks); ``compress`` writes a list back in the short form.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence

_RANGE = re.compile(r"(\d+)(?:-(\d+))?\Z")


class HostlistError(ValueError):
    """A hostlist that does not follow SLURM's grammar; the message says where."""


def _split_top(text: str) -> list[str]:
    """Split at the commas that are not inside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' at position {i} in {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"']' without '[' at position {i} in {text!r}")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"'[' without ']' in {text!r}")
    items.append(text[start:])
    return items


def _numbers(spec: str, whole: str) -> list[str]:
    """``001-003,010`` → ``["001", "002", "003", "010"]`` (padding kept)."""
    out: list[str] = []
    for part in spec.split(","):
        match = _RANGE.match(part)
        if not match:
            raise HostlistError(f"{part!r} in {whole!r} is not a number or a range like 1-4")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise HostlistError(f"range {part!r} in {whole!r} runs backwards")
        width = len(low) if low.startswith("0") and len(low) > 1 else 0
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out


def _expand_item(item: str, whole: str) -> list[str]:
    if not item:
        raise HostlistError(f"empty host name in {whole!r}")
    pieces = re.split(r"\[([^\]]*)\]", item)
    # pieces alternates: literal, bracket, literal, bracket, ..., literal
    choices = [[piece] if i % 2 == 0 else _numbers(piece, whole) for i, piece in enumerate(pieces)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def expand(hostlist: str) -> list[str]:
    """All host names of ``hostlist``, in SLURM's order. Raises HostlistError."""
    text = hostlist.strip()
    if not text:
        raise HostlistError("the hostlist is empty")
    return [host for item in _split_top(text) for host in _expand_item(item, text)]


def compress(hosts: Iterable[str]) -> str:
    """The short form of ``hosts`` (consecutive numeric suffixes merged), keeping order."""
    groups: list[tuple[str, list[str]]] = []
    for host in hosts:
        match = re.fullmatch(r"(.*?)(\d+)", host)
        prefix, number = (match.group(1), match.group(2)) if match else (host, "")
        if groups and number and groups[-1][0] == prefix and groups[-1][1]:
            groups[-1][1].append(number)
        else:
            groups.append((prefix, [number] if number else []))
    return ",".join(_group_text(prefix, numbers) for prefix, numbers in groups)


def _group_text(prefix: str, numbers: Sequence[str]) -> str:
    if not numbers:
        return prefix
    if len(numbers) == 1:
        return prefix + numbers[0]
    spans: list[tuple[str, str]] = []
    for number in numbers:
        if spans and int(number) == int(spans[-1][1]) + 1 and len(number) == len(spans[-1][1]):
            spans[-1] = (spans[-1][0], number)
        else:
            spans.append((number, number))
    inner = ",".join(low if low == high else f"{low}-{high}" for low, high in spans)
    return f"{prefix}[{inner}]"
