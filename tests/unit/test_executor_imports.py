"""The Executor's side of the re-layout: the worker run on every rank loads no submit
side, and the Executor's job watcher asks SLURM through the one lookup."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpclaunch.slurm.commands import CommandResult, FakeRunner, Slurm

ROOT = Path(__file__).resolve().parents[2]
SUBMIT_SIDE = (
    "submitit",
    "hpclaunch.job",
    "hpclaunch.slurm",
    "hpclaunch.ops",
    "hpclaunch.executor.api",
    "hpclaunch.executor.jobs",
)


def _loaded(statement: str) -> set[str]:
    code = f"{statement}; import sys; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return {n for n in out.split() if any(n == p or n.startswith(p + ".") for p in SUBMIT_SIDE)}


def test_the_worker_loads_no_submit_side() -> None:
    """``python -m hpclaunch.executor.worker`` runs on every rank: no submitit executors,
    no rendering, no SLURM commands. ``hpclaunch/__init__`` exports JobSpec, so what
    ``import hpclaunch`` loads itself (job.spec, job.values) is not the worker's doing."""
    package = _loaded("import hpclaunch")
    worker = _loaded("import hpclaunch.executor.worker")
    assert worker - package == set()
    assert not {n for n in worker if n.startswith(("submitit", "hpclaunch.slurm"))}
    assert "hpclaunch.job.render" not in worker


def test_the_executor_names_load_when_used() -> None:
    import hpclaunch.executor as executor

    assert executor.ParameterError.__module__ == "hpclaunch.executor.params"
    assert executor.Executor.__name__ == "Executor"
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        executor.Nope  # noqa: B018


def _watcher(handlers: dict[str, object]) -> object:
    from hpclaunch.executor.jobs import ScontrolWatcher

    return ScontrolWatcher(slurm=Slurm(FakeRunner(handlers)))  # type: ignore[arg-type]


def _answer(code: int, out: str = "", err: str = "") -> object:
    return lambda argv: CommandResult(argv, code, out, err)


def test_the_watcher_reads_scontrol_then_sacct() -> None:
    running = _watcher(
        {"scontrol": _answer(0, "JobId=7 JobState=RUNNING NodeList=n1 Restarts=1\n")}
    )
    assert running._query("7") == {  # type: ignore[attr-defined]
        "State": "RUNNING",
        "NodeList": "n1",
        "JobId": "7",
        "Restarts": "1",
    }
    forgot = "slurm_load_jobs error: Invalid job id specified\n"
    accounted = _watcher(
        {"scontrol": _answer(1, err=forgot), "sacct": _answer(0, "TIMEOUT|n[1-2]|0:15\n")}
    )
    assert accounted._query("7")["State"] == "TIMEOUT"  # type: ignore[attr-defined]
    assert accounted.is_done("7") is True  # type: ignore[attr-defined]
    no_sacct = _watcher({"scontrol": _answer(1, err=forgot), "sacct": _answer(1, err="off\n")})
    assert no_sacct._query("7") == {"State": "ENDED", "JobId": "7"}  # type: ignore[attr-defined]
    down = _watcher({"scontrol": _answer(1, err="Socket timed out\n"), "sacct": _answer(1)})
    assert down._query("7") == {}  # type: ignore[attr-defined]  # unreachable is not ended
