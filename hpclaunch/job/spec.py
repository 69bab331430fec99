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
from dataclasses import dataclass
from datetime import timedelta
from pathlib import PurePath
from typing import Any

from hpclaunch.contract import values
from hpclaunch.contract.agent import DEFAULT_MAX_RESTARTS, EntryKind
from hpclaunch.contract.rendezvous import C10dRdzv, EtcdRdzv, Rendezvous, choices, elastic_names
from hpclaunch.contract.supervisor import (
    DEFAULT_MAX_FAILURE_REQUEUES,
    DEFAULT_MAX_REQUEUES,
    DEFAULT_SLURM_PATIENCE_S,
    DEFAULT_WATCH_TIMEOUT_S,
    MIN_WATCH_TIMEOUT_S,
)
from hpclaunch.contract.values import NodeRange
from hpclaunch.contract.worker_env import DEFAULT_LOG_DIR
from hpclaunch.errors import SpecError
from hpclaunch.job import paths
from hpclaunch.job.managed import MANAGED_SBATCH_OPTIONS
from hpclaunch.job.values import check_checkpoint_pattern, format_time, parse_mem

DEFAULT_SIGNAL_LEAD_S = 120
ONE_NODE = NodeRange(1, 1)
# SLURM stores the --signal lead time in 16 bits.
MAX_SIGNAL_LEAD_S = 0xFFFF

# srun options the rendered step sets itself (one agent task per node).
MANAGED_SRUN_OPTIONS = frozenset(
    {"nodes", "N", "ntasks", "n", "ntasks-per-node", "kill-on-bad-exit", "K", "cpus-per-task", "c"}
)

# Compiled on first use (re's own cache): a spec without env or options needs neither.
_SHELL_NAME = r"[A-Za-z_][A-Za-z0-9_]*\Z"
_OPTION_NAME = r"[A-Za-z][A-Za-z0-9-]*\Z"


class GpuDirective(enum.Enum):
    """How GPUs are requested: some clusters accept only ``--gres=gpu:G``."""

    GPUS_PER_NODE = "gpus-per-node"
    GRES = "gres"


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


MAX_PORT = 65535


