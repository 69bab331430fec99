"""The agent's pure parts: launch settings, worker command and environment."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from hpclaunch.contract.agent import AgentSettings, EntryKind
from hpclaunch.contract.rendezvous import EtcdRdzv
from hpclaunch.contract.values import NodeRange
from hpclaunch.node.agent import job_folder
from hpclaunch.node.launch_plan import (
    guarded,
    launch_settings,
    worker_command,
    worker_env,
)
from hpclaunch.rendezvous import backends
from hpclaunch.slurm.env import ContextError, NodeContext

ENV = {
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_NODEID": "1",
    "SLURM_RESTART_COUNT": "2",
}


def settings(**changes: object) -> dict[str, Any]:
    """The launch plan as torch's LaunchConfig keywords (and --dry-run's "launch")."""
    opts = AgentSettings(**{"entrypoint": "train.py", **changes})  # type: ignore[arg-type]
    plan = launch_settings(NodeContext.from_env(ENV, nproc_per_node=4), opts, "n1", "n2")
    return plan.launch_config_kwargs()


def test_c10d_settings_rank_the_first_node_zero() -> None:
    s = settings()
    assert s["rdzv_backend"] == "hpclaunch-c10d"
    assert s["rdzv_configs"] == {"node_rank": 1, "is_host": False}
    assert s["rdzv_endpoint"] == "n1:15077"
    assert (s["min_nodes"], s["max_nodes"], s["nproc_per_node"]) == (2, 2, 4)
    assert s["run_id"] == "hpclaunch-77-2"
    assert s["local_addr"] == "n2"
    assert "SIGUSR1" in str(s["signals_to_handle"]) and "SIGUSR2" in str(s["signals_to_handle"])
    assert s["shutdown_timeout"] == 30 and s["log_line_prefix_template"] == "[rank${rank}] "


def test_grace_period_and_no_tee() -> None:
    s = settings(grace_period_s=5, tee=False)
    assert s["shutdown_timeout"] == 5 and s["log_line_prefix_template"] is None


def test_job_folder() -> None:
    ctx = NodeContext.from_env({**ENV, "SLURM_STEP_ID": "3"})
    assert ctx.step_id == "3" and NodeContext.from_env(ENV).step_id == "batch"
    opts = AgentSettings("t.py")
    assert job_folder(ctx, opts, {}) == Path("hpclaunch-logs/77")
    assert job_folder(ctx, opts, {"HPCLAUNCH_JOB_DIR": "/shared/j"}) == Path("/shared/j")
    given = AgentSettings("t.py", job_dir=Path("/x"))
    assert job_folder(ctx, given, {"HPCLAUNCH_JOB_DIR": "/shared/j"}) == Path("/x")
    with pytest.raises(ContextError, match="SLURM_STEP_ID='a' is not a whole number"):
        NodeContext.from_env({**ENV, "SLURM_STEP_ID": "a"})


def test_static_and_elastic_and_etcd() -> None:
    s = settings(rdzv="static")
    assert s["rdzv_backend"] == "static" and s["rdzv_configs"] == {"rank": 1}
    elastic = settings(nnodes=NodeRange(1, 4))  # the step has 2 nodes: no wait for 4
    assert (elastic["min_nodes"], elastic["max_nodes"]) == (1, 2)
    with pytest.raises(ContextError, match="step has 2 nodes but --nnodes is 3:4"):
        settings(nnodes=NodeRange(3, 4))
    with pytest.raises(ContextError, match="static rendezvous needs a fixed node count"):
        settings(rdzv="static", nnodes=NodeRange(1, 2))
    with pytest.raises(ContextError, match="--rdzv etcd needs --etcd-endpoint"):
        settings(rdzv="etcd")


def test_etcd_settings_carry_endpoints_tls_and_user_but_no_password() -> None:
    flags = EtcdRdzv(
        endpoints=("e1:2379", "e2:2379"),
        cacert="/ca.pem",
        cert="/c.pem",
        key="/k.pem",
        user="trainer",
        password_file="/pw",
    )
    etcd = {f"etcd_{k}": v for k, v in dataclasses.asdict(flags).items()}
    s = settings(rdzv="etcd", nnodes=NodeRange(1, 4), **etcd)
    assert s["rdzv_backend"] == "hpclaunch-etcd" and s["rdzv_endpoint"] == "e1:2379,e2:2379"
    assert (s["min_nodes"], s["max_nodes"]) == (1, 2)
    assert s["rdzv_configs"] == {
        "node_rank": 1,
        "last_call_timeout": 3,
        "keep_alive_interval": 2,
        "keep_alive_max_attempt": 3,
        "cacert": "/ca.pem",
        "cert": "/c.pem",
        "key": "/k.pem",
        "user": "trainer",
        "password_file": "/pw",
    }
    assert flags.argv() == [
        "--etcd-endpoint",
        "e1:2379,e2:2379",
        "--etcd-cacert",
        "/ca.pem",
        "--etcd-cert",
        "/c.pem",
        "--etcd-key",
        "/k.pem",
        "--etcd-user",
        "trainer",
        "--etcd-password-file",
        "/pw",
    ]
    assert EtcdRdzv(sidecar=True, binary="/opt/etcd").argv() == [
        "--etcd-sidecar",
        "--etcd-binary",
        "/opt/etcd",
    ]


def test_worker_command_and_env() -> None:
    assert worker_command(AgentSettings("t.py", ("--x",))) == (sys.executable, "-u", "t.py", "--x")
    module = worker_command(AgentSettings("pkg.m", ("a",), entry_kind=EntryKind.MODULE))
    assert module == (sys.executable, "-u", "-m", "pkg.m", "a")
    binary = worker_command(AgentSettings("/bin/app", ("a",), entry_kind=EntryKind.EXECUTABLE))
    assert binary == ("/bin/app", "a")
    entry, args = guarded(("/bin/app", "a"), 4321, None)
    assert entry == sys.executable and args[0] == "-S"  # the guard skips the progress boot
    assert args[1].endswith("hpclaunch/node/worker_guard.py")
    assert args[2:] == ("4321", "/bin/app", "a")
    assert guarded(("/bin/app", "a"), 4321, "/usr/bin/setpriv") == (
        "/usr/bin/setpriv",
        ("--pdeathsig", "KILL", "--", "/bin/app", "a"),
    )
    local = Path("/dev/shm/hpclaunch-u1000-c-77-5-2-n2")
    env = worker_env(NodeContext.from_env(ENV), "c10d", local)
    assert env == {
        "HPCLAUNCH_JOB_ID": "77",
        "HPCLAUNCH_REQUEUE_COUNT": "2",
        "HPCLAUNCH_NODE_RANK": "1",
        "HPCLAUNCH_LOCAL_CHECKPOINT_DIR": str(local),
    }
    static = worker_env(NodeContext.from_env(ENV), "static", local)
    assert static["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_node_multiple_rounds_the_range_to_multiples() -> None:
    three = {**ENV, "SLURM_STEP_NODELIST": "n[1-3]"}
    ctx = NodeContext.from_env(three, nproc_per_node=1)
    opts = AgentSettings("t.py", nnodes=NodeRange(1, 4), node_multiple=2)
    s = launch_settings(ctx, opts, "n1", "n2")
    assert (s.min_nodes, s.max_nodes) == (2, 2)  # the third node stands by
    assert s.rdzv_configs["node_multiple"] == 2
    fixed = launch_settings(ctx, AgentSettings("t.py", node_multiple=3), "n1", "n2")
    assert (fixed.min_nodes, fixed.max_nodes) == (3, 3)
    with pytest.raises(
        ContextError, match="no count from 3 to 3 is a multiple of --node-multiple 2"
    ):
        launch_settings(ctx, AgentSettings("t.py", node_multiple=2), "n1", "n2")
    with pytest.raises(ContextError, match="--node-multiple needs --rdzv c10d or etcd"):
        launch_settings(ctx, AgentSettings("t.py", node_multiple=3, rdzv="static"), "n1", "n2")


def test_a_backend_is_one_table_row() -> None:
    def derive(req: backends.Request) -> tuple[str, dict[str, object]]:
        return f"zk://{req.first_node}", {"rank": req.node_rank}

    row = backends.Backend("hpclaunch-zk", derive, {"ZK": "1"})
    request = backends.Request(
        node_rank=1,
        first_node="n1:2181",
        min_nodes=2,
        max_nodes=4,
        asked_nodes="2:4",
        node_multiple=2,
    )
    assert row.plan(request) == backends.RdzvPlan(
        "hpclaunch-zk", "zk://n1:2181", {"rank": 1, "node_multiple": 2}
    )
    ctx = NodeContext.from_env(ENV, nproc_per_node=4)
    plan = launch_settings(ctx, AgentSettings("t.py", rdzv="static"), "n1", "n2")
    assert (plan.rdzv_backend, plan.rdzv_endpoint) == ("static", "n1:15077")
    assert plan.launch_config_kwargs()["rdzv_configs"] == {"rank": 1}
    local = Path("/dev/shm/x")
    assert worker_env(ctx, "static", local)["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_a_bad_rendezvous_value_names_its_option() -> None:
    ctx = NodeContext.from_env(ENV)
    opts = AgentSettings("t.py", rdzv="etcd", etcd_endpoints=("bad",))
    with pytest.raises(ContextError, match=r"^--etcd-endpoint: 'bad' is not host:port"):
        launch_settings(ctx, opts, "n1", "n2")
