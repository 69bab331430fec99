"""One node on this machine, without SLURM: what ``hpclaunch.Executor(cluster="local")``
runs under submitit's local controller.

``python -m hpclaunch.executor.local_node --nproc-per-node P --max-restarts R FOLDER``
starts P workers of the pickled call in FOLDER through the same agent code as
``hpclaunch agent`` (torch's elastic agent, hpclaunch's rank logs and failure
records), with the job id submitit's controller gives and the rendezvous on
127.0.0.1. The job folder is ``FOLDER/JOBID``.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path

from hpclaunch import failures
from hpclaunch.context import NodeContext, derive_port
from hpclaunch.spec import EntryKind, Rendezvous

LOOPBACK = "127.0.0.1"
JOB_ID_VAR = "SUBMITIT_LOCAL_JOB_ID"


def main(argv: list[str] | None = None) -> int:
    from hpclaunch import agent
    from hpclaunch.executor.params import WORKER_MODULE

    parser = argparse.ArgumentParser(prog="python -m hpclaunch.executor.local_node")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--max-restarts", type=int, required=True)
    parser.add_argument("--grace-period", type=int, required=True)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    job_id = int(os.environ[JOB_ID_VAR])
    job_dir = args.folder / str(job_id)
    ctx = NodeContext(
        job_id=job_id, node_rank=0, hosts=(socket.gethostname(),), restart_count=0,
        nproc_per_node=args.nproc_per_node, nproc_source="nproc_per_node",
        master_port=derive_port(job_id),
    )  # fmt: skip
    opts = agent.AgentOptions(
        entrypoint=WORKER_MODULE, args=(str(args.folder),), entry_kind=EntryKind.MODULE,
        nproc_per_node=args.nproc_per_node, rdzv=Rendezvous.C10D,
        max_restarts=args.max_restarts, job_dir=job_dir, grace_period_s=args.grace_period,
    )  # fmt: skip
    os.environ.setdefault("HPCLAUNCH_JOB_DIR", str(job_dir))
    os.environ.setdefault("HPCLAUNCH_CHECKPOINT_DIR", str(job_dir / "checkpoints"))
    logging.basicConfig(
        level=logging.INFO, format=f"hpclaunch[local job {job_id}]: %(message)s", force=True
    )
    # Supervised: the agent leaves its root-cause block in the job folder, where
    # job.result() reads it; it is printed here too, as the supervisor would.
    os.environ[failures.SUPERVISED_VAR] = "1"
    settings = agent.launch_settings(ctx, opts, LOOPBACK, LOOPBACK)
    status = agent.launch(ctx, opts, settings, os.environ)
    for block in sorted(failures.folder(job_dir, 0).glob("root-cause-*.txt")):
        sys.stderr.write(block.read_text())
    return status


if __name__ == "__main__":
    sys.exit(main())
