"""One node on this machine, without SLURM: what ``hpclaunch.Executor(cluster="local")``
runs under submitit's local controller.

``python -m hpclaunch.executor.local_node FOLDER SETTINGS`` starts the workers of
the pickled call in FOLDER through the same agent code as ``hpclaunch agent``
(torch's elastic agent, hpclaunch's rank logs and failure records), with the job
id submitit's controller gives and the rendezvous on 127.0.0.1. SETTINGS is the
JSON file the executor wrote (``LocalSettings``). The job folder is
``LOG_DIR/JOBID``.

The time limit follows hpclaunch's protocol as far as one machine allows: the
controller's warning signal stops the workers (they checkpoint), and while
requeues are left the controller runs the node again, which resumes from the
checkpoint; the requeue count goes where SLURM's would (HPCLAUNCH_REQUEUE_COUNT,
the logs' ``requeue-N``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from pathlib import Path

from hpclaunch import checkpoint
from hpclaunch.contract.agent import AgentSettings, EntryKind
from hpclaunch.contract.rendezvous import C10dRdzv
from hpclaunch.executor.local_settings import LocalSettings
from hpclaunch.jobdir import modes
from hpclaunch.jobdir.layout import JOB_DIR_VAR, JobFolder
from hpclaunch.record.job_record import read_run
from hpclaunch.slurm.env import NodeContext, derive_port

LOOPBACK = "127.0.0.1"
JOB_ID_VAR = "SUBMITIT_LOCAL_JOB_ID"
# submitit's local controller: the exit status that asks it to run the task again,
# how often it does at most, and the signal it sends before the time limit.
REQUEUE_STATUS = 144
TIME_LIMIT_SIGNAL = signal.SIGUSR2
log = logging.getLogger("hpclaunch.executor")


def _requeues(job: JobFolder) -> int:
    try:
        return int(job.local_requeues.read_text())
    except (OSError, ValueError):
        return 0


def _claim_checkpoints(folder: Path, job_id: int, settings: LocalSettings) -> int | None:
    """Take the checkpoint folder for this job, as the supervisor does on SLURM: None
    when it is this job's now, else the exit status (why is logged)."""
    from hpclaunch.checkpoint import claim
    from hpclaunch.errors import HpclaunchError
    from hpclaunch.slurm.commands import Slurm

    me = claim.local_job(str(job_id))
    try:
        said = claim.take(folder, me, adopt=settings.adopt_checkpoints, slurm=Slurm())
    except HpclaunchError as exc:
        log.error("%s", exc)
        return int(exc.exit_code)
    if said:
        log.info("%s", said)
    return None


def main(argv: list[str] | None = None) -> int:
    from hpclaunch.executor.params import WORKER_MODULE
    from hpclaunch.node import agent, launch_plan

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m hpclaunch.executor.local_node FOLDER SETTINGS", file=sys.stderr)
        return 2
    folder, settings_path = Path(args[0]), Path(args[1])
    settings = LocalSettings.read(settings_path)
    job_id = int(os.environ[JOB_ID_VAR])
    job = JobFolder.of(settings.log_dir, job_id)
    job_dir = job.root
    modes.make_dirs(job_dir, modes.folder_mode(os.environ))  # the owner's: jobdir.modes
    requeue = _requeues(job)
    logging.basicConfig(
        level=logging.INFO, format=f"hpclaunch[local job {job_id}]: %(message)s", force=True
    )
    ctx = NodeContext(
        job_id=job_id,
        node_rank=0,
        hosts=(socket.gethostname(),),
        restart_count=requeue,
        nproc_per_node=settings.nproc_per_node,
        nproc_source="nproc_per_node",
        master_port=settings.master_port or derive_port(job_id),
    )
    opts = AgentSettings(
        entrypoint=WORKER_MODULE,
        args=(str(folder),),
        entry_kind=EntryKind.MODULE,
        nproc_per_node=settings.nproc_per_node,
        rdzv=C10dRdzv.name,
        max_restarts=settings.max_restarts,
        job_dir=job_dir,
        grace_period_s=settings.grace_period_s,
        # Supervised: the agent leaves its root-cause block in the job folder, where
        # job.result() reads it; it is printed below too, as the supervisor would.
        supervised=True,
    )
    # This process is the job's agent: its environment is what torch gives the
    # workers, as the rendered script's exports are on SLURM. Values set here
    # replace inherited ones (a driver running inside another job has its own).
    os.environ.update(settings.env)
    os.environ.update(
        {
            JOB_DIR_VAR: str(job_dir),
            checkpoint.ENV_VAR: settings.checkpoint_dir or str(job.checkpoints),
        }
    )
    refused = _claim_checkpoints(Path(os.environ[checkpoint.ENV_VAR]), job_id, settings)
    if refused is not None:
        settings_path.unlink(missing_ok=True)
        return refused
    launch = launch_plan.launch_settings(ctx, opts, LOOPBACK, LOOPBACK)
    status = agent.launch(ctx, opts, launch, os.environ)
    if status == 128 + TIME_LIMIT_SIGNAL:
        if requeue < settings.max_requeues:
            job.local_requeues.write_text(f"{requeue + 1}\n")
            log.info("time limit: requeue %d of %d", requeue + 1, settings.max_requeues)
            return REQUEUE_STATUS
        log.error(
            "time limit reached with no requeue left (max_requeues=%d); no result",
            settings.max_requeues,
        )
    for _, block in read_run(job.root, requeue).root_causes:
        sys.stderr.write(block)
    settings_path.unlink(missing_ok=True)  # the job is over: no further run reads it
    return status


if __name__ == "__main__":
    sys.exit(main())
