"""The package's shape: no import
cycles, each folder importing only what its place in the data flow allows.

These read the source (ast), so a change that breaks a rule fails here with the file,
the line and the rule, before a reviewer has to notice it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hpclaunch"
# Folders whose code runs on the login node or in the batch step: torch may be imported
# only inside a function there (the CLI answers in a fraction of a second).
NO_TORCH_AT_TOP = ("cli", "job", "slurm", "jobdir", "ops", "recovery")
# Where a process may write its own environment, each for a reason of its own; nothing
# else uses os.environ to pass values between parts of hpclaunch.
ENVIRON_WRITERS = {
    # A forked worker becomes the process `python script.py` would be.
    ("node/warmstart/forked_worker.py", "become_worker"),
    # OpenBLAS reads its thread count from the environment when torch loads it.
    ("node/warmstart/preload.py", "import_torch_single_threaded"),
    # The local node stands in for the batch script: its exports, before the agent starts.
    ("executor/local_node.py", "main"),
    # A fresh worker's boot gives the script the PYTHONPATH it was meant to have.
    ("node/progress_boot/sitecustomize.py", "_boot"),
}


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. hpclaunch.job.spec
    path: Path
    tree: ast.Module

    @property
    def rel(self) -> str:
        return self.path.relative_to(PACKAGE).as_posix()


def _modules() -> list[Module]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append(Module(name, path, ast.parse(path.read_text(), str(path))))
    return out


MODULES = _modules()
NAMES = {m.name for m in MODULES}


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (never run)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skipped.update(id(sub) for sub in ast.walk(stmt))
    return skipped


def imports(module: Module, *, top_level_only: bool = False) -> Iterator[tuple[str, int]]:
    """(imported module, line) for each import of ``module`` that runs."""
    skipped = _type_checking_nodes(module.tree)
    nodes = module.tree.body if top_level_only else ast.walk(module.tree)
    for node in nodes:
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                yield (sub if sub in NAMES else node.module), node.lineno


def test_no_import_cycles() -> None:
    graph = {
        m.name: {name for name, _ in imports(m) if name in NAMES and name != m.name}
        for m in MODULES
    }
    cycles = _cycles(graph)
    assert not cycles, f"import cycles: {cycles}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_production_code_does_not_import_the_sandbox() -> None:
    bad = [
        f"{m.rel}:{line} imports {name}"
        for m in MODULES
        if not m.name.startswith("hpclaunch.sandbox")
        for name, line in imports(m)
        if name.startswith("hpclaunch.sandbox")
        and not (m.name == "hpclaunch.cli" and name == "hpclaunch.sandbox.cli")
    ]
    assert not bad, bad


def test_the_command_group_names_the_sandbox_only_as_a_lazy_string() -> None:
    """`hpclaunch sandbox` is loaded by name when used, not imported by the CLI."""
    cli = next(m for m in MODULES if m.name == "hpclaunch.cli")
    assert not [name for name, _ in imports(cli) if name.startswith("hpclaunch.sandbox")]


@pytest.mark.parametrize("folder", NO_TORCH_AT_TOP)
def test_login_side_folders_import_no_torch_at_module_level(folder: str) -> None:
    bad = [
        f"{m.rel}:{line} imports {name} at module level"
        for m in MODULES
        if m.rel.startswith(folder + "/")
        for name, line in imports(m, top_level_only=True)
        if name.split(".")[0] in {"torch", "etcd3gw", "submitit", "lightning", "accelerate"}
    ]
    assert not bad, bad


def test_nothing_passes_values_through_the_environment_or_patches_modules() -> None:
    """The issue's check: `git grep "os.environ[...] =|os.environ.update|setattr("`."""
    bad = []
    for module in MODULES:
        if module.rel.startswith("sandbox/"):
            continue
        allowed = {
            id(sub)
            for fn in _functions(module.tree)
            if (module.rel, fn.name) in ENVIRON_WRITERS
            for sub in ast.walk(fn)
        }
        for node in ast.walk(module.tree):
            if id(node) in allowed:
                continue
            text = ast.unparse(node) if isinstance(node, ast.stmt | ast.Call) else ""
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AugAssign)
                else []
            )
            writes = any(ast.unparse(target).startswith("os.environ[") for target in targets)
            calls = isinstance(node, ast.Call) and ast.unparse(node.func) in {
                "os.environ.update",
                "os.environ.setdefault",
                "setattr",
            }
            if writes or calls:
                bad.append(f"{module.rel}:{node.lineno} {text}")
    assert not bad, "\n".join(bad)
