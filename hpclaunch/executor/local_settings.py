"""What ``hpclaunch.Executor(cluster="local")`` hands its local node: a JSON file,
so that no value goes through a command line. Imported by the executor and by
``hpclaunch.executor.local_node``, which runs as ``__main__``."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from hpclaunch import checkpoint
from hpclaunch.job.spec import JobSpec

# submitit's local controller runs a task 6 times at most: 5 requeues.
CONTROLLER_MAX_RUNS = 6


@dataclass(frozen=True)
class LocalSettings:
    """The JobSpec's values that one node on this machine uses."""

    nproc_per_node: int
    max_restarts: int
    max_requeues: int
    grace_period_s: int
    log_dir: str
    checkpoint_dir: str | None
    env: dict[str, str]
    adopt_checkpoints: bool = False
    master_port: int | None = None  # None: derived from the job id

    @classmethod
    def of(cls, spec: JobSpec, cwd: Path) -> LocalSettings:
        def absolute(path: str) -> str:
            return str(cwd / os.path.expanduser(path))  # an absolute path stays as it is

        # SUBMITIT_EXECUTOR=slurm is for the SLURM script; the controller sets "local".
        env = {key: value for key, value in spec.env if key != "SUBMITIT_EXECUTOR"}
        return cls(
            nproc_per_node=spec.effective_nproc_per_node,
            max_restarts=spec.max_restarts,
            max_requeues=min(spec.max_requeues, CONTROLLER_MAX_RUNS - 1),
            grace_period_s=spec.agent_grace_s,
            log_dir=absolute(spec.log_dir),
            checkpoint_dir=absolute(spec.checkpoint_dir) if spec.checkpoint_dir else None,
            env=env,
            adopt_checkpoints=spec.adopt_checkpoints,
            master_port=spec.master_port,
        )

    def write(self, path: Path) -> None:
        raw = (json.dumps(asdict(self), indent=2) + "\n").encode()
        checkpoint.write_atomic(path, lambda handle: handle.write(raw), replace=True)

    @classmethod
    def read(cls, path: Path) -> LocalSettings:
        return cls(**json.loads(path.read_text()))
