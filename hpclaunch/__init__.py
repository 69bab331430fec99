"""hpclaunch: distributed PyTorch on SLURM, from one command.

The public API is what ``__all__`` lists; everything else is internal.
Importing this package never imports torch, and loads each name only when it is used
(the ``hpclaunch`` command's subcommands load what they need, not the whole API).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hpclaunch._version import __version__

if TYPE_CHECKING:
    from hpclaunch.contract.agent import EntryKind
    from hpclaunch.contract.rendezvous import C10dRdzv, EtcdRdzv, Rendezvous, StaticRdzv
    from hpclaunch.contract.values import NodeRange
    from hpclaunch.errors import (
        ConfigError,
        HpclaunchError,
        SlurmError,
        SlurmNotFound,
        SpecError,
        TemplateError,
    )
    from hpclaunch.executor import Executor, ExecutorError, Job
    from hpclaunch.job.spec import GpuDirective, JobSpec

# Each public name, and the module it lives in (hpclaunch.executor imports submitit).
_WHERE = {
    "C10dRdzv": "hpclaunch.contract.rendezvous",
    "ConfigError": "hpclaunch.errors",
    "EntryKind": "hpclaunch.contract.agent",
    "EtcdRdzv": "hpclaunch.contract.rendezvous",
    "Executor": "hpclaunch.executor",
    "ExecutorError": "hpclaunch.executor",
    "GpuDirective": "hpclaunch.job.spec",
    "HpclaunchError": "hpclaunch.errors",
    "Job": "hpclaunch.executor",
    "JobSpec": "hpclaunch.job.spec",
    "NodeRange": "hpclaunch.contract.values",
    "Rendezvous": "hpclaunch.contract.rendezvous",
    "SlurmError": "hpclaunch.errors",
    "SlurmNotFound": "hpclaunch.errors",
    "SpecError": "hpclaunch.errors",
    "StaticRdzv": "hpclaunch.contract.rendezvous",
    "TemplateError": "hpclaunch.errors",
}


def __getattr__(name: str) -> object:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value  # the next use is a plain lookup
        return value
    raise AttributeError(f"module 'hpclaunch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = [
    "C10dRdzv",
    "ConfigError",
    "EntryKind",
    "EtcdRdzv",
    "Executor",
    "ExecutorError",
    "GpuDirective",
    "HpclaunchError",
    "Job",
    "JobSpec",
    "NodeRange",
    "Rendezvous",
    "SlurmError",
    "SlurmNotFound",
    "SpecError",
    "StaticRdzv",
    "TemplateError",
    "__version__",
]
