"""Claims the docs make about the code, checked against the code itself."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from hpclaunch.executor.params import ParameterError, convert

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_every_ready_example_is_on_the_examples_page_with_its_command() -> None:
    page = (DOCS / "examples.md").read_text()
    folders = sorted(p for p in (ROOT / "examples" / "sbatch").iterdir() if p.is_dir())
    assert folders, "no examples/sbatch folders"
    for folder in folders:
        args = " ".join(folder.joinpath("args").read_text().split("\n")).strip()
        row = f"| `examples/sbatch/{folder.name}/` |"
        assert row in page, f"docs/examples.md does not list {folder.name}"
        line = next(line for line in page.splitlines() if line.startswith(row))
        assert f"`hpclaunch {args}`" in line, f"docs/examples.md: {folder.name}'s command"
    scripts = sorted(p.name for p in (ROOT / "examples").glob("*.py"))
    for script in scripts:
        assert f"`examples/{script}`" in page, f"docs/examples.md does not list {script}"


def refused_in_docs() -> set[str]:
    page = (DOCS / "python-api.md").read_text()
    mark = "<!-- refused slurm_ parameters: tests/unit/test_docs_claims.py checks -->"
    assert mark in page, "python-api.md lost the list of refused slurm_ parameters"
    paragraph = page.split(mark, 1)[1].strip().split("\n\n", 1)[0]
    return set(re.findall(r"`(slurm_\w+)`", paragraph))


def test_python_api_lists_exactly_the_slurm_parameters_it_refuses() -> None:
    """submitit's own ``slurm_*`` parameters: the docs name the refused ones."""
    slurm = pytest.importorskip("submitit.slurm.slurm")
    names = inspect.signature(slurm._make_sbatch_string).parameters
    refused = set()
    for name in names:
        if name in ("command", "folder", "map_count"):
            continue
        try:
            convert({f"slurm_{name}": 1})
        except ParameterError as exc:
            if "unknown parameter" in exc.message:
                refused.add(f"slurm_{name}")
    assert refused, "submitit's parameters all accepted? the test lost its subject"
    assert refused_in_docs() == refused
