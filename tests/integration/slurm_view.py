"""A worker that writes what submitit's JobEnvironment (SLURM-aware code in a worker)
makes of its SLURM variables, next to torch's, to FOLDER/rank-R.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import submitit

# What submitit's own sbatch script exports: its JobEnvironment reads SLURM's variables.
os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")
env = submitit.JobEnvironment()
seen = {
    "rank": int(os.environ["RANK"]),
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "world_size": int(os.environ["WORLD_SIZE"]),
    "node_rank": int(os.environ["GROUP_RANK"]),
    "submitit": [env.global_rank, env.local_rank, env.num_tasks, env.node, env.num_nodes],
    "agent_procid": os.environ.get("HPCLAUNCH_AGENT_SLURM_PROCID"),
}
Path(sys.argv[1], f"rank-{seen['rank']}.json").write_text(json.dumps(seen))
