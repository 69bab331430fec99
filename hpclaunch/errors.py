"""The error tree of hpclaunch.

Library code raises these; only the CLI prints them and picks the exit code.
Every message says what was wrong, the value, where it came from, and the fix.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence


class ExitCode(enum.IntEnum):
    """Exit codes of the ``hpclaunch`` command, documented in docs/cli.md."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    SLURM = 3
    """A SLURM command failed or is not available here."""
    GAVE_UP = 4
    """The supervisor: a requeue was due, but the job's --max-requeues is spent."""


class HpclaunchError(Exception):
    """Base class: a problem hpclaunch can explain to its user."""

    exit_code: ExitCode = ExitCode.FAILURE


class SpecError(HpclaunchError):
    """A job description value is invalid.

    ``field`` names the option (as profiles spell it, e.g. ``nodes``) and
    ``also`` the other options a rule between values involves; the config
    layer prefixes where each value came from.
    """

    exit_code = ExitCode.USAGE

    def __init__(self, field: str, message: str, also: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.field = field
        self.fields = (field, *also)
        self.message = message


class ConfigError(HpclaunchError):
    """A profile file or profile name is invalid."""

    exit_code = ExitCode.USAGE


class TemplateError(HpclaunchError):
    """An sbatch template cannot be loaded or rendered."""

    exit_code = ExitCode.USAGE


class SlurmError(HpclaunchError):
    """A SLURM command exited non-zero or timed out."""

    exit_code = ExitCode.SLURM

    def __init__(
        self, argv: Sequence[str], returncode: int | None, stderr: str, message: str
    ) -> None:
        super().__init__(message)
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr


class SandboxError(HpclaunchError):
    """The sandbox cannot be started, reached or stopped."""


class SlurmNotFound(SlurmError):
    """A SLURM command is not on PATH: this is not a SLURM login node."""


class EtcdError(HpclaunchError):
    """etcd cannot be reached, refuses the credentials, or its server cannot start."""
