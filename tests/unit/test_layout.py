"""The package's shape: no import cycles, between modules or between folders, each
folder importing only what its floor in the data flow allows (FLOORS, MAY_IMPORT).

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
NO_TORCH_AT_TOP = ("cli", "contract", "job", "slurm", "jobdir", "ops", "recovery")
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


# The package's floors, bottom up. A folder (a top-level module counts as a folder of
# its own name; "hpclaunch" is the package's __init__, its public API) imports the
# folders on the floors below its own, as MAY_IMPORT lists them; an arrow within a floor,
# or up, is there with the reason the code has for it.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "_version"),
    # The ground floor: what the parts that run in different places agree on, and /proc.
    ("contract", "procs"),
    # Talking to SLURM; the job folder's paths and formats (no analyses).
    ("slurm", "jobdir"),
    # The login node's spec and script; the job folder read as one record, and what is
    # derived from it; the worker API; the rendezvous the agents use.
    ("job", "record", "checkpoint", "progress", "rendezvous"),
    # Each node's agent; the batch step's supervisor.
    ("node", "recovery"),
    # Operating jobs from the login node; submitit's interface; frameworks in the workers.
    ("ops", "executor", "frameworks"),
    # The command line; the development cluster.
    ("cli", "sandbox"),
    ("hpclaunch", "__main__"),
)
DOWN = ""  # an arrow to a lower floor needs no reason
MAY_IMPORT: dict[str, dict[str, str]] = {
    "errors": {},
    "_version": {},
    "contract": {"errors": DOWN},
    "procs": {},
    "slurm": {
        "errors": DOWN,
        "contract": DOWN,
        "jobdir": "submit keeps the script it submits in the job folder (JobFolder.of)",
    },
    "jobdir": {"errors": DOWN, "contract": DOWN},
    "job": {"errors": DOWN, "_version": DOWN, "contract": DOWN, "jobdir": DOWN},
    "record": {"contract": DOWN, "jobdir": DOWN},
    "checkpoint": {
        "errors": DOWN,
        "contract": DOWN,
        "procs": DOWN,
        "slurm": DOWN,
        "jobdir": DOWN,
        "progress": "a save and a load note their step in the worker's progress: one API",
    },
    "progress": {"contract": DOWN, "jobdir": DOWN},
    "rendezvous": {"errors": DOWN, "contract": DOWN, "slurm": DOWN},
    "node": {
        "errors": DOWN,
        "contract": DOWN,
        "procs": DOWN,
        "slurm": DOWN,
        "jobdir": DOWN,
        "progress": DOWN,
        "record": DOWN,
        "rendezvous": DOWN,
        "recovery": "an agent runs the deputy (recovery.deputy, lazily) when a --no-kill "
        "job's batch host is lost or the supervisor stops answering",
    },
    "recovery": {
        "errors": DOWN,
        "procs": DOWN,
        "contract": DOWN,
        "slurm": DOWN,
        "jobdir": DOWN,
        "record": DOWN,
        "checkpoint": DOWN,
    },
    "ops": {
        "errors": DOWN,
        "_version": DOWN,
        "contract": DOWN,
        "slurm": DOWN,
        "jobdir": DOWN,
        "job": DOWN,
        "record": DOWN,
        "checkpoint": DOWN,
        "node": DOWN,
    },
    "executor": {
        "errors": DOWN,
        "contract": DOWN,
        "slurm": DOWN,
        "jobdir": DOWN,
        "job": DOWN,
        "record": DOWN,
        "checkpoint": DOWN,
        "node": DOWN,
        "ops": "a job handle's root cause is `hpclaunch status`'s, and a submitted job joins "
        "the job list (ops.registry, lazily) as sbatch's do",
    },
    "frameworks": {"jobdir": DOWN, "checkpoint": DOWN, "progress": DOWN},
    "cli": {
        "errors": DOWN,
        "_version": DOWN,
        "contract": DOWN,
        "slurm": DOWN,
        "jobdir": DOWN,
        "job": DOWN,
        "checkpoint": DOWN,
        "node": DOWN,
        "recovery": DOWN,
        "ops": DOWN,
    },
    "sandbox": {
        "errors": DOWN,
        "procs": DOWN,
        "slurm": DOWN,
        "cli": "`hpclaunch sandbox` is a command: it exits through the CLI's error exit "
        "(cli.context.fail)",
    },
    "hpclaunch": {
        "errors": DOWN,
        "_version": DOWN,
        "contract": DOWN,
        "job": DOWN,
        "executor": DOWN,
    },
    "__main__": {"cli": DOWN},
}
# PENDING: arrows the code still has and the table does not allow, by module, each
# until the change that removes it lands (a test fails once it is gone, so the line
# goes with it). None now: the last ones, jobdir's analyses reading checkpoint.store,
# left with goodput and lost work for record/ (447f54c).
PENDING: dict[str, set[str]] = {}
FLOOR = {folder: n for n, folders in enumerate(FLOORS) for folder in folders}


def folder_of(name: str) -> str:
    """The folder (or top-level module) of dotted module ``name``: hpclaunch.job.spec ->
    job, hpclaunch.errors -> errors, hpclaunch -> hpclaunch."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


