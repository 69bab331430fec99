"""The worker environment users rely on: what hpclaunch adds to the variables torchrun
sets, declared once (``WORKER_VARS``) with the one builder of the agent's part
(``build``). docs/agent.md's table lists the same names, and a test keeps them alike.

Pure: no torch, no I/O. The names are imported from here by everything that sets or
reads them: the agent, the rendered script, the job folder, the supervisor and the
worker API.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import NamedTuple

JOB_ID = "HPCLAUNCH_JOB_ID"
REQUEUE_COUNT = "HPCLAUNCH_REQUEUE_COUNT"
NODE_RANK = "HPCLAUNCH_NODE_RANK"
ATTEMPT = "HPCLAUNCH_ATTEMPT"
JOB_DIR = "HPCLAUNCH_JOB_DIR"
# Where the job folders are (LOG_DIR/JOBID) unless the job names a log folder: sbatch's
# default, and the agent's where JOB_DIR is not set.
DEFAULT_LOG_DIR = "hpclaunch-logs"
CHECKPOINT_DIR = "HPCLAUNCH_CHECKPOINT_DIR"
LOCAL_CHECKPOINT_DIR = "HPCLAUNCH_LOCAL_CHECKPOINT_DIR"
PROGRESS_FILE = "HPCLAUNCH_PROGRESS_FILE"
STACKS_FILE = "HPCLAUNCH_STACKS_FILE"
WATCHER_PID = "HPCLAUNCH_WATCHER_PID"
# The submission's stamp (nanoseconds), which hpclaunch sbatch puts into sbatch's
# environment and SLURM passes on to the job; the agent keys its node-local folder
# with it (hpclaunch.node.local_folder). Not one of the workers' variables.
SUBMITTED = "HPCLAUNCH_SUBMITTED"


class SetBy(enum.Enum):
    """Who puts a variable into the workers' environment."""

    AGENT = "agent"  # each node's agent, for every attempt's workers
    SCRIPT = "script"  # the rendered sbatch script exports it; workers inherit it
    WATCH = "watch"  # the agent's hang watch, one for each worker (hpclaunch.node.hangs)


class WorkerVar(NamedTuple):
    """One variable of the worker environment, as docs/agent.md describes it."""

    name: str
    set_by: SetBy
    meaning: str


WORKER_VARS: tuple[WorkerVar, ...] = (
    WorkerVar(JOB_ID, SetBy.AGENT, "the SLURM job id"),
    WorkerVar(REQUEUE_COUNT, SetBy.AGENT, "SLURM_RESTART_COUNT, or 0 on the first run"),
    WorkerVar(NODE_RANK, SetBy.AGENT, "this node's rank (as GROUP_RANK)"),
    WorkerVar(ATTEMPT, SetBy.AGENT, "the job-wide attempt (rendezvous round) of this run"),
    WorkerVar(JOB_DIR, SetBy.SCRIPT, "the job folder, LOG_DIR/JOBID"),
    WorkerVar(CHECKPOINT_DIR, SetBy.SCRIPT, "where hpclaunch.checkpoint saves"),
    WorkerVar(
        LOCAL_CHECKPOINT_DIR,
        SetBy.AGENT,
        "this node's folder for checkpoint.save(local_copy=True), in node memory "
        "(/dev/shm); the agent removes it when it exits",
    ),
    WorkerVar(PROGRESS_FILE, SetBy.WATCH, "where the worker reports its progress"),
    WorkerVar(STACKS_FILE, SetBy.WATCH, "where the worker writes its stacks when asked"),
    WorkerVar(WATCHER_PID, SetBy.WATCH, "the agent's pid, allowed to read the worker's stacks"),
)


def build(
    job_id: int,
    requeue_count: int,
    node_rank: int,
    attempt: int | None,
    backend_vars: Mapping[str, str],
    local_checkpoints: str,
) -> dict[str, str]:
    """The agent's part of the worker environment (``SetBy.AGENT``), then what the
    rendezvous backend needs (``backend_vars``). ``attempt`` None: before any round
    (what ``hpclaunch agent --dry-run`` shows), so no ``HPCLAUNCH_ATTEMPT``."""
    env = {
        JOB_ID: str(job_id),
        REQUEUE_COUNT: str(requeue_count),
        NODE_RANK: str(node_rank),
        LOCAL_CHECKPOINT_DIR: local_checkpoints,
    }
    if attempt is not None:
        env[ATTEMPT] = str(attempt)
    return {**env, **backend_vars}


