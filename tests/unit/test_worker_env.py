"""The worker environment is declared once (hpclaunch.contract.worker_env): the agent's
builder, the rendered script and docs/agent.md all say the same variables."""

from __future__ import annotations

import re
from pathlib import Path

from hpclaunch.contract import worker_env
from hpclaunch.contract.worker_env import WORKER_VARS, SetBy
from hpclaunch.job.render import render
from hpclaunch.job.spec import JobSpec
from hpclaunch.node.launch_plan import worker_env as agent_worker_env
from hpclaunch.slurm.env import NodeContext

DOCS = Path(__file__).resolve().parents[2] / "docs" / "agent.md"
CTX = NodeContext(
    job_id=66,
    node_rank=1,
    hosts=("n1", "n2"),
    restart_count=2,
    nproc_per_node=2,
    nproc_source="--nproc-per-node",
    master_port=15066,
)
LOCAL = Path("/dev/shm/hpclaunch-u1000-c-66-1-2-n2")


def _documented() -> set[str]:
    text = DOCS.read_text()
    section = text[text.index("## The worker environment") :]
    table = section[: section.index("\n\n", section.index("| variable |"))]
    return {name for name in re.findall(r"`(HPCLAUNCH_[A-Z_]+)`", table)}


def test_docs_list_every_hpclaunch_variable_and_no_other() -> None:
    assert _documented() == {var.name for var in WORKER_VARS}


def test_the_agent_sets_its_variables_for_each_attempt() -> None:
    agent_set = {var.name for var in WORKER_VARS if var.set_by is SetBy.AGENT}
    env = agent_worker_env(CTX, "c10d", LOCAL, attempt=3)
    assert set(env) == agent_set
    assert env[worker_env.ATTEMPT] == "3" and env[worker_env.REQUEUE_COUNT] == "2"
    assert env[worker_env.NODE_RANK] == "1" and env[worker_env.JOB_ID] == "66"
    # Before any round (hpclaunch agent --dry-run) there is no attempt yet.
    assert worker_env.ATTEMPT not in agent_worker_env(CTX, "c10d", LOCAL)
    # A backend adds what it needs, after hpclaunch's own.
    assert agent_worker_env(CTX, "static", LOCAL, 0)["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_the_script_exports_the_variables_it_sets() -> None:
    script = render(JobSpec("train.py"))
    for var in WORKER_VARS:
        if var.set_by is SetBy.SCRIPT:
            assert re.search(rf"^export {var.name}=", script, re.M), var.name


def test_a_worker_sees_slurm_task_variables_of_its_own() -> None:
    agent = {
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_NODEID": "1",
        "SLURM_GTIDS": "1",
    }
    view = worker_env.slurm_task_view(
        agent,
        rank=3,
        local_rank=1,
        world_size=4,
        local_world_size=2,
        node_rank=1,
        nodes=2,
        node_ranks=[2, 3],
    )
    assert view["SLURM_PROCID"] == "3" and view["SLURM_LOCALID"] == "1"
    assert view["SLURM_NTASKS"] == view["SLURM_NPROCS"] == view["SLURM_STEP_NUM_TASKS"] == "4"
    assert view["SLURM_NTASKS_PER_NODE"] == "2" and view["SLURM_TASKS_PER_NODE"] == "2(x2)"
    assert view["SLURM_GTIDS"] == "2,3"
    assert view["SLURM_NODEID"] == "1" and view["SLURM_NNODES"] == "2"  # the round's
    # The agent's own values, kept under the prefix (only those SLURM set).
    assert view["HPCLAUNCH_AGENT_SLURM_PROCID"] == "1"
    assert view["HPCLAUNCH_AGENT_SLURM_NTASKS"] == "2"
    assert "HPCLAUNCH_AGENT_SLURM_NPROCS" not in view


def test_outside_a_slurm_task_nothing_is_added() -> None:
    view = worker_env.slurm_task_view(
        {},
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        nodes=1,
        node_ranks=[0],
    )
    assert view == {}


def test_accelerate_is_told_to_use_the_cpu_only_where_there_is_no_gpu() -> None:
    cpu = worker_env.framework_env
    assert cpu({}, []) == {"ACCELERATE_USE_CPU": "1"}
    assert cpu({"SLURM_GPUS_ON_NODE": "0", "CUDA_VISIBLE_DEVICES": ""}, []) == {
        "ACCELERATE_USE_CPU": "1"
    }
    assert cpu({"CUDA_VISIBLE_DEVICES": ""}, ["/dev/nvidia0"]) == {"ACCELERATE_USE_CPU": "1"}
    # A GPU for the job: SLURM's gres, CUDA_VISIBLE_DEVICES, or device files when unsaid.
    assert cpu({"SLURM_GPUS_ON_NODE": "8"}, []) == {}
    assert cpu({"SLURM_JOB_GPUS": "0,1"}, []) == {}
    assert cpu({"CUDA_VISIBLE_DEVICES": "0,1"}, []) == {}
    assert cpu({}, ["/dev/nvidia0"]) == {} and cpu({}, ["/dev/kfd"]) == {}
    # The user's own setting stays.
    assert cpu({"ACCELERATE_USE_CPU": "0"}, []) == {}


def test_lightnings_trainer_is_told_the_launchs_size_unless_the_user_set_it() -> None:
    assert worker_env.lightning_size({}, nodes=2, local_world_size=4) == {
        "PL_TRAINER_NUM_NODES": "2",
        "PL_TRAINER_DEVICES": "4",
    }
    assert worker_env.lightning_size({"PL_TRAINER_DEVICES": "1"}, nodes=2, local_world_size=4) == {
        "PL_TRAINER_NUM_NODES": "2"
    }
