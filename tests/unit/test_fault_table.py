"""docs/fault-tolerance.md's table of faults names, for every row, the integration
tests that prove it: each must exist, so that a row cannot outlive its proof."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "fault-tolerance.md"
TESTS = ROOT / "tests" / "integration"
NAMED = re.compile(r"`(test_\w+\.py)::(test_\w+)`")


def _rows() -> list[str]:
    text = PAGE.read_text()
    table = text[text.index("| event |") :].split("\n\n", 1)[0]
    return table.splitlines()[2:]


def _tests_in(file: Path) -> set[str]:
    tree = ast.parse(file.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_every_fault_names_tests_that_exist() -> None:
    rows = _rows()
    assert len(rows) >= 10, "the table of faults is missing or cut short"
    problems = []
    for row in rows:
        event = row.split("|")[1].strip()
        cited = NAMED.findall(row.rsplit("|", 2)[-2])
        if not cited:
            problems.append(f"{event!r} names no test")
        for file, name in cited:
            if not (TESTS / file).is_file() or name not in _tests_in(TESTS / file):
                problems.append(f"{event!r} names {file}::{name}, which does not exist")
    assert not problems, "\n".join(problems)
