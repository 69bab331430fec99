"""``JobSpec``: the one typed, frozen, validated description of a job.

Everything that describes a job (CLI flags, profiles, the Python API) ends up
here. The parsers turn the strings users type (``2:4``, ``04:00:00``, ``64G``)
into typed values; ``JobSpec.__post_init__`` checks every invariant, including
those between fields. No I/O happens in this module.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import PurePath

from hpclaunch.errors import SpecError

DEFAULT_LOG_DIR = "hpclaunch-logs"
DEFAULT_SIGNAL_LEAD_S = 120
DEFAULT_MAX_RESTARTS = 3
DEFAULT_MAX_REQUEUES = 3
# SLURM stores the --signal lead time in 16 bits.
MAX_SIGNAL_LEAD_S = 0xFFFF

# sbatch options that JobSpec fields own; setting them through --sbatch-option
# would silently contradict the rendered directives.
MANAGED_SBATCH_OPTIONS: Mapping[str, str] = {
    "nodes": "--nodes",
    "N": "--nodes",
    "ntasks-per-node": "(fixed: one agent per node)",
    "ntasks": "(fixed: one agent per node)",
    "n": "(fixed: one agent per node)",
    "gpus-per-node": "--gpus-per-node",
    "gres": "--gpus-per-node (and gpu_directive = 'gres' in a profile)",
    "time": "--time",
    "t": "--time",
    "partition": "--partition",
    "p": "--partition",
    "account": "--account",
    "A": "--account",
    "qos": "--qos",
    "q": "--qos",
    "constraint": "--constraint",
    "C": "--constraint",
    "exclude": "--exclude",
    "x": "--exclude",
    "mem": "--mem",
    "cpus-per-task": "--cpus-per-task",
    "c": "--cpus-per-task",
    "job-name": "--job-name",
    "J": "--job-name",
    "output": "--log-dir",
    "o": "--log-dir",
    "error": "--log-dir",
    "e": "--log-dir",
    "open-mode": "(fixed: append, so a requeued job keeps one log)",
    "requeue": "(fixed: always requeueable)",
    "no-requeue": "--max-requeues 0",
    "signal": "--signal-lead",
}

# srun options the rendered step sets itself (one agent task per node).
MANAGED_SRUN_OPTIONS = frozenset(
    {"nodes", "N", "ntasks", "n", "ntasks-per-node", "kill-on-bad-exit", "K", "cpus-per-task", "c"}
)

_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]*\Z")
_MEM = re.compile(r"(\d+)([KMGT]?)\Z", re.IGNORECASE)
_ENDPOINT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d+)\Z")
_UNLIMITED_WORDS = frozenset({"unlimited", "infinite"})
UNLIMITED = timedelta.max
"""The time limit ``UNLIMITED``; ``None`` means no limit was asked for (the
partition's default applies)."""


class Rendezvous(enum.Enum):
    """How the per-node agents find each other."""

    STATIC = "static"
    C10D = "c10d"
    ETCD = "etcd"


class EntryKind(enum.Enum):
    """What the training command is."""

    SCRIPT = "script"  # python SCRIPT ARGS...
    MODULE = "module"  # python -m MODULE ARGS...
    EXECUTABLE = "executable"  # EXECUTABLE ARGS... (--no-python)


class GpuDirective(enum.Enum):
    """How GPUs are requested: some clusters accept only ``--gres=gpu:G``."""

    GPUS_PER_NODE = "gpus-per-node"
    GRES = "gres"


@dataclass(frozen=True)
class NodeRange:
    """A node count, fixed (``min == max``) or elastic."""

    min: int
    max: int

    def __post_init__(self) -> None:
        if self.min < 1:
            raise SpecError(
                "nodes", f"node count {self.min} is not positive; ask for at least 1 node"
            )
        if self.min > self.max:
            raise SpecError(
                "nodes",
                f"node range {self.min}:{self.max} has MIN > MAX; "
                f"write it as {self.max}:{self.min}",
            )

    @property
    def is_elastic(self) -> bool:
        return self.min != self.max

    def __str__(self) -> str:
        """The form the CLI takes and the agent receives: ``N`` or ``MIN:MAX``."""
        return str(self.min) if not self.is_elastic else f"{self.min}:{self.max}"

    @property
    def sbatch(self) -> str:
        """SLURM's form: ``N`` or ``MIN-MAX``."""
        return str(self.min) if not self.is_elastic else f"{self.min}-{self.max}"


def parse_nodes(text: str) -> NodeRange:
    """Parse ``N`` or ``MIN:MAX``. Raises SpecError."""
    text = text.strip()
    parts = text.split(":")
    if len(parts) > 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
        hint = ""
        if re.fullmatch(r"\d+-\d+", text):
            hint = f"; for a range write {text.replace('-', ':')}"
        raise SpecError(
            "nodes", f"{text!r} is not a node count: use N or MIN:MAX, e.g. 4 or 2:4{hint}"
        )
    low = int(parts[0])
    return NodeRange(low, int(parts[-1]))


def parse_time(text: str) -> timedelta:
    """Parse a SLURM time limit (``UNLIMITED`` for none). Raises SpecError.

    Accepted forms are SLURM's: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
    ``D-H:M:S``, and ``UNLIMITED``/``INFINITE``.
    """
    raw = text
    text = text.strip()
    if text.lower() in _UNLIMITED_WORDS:
        return UNLIMITED
    days = 0
    rest = text
    if "-" in text:
        day_text, _, rest = text.partition("-")
        if not day_text.isdigit():
            rest = ""  # forces the error below
        else:
            days = int(day_text)
    fields = rest.split(":")
    if not rest or len(fields) > 3 or not all(f.isdigit() for f in fields):
        raise SpecError(
            "time",
            f"{raw!r} is not a SLURM time limit; use one of M, M:S, H:M:S, D-H, D-H:M, "
            "D-H:M:S (e.g. 30, 04:00:00, 2-12) or UNLIMITED",
        )
    nums = [int(f) for f in fields]
    if "-" in text:  # D-H, D-H:M, D-H:M:S
        nums += [0] * (3 - len(nums))
        hours, minutes, seconds = nums
    elif len(nums) == 1:  # M
        hours, minutes, seconds = 0, nums[0], 0
    elif len(nums) == 2:  # M:S
        hours, minutes, seconds = 0, nums[0], nums[1]
    else:  # H:M:S
        hours, minutes, seconds = nums
    limit = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    if limit <= timedelta(0):
        raise SpecError("time", f"time limit {raw!r} is zero; give a positive limit or UNLIMITED")
    return limit


def format_time(limit: timedelta) -> str:
    """SLURM's ``D-HH:MM:SS`` (or ``UNLIMITED``)."""
    if limit == UNLIMITED:
        return "UNLIMITED"
    total = int(limit.total_seconds())
    days, rem = divmod(total, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, seconds = divmod(rem, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}"


def parse_mem(text: str) -> str:
    """Validate SLURM's ``--mem`` form (``64G``, ``500M``, ``0`` = all). Raises SpecError."""
    match = _MEM.fullmatch(text.strip())
    if not match:
        raise SpecError(
            "mem",
            f"{text!r} is not a memory size; use a whole number with an optional unit "
            "K, M, G or T, e.g. 64G (0 asks for all of a node's memory)",
        )
    return match.group(1) + match.group(2).upper()


def parse_env(text: str) -> tuple[str, str]:
    """Parse one ``--env KEY=VALUE``. Raises SpecError."""
    key, sep, value = text.partition("=")
    if not sep:
        raise SpecError("env", f"{text!r} has no '='; write KEY=VALUE, e.g. --env NCCL_DEBUG=INFO")
    return key, value


def parse_sbatch_option(text: str) -> tuple[str, str | None]:
    """Parse ``KEY=VALUE`` or a bare flag ``KEY`` (e.g. ``exclusive``)."""
    key, sep, value = text.partition("=")
    return key.lstrip("-"), (value if sep else None)


def parse_endpoints(text: str) -> tuple[str, ...]:
    """Parse ``host:port[,host:port...]``. Raises SpecError."""
    endpoints = tuple(part.strip() for part in text.split(",") if part.strip())
    if not endpoints:
        raise SpecError(
            "etcd_endpoint", f"{text!r} names no endpoint; write host:port[,host:port...]"
        )
    return endpoints


def _check_text(name: str, value: str, *, one_line: bool) -> None:
    """Reject NUL always, and line breaks and other control characters where the
    value goes into an ``#SBATCH`` line, which sbatch ends at the first newline."""
    if "\0" in value:
        raise SpecError(name, f"{value!r} contains a NUL byte, which no process can receive")
    if one_line and any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise SpecError(
            name,
            f"{value!r} contains a line break or control character; it goes into an "
            "#SBATCH line, which must stay on one line: remove it",
        )


def _check_count(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(name, f"{value!r} is not a whole number")
    if value < minimum:
        raise SpecError(name, f"{value} is below the minimum of {minimum}; give {minimum} or more")


@dataclass(frozen=True)
class JobSpec:
    """A complete, validated description of one hpclaunch job.

    Construct it directly (the Python API), or through ``hpclaunch.config``
    (CLI flags and profiles). Raises SpecError on any invalid value.
    """

    entrypoint: str
    args: tuple[str, ...] = ()
    entry_kind: EntryKind = EntryKind.SCRIPT
    nodes: NodeRange = NodeRange(1, 1)
    gpus_per_node: int = 0
    nproc_per_node: int | None = None
    time_limit: timedelta | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclude: str | None = None
    mem: str | None = None
    cpus_per_task: int | None = None
    job_name: str | None = None
    log_dir: str = DEFAULT_LOG_DIR
    checkpoint_dir: str | None = None
    max_restarts: int = DEFAULT_MAX_RESTARTS
    max_requeues: int = DEFAULT_MAX_REQUEUES
    signal_lead_s: int = DEFAULT_SIGNAL_LEAD_S
    rdzv: Rendezvous = Rendezvous.C10D
    etcd_endpoints: tuple[str, ...] = ()
    etcd_sidecar: bool = False
    template: str | None = None
    gpu_directive: GpuDirective = GpuDirective.GPUS_PER_NODE
    sbatch_options: tuple[tuple[str, str | None], ...] = ()
    srun_options: tuple[tuple[str, str | None], ...] = ()
    setup: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    launcher: tuple[str, ...] = ("hpclaunch",)

    def __post_init__(self) -> None:
        self._check_entrypoint()
        _check_count("gpus_per_node", self.gpus_per_node, 0)
        if self.nproc_per_node is not None:
            _check_count("nproc_per_node", self.nproc_per_node, 1)
        if self.cpus_per_task is not None:
            _check_count("cpus_per_task", self.cpus_per_task, 1)
        _check_count("max_restarts", self.max_restarts, 0)
        _check_count("max_requeues", self.max_requeues, 0)
        _check_count("signal_lead", self.signal_lead_s, 1)
        if self.signal_lead_s > MAX_SIGNAL_LEAD_S:
            raise SpecError(
                "signal_lead",
                f"{self.signal_lead_s} s exceeds SLURM's maximum of {MAX_SIGNAL_LEAD_S} s",
            )
        if self.time_limit is not None and self.signal_lead_s >= self.time_limit.total_seconds():
            raise SpecError(
                "signal_lead",
                f"the warning {self.signal_lead_s} s before the end is not inside the time "
                f"limit {format_time(self.time_limit)}; lower --signal-lead or raise --time",
            )
        for name in ("partition", "account", "qos", "constraint", "exclude", "job_name"):
            value = getattr(self, name)
            if value is not None:
                _check_text(name, value, one_line=True)
                if not value.strip():
                    raise SpecError(name, f"{value!r} is empty; leave it out or give a value")
        if self.mem is not None:
            parse_mem(self.mem)
        _check_text("log_dir", self.log_dir, one_line=True)
        if not self.log_dir:
            raise SpecError("log_dir", "the log folder is empty; give a path")
        if self.checkpoint_dir is not None:
            _check_text("checkpoint_dir", self.checkpoint_dir, one_line=False)
        for arg in self.args:
            _check_text("args", arg, one_line=False)
        for line in self.setup:
            _check_text("setup", line, one_line=False)
        for word in self.launcher:
            _check_text("launcher", word, one_line=False)
        if not self.launcher:
            raise SpecError("launcher", "the launcher command is empty; the default is hpclaunch")
        self._check_env()
        self._check_options("sbatch_options", self.sbatch_options, sbatch=True)
        self._check_options("srun_options", self.srun_options, sbatch=False)
        self._check_rendezvous()

    def _check_entrypoint(self) -> None:
        if not self.entrypoint:
            raise SpecError(
                "script", "no training script given; name a script, -m MODULE, or an executable"
            )
        _check_text("script", self.entrypoint, one_line=False)
        if self.entry_kind is EntryKind.MODULE and not all(
            part.isidentifier() for part in self.entrypoint.split(".")
        ):
            raise SpecError(
                "module", f"{self.entrypoint!r} is not a Python module name like pkg.train"
            )

    def _check_env(self) -> None:
        for key, value in self.env:
            if key.startswith("HPCLAUNCH_"):
                raise SpecError(
                    "env",
                    f"{key!r} is set by hpclaunch itself; use its option instead "
                    "(e.g. --checkpoint-dir for HPCLAUNCH_CHECKPOINT_DIR)",
                )
            if not _SHELL_NAME.match(key):
                raise SpecError(
                    "env",
                    f"{key!r} is not a valid environment variable name; use letters, digits "
                    "and underscores, not starting with a digit",
                )
            _check_text("env", value, one_line=False)

    @staticmethod
    def _check_options(
        name: str, options: tuple[tuple[str, str | None], ...], *, sbatch: bool
    ) -> None:
        for key, value in options:
            if not _OPTION_NAME.match(key):
                raise SpecError(
                    name,
                    f"{key!r} is not an option name; write it without leading dashes, "
                    "e.g. exclusive or mail-type=END",
                )
            if sbatch and key in MANAGED_SBATCH_OPTIONS:
                raise SpecError(
                    name,
                    f"{key!r} is set by hpclaunch itself; "
                    f"use {MANAGED_SBATCH_OPTIONS[key]} instead",
                )
            if not sbatch and key in MANAGED_SRUN_OPTIONS:
                raise SpecError(
                    name,
                    f"{key!r} is set on the agent's srun step by hpclaunch itself "
                    "(one agent per node; --cpus-per-task for CPUs); leave it out",
                )
            if value is not None:
                _check_text(name, value, one_line=sbatch)

    def _check_rendezvous(self) -> None:
        if self.rdzv is Rendezvous.STATIC and self.nodes.is_elastic:
            raise SpecError(
                "rdzv",
                f"static rendezvous needs a fixed node count, but --nodes is {self.nodes}; "
                "use --rdzv c10d or etcd for a range",
            )
        if self.rdzv is Rendezvous.ETCD:
            if not self.etcd_endpoints and not self.etcd_sidecar:
                raise SpecError(
                    "rdzv", "--rdzv etcd needs --etcd-endpoint HOST:PORT or --etcd-sidecar"
                )
            if self.etcd_endpoints and self.etcd_sidecar:
                raise SpecError(
                    "etcd_sidecar",
                    "--etcd-endpoint and --etcd-sidecar exclude each other; give one",
                )
        elif self.etcd_endpoints or self.etcd_sidecar:
            raise SpecError(
                "rdzv",
                f"etcd settings are given but --rdzv is {self.rdzv.value}; add --rdzv etcd",
            )
        for endpoint in self.etcd_endpoints:
            match = _ENDPOINT.fullmatch(endpoint)
            if not match or not 0 < int(match.group(2)) < 65536:
                raise SpecError(
                    "etcd_endpoint",
                    f"{endpoint!r} is not host:port with a port from 1 to 65535, e.g. etcd1:2379",
                )

    @property
    def effective_nproc_per_node(self) -> int:
        """Workers per node: as given, else one per GPU, else 1."""
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        return self.gpus_per_node or 1

    @property
    def effective_job_name(self) -> str:
        """The job name as given, else derived from the training command."""
        if self.job_name is not None:
            return self.job_name
        if self.entry_kind is EntryKind.MODULE:
            return self.entrypoint
        name = PurePath(self.entrypoint).name
        if self.entry_kind is EntryKind.SCRIPT and name.endswith(".py"):
            name = name[: -len(".py")]
        # The default lands in an #SBATCH line: keep it to one line.
        return re.sub(r"[\x00-\x1f\x7f]", "_", name) or "hpclaunch"

    def replace(self, **changes: object) -> JobSpec:
        """A copy with ``changes`` applied and validated again."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
