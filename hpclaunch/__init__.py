"""hpclaunch: distributed PyTorch on SLURM, from one command.

The public API is what ``__all__`` lists; everything else is internal.
Importing this package never imports torch.
"""

from hpclaunch._version import __version__
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
from hpclaunch.job.spec import GpuDirective, JobSpec

_LAZY = {"Executor", "ExecutorError", "Job"}  # hpclaunch.executor imports submitit


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from hpclaunch import executor

        return getattr(executor, name)
    raise AttributeError(f"module 'hpclaunch' has no attribute {name!r}")


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
