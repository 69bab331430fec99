"""The agent's settings: what ``hpclaunch agent`` is asked for (``AgentSettings``), the
one contract between the rendered script and the agent on every node, with the closed
sets and defaults the job spec shares with it. Pure: no torch, no I/O.

The login node writes the settings into the script (``hpclaunch.job.render``); the
agent reads them back through options generated from the same rows
(``hpclaunch.cli.context.settings_options``) and plans its launch from them
(``hpclaunch.node.launch_plan``).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.contract import rendezvous
from hpclaunch.contract.table import (
    Choice,
    Flag,
    Flags,
    Folder,
    Name,
    Number,
    Parsed,
    Script,
    Text,
    setting,
    to_argv,
)
from hpclaunch.contract.values import HANG_AUTO, NodeRange

DEFAULT_MAX_RESTARTS = 3
DEFAULT_GRACE_PERIOD_S = 30  # after a signal is passed on, for the workers to exit


class EntryKind(enum.Enum):
    """What the training command is."""

    SCRIPT = "script"  # python SCRIPT ARGS...
    MODULE = "module"  # python -m MODULE ARGS...
    EXECUTABLE = "executable"  # EXECUTABLE ARGS... (--no-python)


class WorkerStart(enum.Enum):
    """How the agent starts python workers (an executable always starts fresh)."""

    WARM = "warm"  # forked from the agent's zygote, torch already imported
    FRESH = "fresh"  # a new interpreter each, as torchrun does


class RankOrder(enum.Enum):
    """How node ranks are laid out."""

    SLURM = "slurm"  # SLURM's node order, which a topology-aware scheduler chose
    TOPOLOGY = "topology"  # nodes under the same leaf switch get consecutive ranks


_ETCD_USER_HELP = (
    "etcd user; the password comes from --etcd-password-file or $HPCLAUNCH_ETCD_PASSWORD."
)
_ENTRY_FLAGS = Flags(
    {
        EntryKind.MODULE: (("-m", "--module"), "SCRIPT is a Python module name."),
        EntryKind.EXECUTABLE: (("--no-python",), "SCRIPT is an executable."),
    }
)


@dataclass(frozen=True)
class AgentSettings:
    """What ``hpclaunch agent`` was asked for. Each field with a row (``setting``) is
    an option of the command, generated from it, and the script passes it as its row
    says (``to_argv``); the training command (entrypoint, args) follows ``--``."""

    entrypoint: str
    args: tuple[str, ...] = ()
    nnodes: NodeRange | None = setting(
        None,
        "--nnodes",
        Parsed("nodes"),
        "N or MIN:MAX nodes. [default: the step's]",
        Script.ALWAYS,
    )
    nproc_per_node: int | None = setting(
        None,
        "--nproc-per-node",
        Number(int),
        "Workers on this node. "
        "[default: SLURM_GPUS_ON_NODE, else CUDA_VISIBLE_DEVICES' count, else 1]",
        Script.ALWAYS,
    )
    rdzv: str = setting(
        rendezvous.DEFAULT.name,
        "--rdzv",
        Name(tuple(rendezvous.BACKENDS)),
        "Rendezvous "
        "backend: static (fixed ranks from SLURM), c10d (a store on the first node) or etcd.",
        Script.ALWAYS,
    )
    max_restarts: int = setting(
        DEFAULT_MAX_RESTARTS,
        "--max-restarts",
        Number(int, min=0),
        "In-place restarts of this node's worker group.",
        Script.ALWAYS,
    )
    hang_timeout: str = setting(
        HANG_AUTO,
        "--hang-timeout",
        Parsed("hang_timeout"),
        "Seconds without training "
        "progress after which the workers count as hung (stacks saved, restart in place); "
        "auto: a multiple of the slowest step, with a floor; off.",
        Script.WHEN_SET,
    )
    checkpoint_timeout: str = setting(
        HANG_AUTO,
        "--checkpoint-timeout",
        Parsed("checkpoint_timeout"),
        "Seconds a save or load through hpclaunch.checkpoint may take before the workers "
        "count as hung; auto: a multiple of the job's slowest recent save, with a floor; off.",
        Script.WHEN_SET,
    )
    pause_timeout: str = setting(
        HANG_AUTO,
        "--pause-timeout",
        Parsed("pause_timeout"),
        "Seconds a pause of the script (hpclaunch.progress.paused) may last before the "
        "workers count as hung; auto: an hour; off.",
        Script.WHEN_SET,
    )
    first_step_timeout: str = setting(
        HANG_AUTO,
        "--first-step-timeout",
        Parsed("first_step_timeout"),
        "Seconds from an attempt's start to its first step before the workers count as "
        "hung; auto: on a node that stepped before, a multiple of the longest start seen, "
        "at least a load's bound (not watched before); off.",
        Script.WHEN_SET,
    )
    grace_period_s: float = setting(
        DEFAULT_GRACE_PERIOD_S,
        "--grace-period",
        Number(float, min=0),
        "Seconds the workers get to exit after a signal is passed on, before SIGKILL.",
        Script.ALWAYS,
    )
    node_multiple: int = setting(
        1,
        "--node-multiple",
        Number(int, min=1),
        "Run on a multiple of K nodes; the nodes beyond it stand by as spares.",
    )
    etcd_endpoints: tuple[str, ...] = setting(
        (),
        "--etcd-endpoint",
        Parsed("endpoints", ",".join),
        "etcd endpoints HOST:PORT[,HOST:PORT...] for --rdzv etcd.",
    )
    etcd_sidecar: bool = setting(
        False, "--etcd-sidecar", Flag(), "The first node starts an etcd server for the job."
    )
    etcd_binary: str | None = setting(
        None, "--etcd-binary", Text(), "The etcd server for --etcd-sidecar. [default: etcd on PATH]"
    )
    etcd_cacert: str | None = setting(
        None, "--etcd-cacert", Text(), "CA certificate of the etcd server (turns on TLS)."
    )
    etcd_cert: str | None = setting(
        None, "--etcd-cert", Text(), "Client certificate for etcd (with --etcd-key)."
    )
    etcd_key: str | None = setting(None, "--etcd-key", Text(), "Client certificate key for etcd.")
    etcd_user: str | None = setting(None, "--etcd-user", Text(), _ETCD_USER_HELP)
    etcd_password_file: str | None = setting(
        None, "--etcd-password-file", Text(), "File whose first line is the etcd password."
    )
    etcd_outage_timeout: float | None = setting(
        None,
        "--etcd-outage-timeout",
        Number(float, min=0),
        "Seconds a running job waits for an unreachable etcd before it fails. [default: 120]",
    )
    master_addr: str | None = setting(
        None,
        "--master-addr",
        Text(),
        "Address of the first node. [default: its name, or its NodeAddr]",
        Script.NEVER,
    )
    master_port: int | None = setting(
        None,
        "--master-port",
        Number(int, min=1, max=65535),
        "Rendezvous port. [default: 15000 + job id % 10000]",
        Script.WHEN_SET,
    )
    rank_order: RankOrder = setting(
        RankOrder.SLURM,
        "--rank-order",
        Choice(RankOrder),
        "topology: nodes under one leaf switch get consecutive ranks.",
        Script.NEVER,
    )
    job_dir: Path | None = setting(
        None,
        "--job-dir",
        Folder(),
        "Job folder; per-rank logs go to its logs/. "
        "[default: $HPCLAUNCH_JOB_DIR, else hpclaunch-logs/JOBID]",
        Script.NEVER,
    )
    tee: bool = setting(
        True,
        "--tee",
        Flag(off="--no-tee"),
        "Also copy every rank's output to the agent's, each line prefixed [rankN].",
        Script.NEVER,
    )
    worker_start: WorkerStart = setting(
        WorkerStart.WARM,
        "--worker-start",
        Choice(WorkerStart),
        "warm: python workers are forked from a copy of the agent that has imported "
        "torch (fast launch and restart); fresh: a new interpreter each, as torchrun does.",
        Script.NEVER,
    )
    supervised: bool = setting(
        False,
        "--supervised",
        Flag(),
        "Set by the rendered script when the supervisor runs the step.",
    )
    no_kill: bool = setting(
        False,
        "--no-kill",
        Flag(),
        "Set by the rendered script for sbatch --no-kill: when "
        "the batch host is lost, a surviving agent ends or requeues the job.",
    )
    entry_kind: EntryKind = setting(EntryKind.SCRIPT, "--module", _ENTRY_FLAGS, "What SCRIPT is.")
    # How long the agent waits for a worker's exit between its other checks.
    monitor_interval_s: float = 0.1

    def to_argv(self) -> list[str]:
        """The agent's options as the rendered script writes them (before ``--``)."""
        return to_argv(self)

    @property
    def shutdown_timeout_s(self) -> int:
        """--grace-period as the whole seconds torch's shutdown timeout takes (rounded
        up, so that a grace period given stays one)."""
        return math.ceil(self.grace_period_s)
