"""The batch-step supervisor's settings: the one contract between the rendered
script and ``hpclaunch supervise``. Each field with a row is an option of the
command (generated from it) and the script passes it as its row says. The defaults
here are the job spec's too. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpclaunch.contract.table import Flag, Folder, Number, Script, Texts, setting, to_argv

DEFAULT_MAX_REQUEUES = 3
# How long the supervisor gives the step after a signal, unless the script sets it.
DEFAULT_SUPERVISOR_GRACE_S = 90.0
# Requeues without bad nodes a job gets (preemptions and time limits do not count).
DEFAULT_MAX_FAILURE_REQUEUES = 2
# How long the supervisor keeps trying an unreachable slurmctld after a failed step.
DEFAULT_SLURM_PATIENCE_S = 300
# How long a stopped srun, agent or supervisor is waited for before the others act
# (hpclaunch.recovery.watch); at least two progress-note intervals.
DEFAULT_WATCH_TIMEOUT_S = 60
MIN_WATCH_TIMEOUT_S = 20


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
    # render's supervisor_settings cannot know, so render writes that option itself.
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
    watch_timeout_s: float = setting(
        float(DEFAULT_WATCH_TIMEOUT_S),
        "--watch-timeout",
        Number(float, min=MIN_WATCH_TIMEOUT_S),
        "Seconds after which a stopped srun, a silent agent or a silent supervisor is "
        "acted on (the supervisor passes it to the agents in its heartbeat).",
    )
    checkpoint_patterns: tuple[str, ...] = setting(
        (),
        "--checkpoint-pattern",
        Texts(),
        "A glob naming the job's own checkpoints (relative: to SLURM_SUBMIT_DIR), recorded "
        "for `hpclaunch status` (repeatable).",
    )

    def to_argv(self) -> list[str]:
        """The supervisor's options as the rendered script writes them (but --job-dir)."""
        return to_argv(self)
