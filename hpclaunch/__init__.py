"""hpclaunch: distributed PyTorch on SLURM, from one command.

The public API is what ``__all__`` lists; everything else is internal.
Importing this package never imports torch.
"""

from hpclaunch.errors import (
    ConfigError,
    HpclaunchError,
    SlurmError,
    SlurmNotFound,
    SpecError,
    TemplateError,
)
from hpclaunch.spec import EntryKind, GpuDirective, JobSpec, Rendezvous
from hpclaunch.values import NodeRange

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "EntryKind",
    "GpuDirective",
    "HpclaunchError",
    "JobSpec",
    "NodeRange",
    "Rendezvous",
    "SlurmError",
    "SlurmNotFound",
    "SpecError",
    "TemplateError",
    "__version__",
]