@dataclass(frozen=True)
class Arrow:
    """One import of another folder's module, where the code says it."""

    module: Module
    line: int
    imported: str

    @property
    def source(self) -> str:
        return folder_of(self.module.name)

    @property
    def target(self) -> str:
        return folder_of(self.imported)

    @property
    def where(self) -> str:
        return f"hpclaunch/{self.module.rel}:{self.line} imports {self.imported}"


def arrows() -> list[Arrow]:
    """Every import, at module level or in a function (but for ``if TYPE_CHECKING:``), of
    a module of another folder."""
    return [
        Arrow(m, line, name)
        for m in MODULES
        for name, line in imports(m)
        if name in NAMES and folder_of(name) != folder_of(m.name)
    ]


def _pending(arrow: Arrow) -> bool:
    return arrow.target in PENDING.get(arrow.module.rel, set())


def test_every_folder_has_its_floor_and_its_row() -> None:
    folders = {folder_of(m.name) for m in MODULES}
    assert folders == set(FLOOR), (
        f"not in FLOORS: {sorted(folders - set(FLOOR))}; "
        f"in FLOORS but no such folder: {sorted(set(FLOOR) - folders)}"
    )
    assert set(MAY_IMPORT) == set(FLOOR)


def test_every_import_is_allowed_by_the_folder_table() -> None:
    bad = [
        f"{a.where}: {a.source} (floor {FLOOR[a.source]}) may import only "
        f"{', '.join(sorted(MAY_IMPORT[a.source])) or 'nothing of hpclaunch'}, "
        f"not {a.target} (floor {FLOOR[a.target]}); import it from a lower floor, or add the "
        "arrow to MAY_IMPORT (with its reason if it is not downward)"
        for a in arrows()
        if a.target not in MAY_IMPORT[a.source] and not _pending(a)
    ]
    assert not bad, "\n".join(bad)


def test_an_arrow_has_a_reason_exactly_when_it_is_not_downward() -> None:
    bad = []
    for source, targets in MAY_IMPORT.items():
        for target, reason in targets.items():
            down = FLOOR[target] < FLOOR[source]
            if down and reason:
                bad.append(f"{source} -> {target} is downward: drop its reason")
            if not down and not reason:
                bad.append(
                    f"{source} (floor {FLOOR[source]}) -> {target} (floor {FLOOR[target]}) is "
                    "not downward: give the reason the code has for it"
                )
    assert not bad, "\n".join(bad)


def test_every_reasoned_and_pending_arrow_is_still_in_the_code() -> None:
    """An exception outlives its reason otherwise: remove it when the import goes."""
    used = {(a.source, a.target) for a in arrows()}
    used_pending = {(a.module.rel, a.target) for a in arrows() if _pending(a)}
    stale = [
        f"MAY_IMPORT[{source!r}][{target!r}]: no import of {target} in {source} any more"
        for source, targets in MAY_IMPORT.items()
        for target, reason in targets.items()
        if reason and (source, target) not in used
    ]
    stale += [
        f"PENDING[{rel!r}]: {rel} imports {target} no more; remove it"
        for rel, targets in PENDING.items()
        for target in targets
        if (rel, target) not in used_pending
    ]
    assert not stale, "\n".join(stale)


def test_the_folders_form_no_cycle() -> None:
    """Neither the table nor the code (without the PENDING arrows) has a cycle of folders."""
    allowed = {source: set(targets) for source, targets in MAY_IMPORT.items()}
    assert not _cycles(allowed), f"MAY_IMPORT allows cycles: {_cycles(allowed)}"
    graph: dict[str, set[str]] = {folder: set() for folder in FLOOR}
    for arrow in arrows():
        if not _pending(arrow):
            graph[arrow.source].add(arrow.target)
    assert not _cycles(graph), f"folder cycles: {_cycles(graph)}"


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
