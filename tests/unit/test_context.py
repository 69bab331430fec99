"""Hostlists and node contexts from plain environments."""

from __future__ import annotations

import pytest

from hpclaunch.contract.agent import RankOrder
from hpclaunch.slurm.env import (
    PORT_BASE,
    PORT_SPAN,
    ContextError,
    NodeContext,
    derive_port,
    job_nodes,
    parse_topology,
    topology_order,
)
from hpclaunch.slurm.hostlist import HostlistError, compress, expand


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-4]", ["n1", "n2", "n3", "n4"]),
        ("n[3,1]", ["n3", "n1"]),
        ("gpu-a[001-003,010],gpu-b7", ["gpu-a001", "gpu-a002", "gpu-a003", "gpu-a010", "gpu-b7"]),
        ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
        ("a,b,c", ["a", "b", "c"]),
        ("node[8-11]", ["node8", "node9", "node10", "node11"]),
        ("x[09-11]", ["x09", "x10", "x11"]),
        ("host.example.org", ["host.example.org"]),
        ("n[1-2],m[5]", ["n1", "n2", "m5"]),
    ],
)
def test_expand(hostlist: str, hosts: list[str]) -> None:
    assert expand(hostlist) == hosts


@pytest.mark.parametrize(
    ("hostlist", "needle"),
    [
        ("", "empty"),
        ("n[1-4", "'[' without ']'"),
        ("n1-4]", "']' without '['"),
        ("n[[1]]", "nested"),
        ("n[4-1]", "runs backwards"),
        ("n[a-b]", "not a number"),
        ("n[]", "not a number"),
        ("n1,,n2", "empty host name"),
    ],
)
def test_expand_rejects(hostlist: str, needle: str) -> None:
    with pytest.raises(HostlistError) as info:
        expand(hostlist)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    "hostlist", ["n[1-4]", "gpu-a[001-003,010],gpu-b7", "a,b", "x[09-11]", "n[3,1]"]
)
def test_compress_round_trips(hostlist: str) -> None:
    assert expand(compress(expand(hostlist))) == expand(hostlist)
    assert compress(["n1", "n2", "n3", "n7"]) == "n[1-3,7]"


BASE = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_NODELIST": "n[1-4]",
    "SLURM_STEP_NUM_NODES": "4",
    "SLURM_NODEID": "2",
}


def ctx(**changes: str | None) -> NodeContext:
    env = {k: v for k, v in {**BASE, **changes}.items() if v is not None}
    return NodeContext.from_env(env)


def test_context_from_a_step() -> None:
    c = ctx(SLURM_TOPOLOGY_ADDR="spine.leaf2.n3")
    assert c.job_id == 4242 and c.node_rank == 2 and c.nnodes == 4
    assert c.hosts == ("n1", "n2", "n3", "n4") and c.hostname == "n3" and c.first_host == "n1"
    assert c.restart_count == 0
    assert (c.nproc_per_node, c.nproc_source) == (1, "default")
    assert c.master_port == derive_port(4242) == PORT_BASE + 4242
    assert c.topology_addr == "spine.leaf2.n3"


def test_job_variables_when_there_is_no_step() -> None:
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "a,b",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NODEID": "1",
    }
    c = NodeContext.from_env(env)
    assert c.hosts == ("a", "b") and c.hostname == "b"


@pytest.mark.parametrize(
    ("changes", "nproc", "source"),
    [
        ({"SLURM_GPUS_ON_NODE": "8"}, 8, "SLURM_GPUS_ON_NODE"),
        ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, 3, "CUDA_VISIBLE_DEVICES"),
        ({"SLURM_GPUS_ON_NODE": "0", "CUDA_VISIBLE_DEVICES": "3"}, 1, "CUDA_VISIBLE_DEVICES"),
        ({"SLURM_RESTART_COUNT": "2"}, 1, "default"),
    ],
)
def test_nproc_sources(changes: dict[str, str], nproc: int, source: str) -> None:
    c = ctx(**changes)
    assert (c.nproc_per_node, c.nproc_source) == (nproc, source)
    assert NodeContext.from_env({**BASE, **changes}, nproc_per_node=5).nproc_per_node == 5


def test_restart_count_and_port_override() -> None:
    assert ctx(SLURM_RESTART_COUNT="3").restart_count == 3
    assert NodeContext.from_env(BASE, master_port=30001).master_port == 30001


def test_ports_stay_in_range_and_differ_between_neighbouring_jobs() -> None:
    ports = {derive_port(job) for job in range(1000, 1000 + PORT_SPAN)}
    assert len(ports) == PORT_SPAN and min(ports) == PORT_BASE and max(ports) < 32768


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"SLURM_JOB_ID": None}, "not inside a SLURM allocation"),
        ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc' is not a whole number"),
        ({"SLURM_NODEID": None}, "SLURM_NODEID is not set"),
        ({"SLURM_NODEID": "-1"}, "SLURM_NODEID='-1'"),
        ({"SLURM_NODEID": "4"}, "SLURM_NODEID=4 is outside the 4 nodes"),
        ({"SLURM_NODEID": "²"}, "SLURM_NODEID='²'"),
        ({"SLURM_STEP_NODELIST": "n[1-4"}, "SLURM_STEP_NODELIST='n[1-4' is not a hostlist"),
        ({"SLURM_STEP_NUM_NODES": "3"}, "SLURM_STEP_NUM_NODES='3' does not match the 4 hosts"),
        ({"CUDA_VISIBLE_DEVICES": "0,,1"}, "CUDA_VISIBLE_DEVICES='0,,1'"),
        ({"SLURM_RESTART_COUNT": "x"}, "SLURM_RESTART_COUNT='x'"),
        ({"SLURM_GPUS_ON_NODE": "two"}, "SLURM_GPUS_ON_NODE='two'"),
    ],
)
def test_bad_environments_name_the_variable(changes: dict[str, str | None], needle: str) -> None:
    with pytest.raises(ContextError) as info:
        ctx(**changes)
    assert needle in str(info.value)


def test_no_nodelist_at_all() -> None:
    with pytest.raises(ContextError, match="SLURM_JOB_NODELIST is not set"):
        NodeContext.from_env({"SLURM_JOB_ID": "1", "SLURM_NODEID": "0"})


TOPOLOGY = """SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=n1,n3
SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=n[2,4]
SwitchName=spine Level=1 LinkSpeed=1 Nodes=n[1-4] Switches=leaf1,leaf2
"""


def test_topology_rank_order() -> None:
    switch_of = parse_topology(TOPOLOGY)
    assert switch_of == {"n1": "leaf1", "n3": "leaf1", "n2": "leaf2", "n4": "leaf2"}
    assert topology_order(["n1", "n2", "n3", "n4"], switch_of) == ("n1", "n3", "n2", "n4")
    c = ctx().ordered(RankOrder.TOPOLOGY, switch_of)  # this node is n3
    assert c.hosts == ("n1", "n3", "n2", "n4") and c.node_rank == 1 and c.hostname == "n3"
    assert ctx().ordered(RankOrder.SLURM, switch_of) == ctx()
    with pytest.raises(ContextError, match="does not place n4"):
        ctx().ordered(RankOrder.TOPOLOGY, {"n1": "a", "n2": "a", "n3": "b"})


def test_job_nodes_of_the_batch_step() -> None:
    assert job_nodes({"SLURM_JOB_NODELIST": "n[1-3],m7"}) == ["n1", "n2", "n3", "m7"]
    assert job_nodes({"SLURM_JOB_NODELIST": "n[1-"}) == []
    assert job_nodes({}) == []