# SLURM's per-task variables. srun starts one task per node, the agent, so in a worker
# they would describe the agent: SLURM_PROCID the node's rank, SLURM_NTASKS the number
# of nodes. SLURM-aware code in the worker (Lightning's SLURMEnvironment, submitit's
# JobEnvironment) would take those for its own rank and world. Each worker gets its own
# view instead; the agent's values stay under AGENT_PREFIX + the name.
AGENT_PREFIX = "HPCLAUNCH_AGENT_"
SLURM_TASK_VARS = (
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_GTIDS",
    "SLURM_NODEID",
    "SLURM_NNODES",
    "SLURM_STEP_NUM_NODES",
)


def slurm_task_view(
    agent_env: Mapping[str, str],
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    node_rank: int,
    nodes: int,
    node_ranks: list[int],
) -> dict[str, str]:
    """The SLURM task variables of one worker: what srun would have set had it started
    every worker as a task (``rank`` of ``world_size``, ``local_rank`` of
    ``local_world_size`` on node ``node_rank`` of the round's ``nodes``; this node's ranks
    ``node_ranks``), and the agent's own values of them under AGENT_PREFIX. The node's
    rank and count are the round's, as GROUP_RANK says: they differ from SLURM's with
    --rank-order topology, spare nodes or a lost node. None outside a SLURM task (no
    SLURM_PROCID in ``agent_env``)."""
    if "SLURM_PROCID" not in agent_env:
        return {}
    per_node = f"{local_world_size}(x{nodes})" if nodes > 1 else str(local_world_size)
    values = (
        rank,
        local_rank,
        world_size,
        world_size,
        world_size,
        local_world_size,
        per_node,
        per_node,
        ",".join(str(r) for r in node_ranks),
        node_rank,
        nodes,
        nodes,
    )
    view = {name: str(value) for name, value in zip(SLURM_TASK_VARS, values, strict=True)}
    kept = {AGENT_PREFIX + name: agent_env[name] for name in SLURM_TASK_VARS if name in agent_env}
    return {**view, **kept}


# accelerate's Accelerator() on a node without GPUs runs one training per rank, each on
# its own (num_processes 1 everywhere), unless told to use the CPU: then it is one world
# over gloo. torchrun leaves that to the user; the agent sets it where no GPU is there.
ACCELERATE_USE_CPU = "ACCELERATE_USE_CPU"
_NO_DEVICES = ("", "-1", "NoDevFiles")


def has_gpu(env: Mapping[str, str], gpu_devices: Sequence[str]) -> bool:
    """Whether the job has a GPU on this node: SLURM gave it some, CUDA_VISIBLE_DEVICES
    names some, or (neither said) the node has GPU device files (``gpu_devices``:
    /dev/nvidia0..., /dev/kfd). Pure."""
    gpus = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if (gpus and gpus != "0") or env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS"):
        return True
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return visible.strip() not in _NO_DEVICES
    return bool(gpu_devices)


def framework_env(env: Mapping[str, str], gpu_devices: Sequence[str]) -> dict[str, str]:
    """What frameworks need to be distributed on this node, unless set already:
    ACCELERATE_USE_CPU=1 where the job has no GPU (see has_gpu). Pure."""
    if ACCELERATE_USE_CPU in env or has_gpu(env, gpu_devices):
        return {}
    return {ACCELERATE_USE_CPU: "1"}


# Lightning's Trainer takes a default for each argument from PL_TRAINER_<NAME>. Its own
# defaults count one device on one node: then every rank of a larger launch trains a
# model of its own (a single-device strategy, no error), or, with strategy="ddp",
# Lightning refuses the launch. An argument passed to Trainer(...) still wins.
LIGHTNING_SIZE = ("PL_TRAINER_NUM_NODES", "PL_TRAINER_DEVICES")


def lightning_size(env: Mapping[str, str], *, nodes: int, local_world_size: int) -> dict[str, str]:
    """PL_TRAINER_NUM_NODES and PL_TRAINER_DEVICES for this launch, unless set. Pure."""
    size = dict(zip(LIGHTNING_SIZE, (str(nodes), str(local_world_size)), strict=True))
    return {name: value for name, value in size.items() if name not in env}
