"""The Python API: submit hpclaunch jobs from Python, through submitit.

    executor = hpclaunch.Executor("runs/sweep", nodes=2, nproc_per_node=4, time="01:00:00")
    job = executor.submit(train, lr=3e-4)
    print(job.result())  # global rank 0's return value

See docs/python-api.md. Importing this package imports nothing: the names below are
loaded when first used, so that ``python -m hpclaunch.executor.worker``, run on every
rank, does not load submitit's executors and the submit side. Never torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpclaunch.executor.api import Executor, ExecutorError, run_script
    from hpclaunch.executor.jobs import Job, LocalJob
    from hpclaunch.executor.params import ParameterError

# Each public name, and the module that defines it.
_WHERE = {
    "Executor": "hpclaunch.executor.api",
    "ExecutorError": "hpclaunch.executor.api",
    "run_script": "hpclaunch.executor.api",
    "Job": "hpclaunch.executor.jobs",
    "LocalJob": "hpclaunch.executor.jobs",
    "ParameterError": "hpclaunch.executor.params",
}


def __getattr__(name: str) -> object:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'hpclaunch.executor' has no attribute {name!r}")


__all__ = ["Executor", "ExecutorError", "Job", "LocalJob", "ParameterError", "run_script"]