def _check_count(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(name, f"{value!r} is not a whole number")
    if value < minimum:
        raise SpecError(name, f"{value} is below the minimum of {minimum}; give {minimum} or more")


class EtcdSetting:
    """A read-only JobSpec attribute ``etcd_NAME``: the etcd rendezvous' ``NAME``,
    or its default under another backend. Templates and scripts were written against
    these flat names (docs/templates.md lists them)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._attr = name.removeprefix("etcd_")

    def __get__(self, spec: Any, owner: type | None = None) -> Any:
        if spec is None:
            return self
        if isinstance(spec.rdzv, EtcdRdzv):
            return getattr(spec.rdzv, self._attr)
        return next(f.default for f in dataclasses.fields(EtcdRdzv) if f.name == self._attr)


@dataclass(frozen=True)
class JobSpec:
    """A complete, validated description of one hpclaunch job.

    Construct it directly (the Python API), or through ``hpclaunch.job.profiles``
    (CLI flags and profiles). Raises SpecError on any invalid value.
    """

    entrypoint: str
    args: tuple[str, ...] = ()
    entry_kind: EntryKind = EntryKind.SCRIPT
    nodes: NodeRange = ONE_NODE
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
    # Continue from the checkpoints an ended job left in checkpoint_dir (see
    # hpclaunch.checkpoint.sharing); without it such a folder is refused.
    adopt_checkpoints: bool = False
    # Globs naming checkpoints the job writes its own way, for `hpclaunch status`.
    checkpoint_patterns: tuple[str, ...] = ()
    max_restarts: int = DEFAULT_MAX_RESTARTS
    hang_timeout: str = values.HANG_AUTO  # seconds without progress, auto or off (node.hangs)
    # The bounds of the stretches between steps, in the same words (node.hangs.Bounds).
    checkpoint_timeout: str = values.HANG_AUTO
    pause_timeout: str = values.HANG_AUTO
    first_step_timeout: str = values.HANG_AUTO
    max_requeues: int = DEFAULT_MAX_REQUEUES
    max_failure_requeues: int = DEFAULT_MAX_FAILURE_REQUEUES
    signal_lead_s: int = DEFAULT_SIGNAL_LEAD_S
    slurm_patience_s: int = DEFAULT_SLURM_PATIENCE_S
    watch_timeout_s: int = DEFAULT_WATCH_TIMEOUT_S  # hpclaunch.recovery.watch
    rdzv: Rendezvous = C10dRdzv()  # noqa: RUF009 - frozen, so one shared default is safe
    no_kill: bool = False
    node_multiple: int = 1
    master_port: int | None = None  # None: 15000 + job id % 10000
    template: str | None = None
    gpu_directive: GpuDirective = GpuDirective.GPUS_PER_NODE
    sbatch_options: tuple[tuple[str, str | None], ...] = ()
    srun_options: tuple[tuple[str, str | None], ...] = ()
    setup: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    launcher: tuple[str, ...] = ("hpclaunch",)

    # The etcd settings under their flat names, read-only, for templates (not fields).
    etcd_endpoints = EtcdSetting()
    etcd_sidecar = EtcdSetting()
    etcd_binary = EtcdSetting()
    etcd_cacert = EtcdSetting()
    etcd_cert = EtcdSetting()
    etcd_key = EtcdSetting()
    etcd_user = EtcdSetting()
    etcd_password_file = EtcdSetting()
    etcd_outage_timeout = EtcdSetting()

    @property
    def agent_grace_s(self) -> int:
        """How long each agent gives its workers after passing a signal on."""
        return values.agent_grace_for(self.signal_lead_s)

    def __post_init__(self) -> None:
        for name in ("args", "setup", "launcher", "env", "checkpoint_patterns"):
            if not isinstance(getattr(self, name), tuple):
                raise SpecError(
                    name, f"{getattr(self, name)!r} is not a tuple; give a tuple of strings"
                )
        self._check_entrypoint()
        _check_count("gpus_per_node", self.gpus_per_node, 0)
        if self.nproc_per_node is not None:
            _check_count("nproc_per_node", self.nproc_per_node, 1)
        if self.cpus_per_task is not None:
            _check_count("cpus_per_task", self.cpus_per_task, 1)
        _check_count("max_restarts", self.max_restarts, 0)
        for field in values.TimeoutField:
            text = getattr(self, field.value)
            object.__setattr__(self, field.value, values.parse_timeout(text, field))
        _check_count("max_requeues", self.max_requeues, 0)
        _check_count("max_failure_requeues", self.max_failure_requeues, 0)
        if self.master_port is not None:
            _check_count("master_port", self.master_port, 1)
            if self.master_port > MAX_PORT:
                raise SpecError(
                    "master_port", f"{self.master_port} is above {MAX_PORT}; give a free TCP port"
                )
        _check_count("slurm_patience", self.slurm_patience_s, 0)
        _check_count("watch_timeout", self.watch_timeout_s, MIN_WATCH_TIMEOUT_S)
        self._check_signal_lead()
        for name in ("partition", "account", "qos", "constraint", "exclude", "job_name"):
            value = getattr(self, name)
            if value is not None:
                _check_text(name, value, one_line=True)
                if not value.strip():
                    raise SpecError(name, f"{value!r} is empty; leave it out or give a value")
        if self.job_name is not None and "/" in self.job_name:
            raise SpecError(
                "job_name",
                f"{self.job_name!r} contains '/'; SLURM puts the job name into the log file "
                "name (%x), which would then point into a folder that does not exist: "
                "use another character such as '-'",
            )
        paths.check_job_name(self.effective_job_name, given=self.job_name is not None)
        if self.mem is not None:
            parse_mem(self.mem)
        _check_text("log_dir", self.log_dir, one_line=True)
        if not self.log_dir:
            raise SpecError("log_dir", "the log folder is empty; give a path")
        if "\\" in self.log_dir:
            raise SpecError(
                "log_dir",
                f"{self.log_dir!r} contains a backslash, which makes SLURM ignore the %x and "
                "%j patterns of the log file name; choose a folder without one",
            )
        paths.check_components("log_dir", self.log_dir)
        if self.checkpoint_dir is not None:
            _check_text("checkpoint_dir", self.checkpoint_dir, one_line=False)
            paths.check_components("checkpoint_dir", self.checkpoint_dir)
        for pattern in self.checkpoint_patterns:
            _check_text("checkpoint_patterns", pattern, one_line=True)
            check_checkpoint_pattern(pattern)
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

    def _check_signal_lead(self) -> None:
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
                also=("time",),
            )

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
            if not re.match(_SHELL_NAME, key):
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
            if not re.match(_OPTION_NAME, key):
                raise SpecError(
                    name,
                    f"{key!r} is not an option name; write it without leading dashes, "
                    "e.g. exclusive or mail-type=END",
                )
            if sbatch and key in MANAGED_SBATCH_OPTIONS:
                raise SpecError(
                    name,
                    f"{key!r} is set by hpclaunch itself; {MANAGED_SBATCH_OPTIONS[key]}",
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
        if not isinstance(self.rdzv, Rendezvous):
            raise SpecError(
                "rdzv",
                f"{self.rdzv!r} is not rendezvous settings; give StaticRdzv(), C10dRdzv() "
                f"or EtcdRdzv(...) from hpclaunch (the names {choices()} are for profiles "
                "and flags)",
            )
        if self.rdzv.fixed_ranks and self.nodes.is_elastic:
            raise SpecError(
                "rdzv",
                f"{self.rdzv} rendezvous needs a fixed node count, but --nodes is {self.nodes}; "
                f"use --rdzv {elastic_names()} for a range",
                also=("nodes",),
            )
        _check_count("node_multiple", self.node_multiple, 1)
        if self.node_multiple > 1:
            if self.rdzv.fixed_ranks:
                raise SpecError(
                    "node_multiple",
                    f"--node-multiple needs the rounds of --rdzv {elastic_names()}, "
                    f"not {self.rdzv}",
                    also=("rdzv",),
                )
            if self.nodes.multiples(self.node_multiple) is None:
                raise SpecError(
                    "node_multiple",
                    f"no node count in --nodes {self.nodes} is a multiple of "
                    f"{self.node_multiple}; widen the range or change --node-multiple",
                    also=("nodes",),
                )
        if self.no_kill and not self.nodes.is_elastic:
            raise SpecError(
                "no_kill",
                f"--no-kill keeps the job going on fewer nodes, but --nodes is {self.nodes}; "
                "give a range MIN:MAX",
                also=("nodes",),
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
