"""The batch-step supervisor's settings: the one contract between the rendered
script and ``hpclaunch supervise``. Each field with a row is an option of the
command (generated from it) and the script passes it as its row says. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpclaunch.job.contract import Flag, Folder, Number, Script, Texts, setting, to_argv
from hpclaunch.job.spec import (
    DEFAULT_MAX_FAILURE_REQUEUES,
    DEFAULT_MAX_REQUEUES,
    DEFAULT_SLURM_PATIENCE_S,
    DEFAULT_SUPERVISOR_GRACE_S,
)

if TYPE_CHECKING:
    from hpclaunch.job.spec import JobSpec


@dataclass(frozen=True)
class SupervisorSettings:
    """What ``hpclaunch supervise`` was asked for."""

    max_requeues: int = setting(
        DEFAULT_MAX_REQUEUES,
        "--max-requeues",
        Number(int, min=0),
        "Requeue budget of the job: requeues after it give up (exit status 4).",
        Script.ALWAYS,
    )
    # The script passes the folder it exports, "$HPCLAUNCH_JOB_DIR": shell that
    # from_spec cannot know, so render writes that option itself.
    job_dir: Path | None = setting(
        None, "--job-dir", Folder(), "The job's folder: history.json goes there.", Script.NEVER
    )
    grace_period_s: float = setting(
        DEFAULT_SUPERVISOR_GRACE_S,
        "--grace-period",
        Number(float, min=0),
        "Seconds the step gets to end after a signal before srun is killed.",
        Script.ALWAYS,
    )
    max_failure_requeues: int = setting(
        DEFAULT_MAX_FAILURE_REQUEUES,
        "--max-failure-requeues",
        Number(int, min=0),
        "Requeues without bad nodes the job gets (preemptions and time limits do not count).",
    )
    adopt_checkpoints: bool = setting(
        False,
        "--adopt-checkpoints",
        Flag(),
        "Continue from the checkpoints an ended job left in HPCLAUNCH_CHECKPOINT_DIR.",
    )
    slurm_patience_s: float = setting(
        float(DEFAULT_SLURM_PATIENCE_S),
        "--slurm-patience",
        Number(float, min=0),
        "Seconds to keep trying an unreachable SLURM controller after a failed step "
        "(after a signal: --grace-period from the signal).",
    )
    checkpoint_patterns: tuple[str, ...] = setting(
        (),
        "--checkpoint-pattern",
        Texts(),
        "A glob naming the job's own checkpoints (relative: to SLURM_SUBMIT_DIR), recorded "
        "for `hpclaunch status` (repeatable).",
    )

    @classmethod
    def from_spec(cls, spec: JobSpec) -> SupervisorSettings:
        """The settings the rendered script gives the supervisor for ``spec``: the
        step gets the whole signal lead to end after SLURM's warning."""
        return cls(
            max_requeues=spec.max_requeues,
            grace_period_s=spec.signal_lead_s,
            max_failure_requeues=spec.max_failure_requeues,
            adopt_checkpoints=spec.adopt_checkpoints,
            slurm_patience_s=float(spec.slurm_patience_s),
            checkpoint_patterns=spec.checkpoint_patterns,
        )

    def to_argv(self) -> list[str]:
        """The supervisor's options as the rendered script writes them (but --job-dir)."""
        return to_argv(self)
