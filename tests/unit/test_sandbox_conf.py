"""The sandbox's layout and configuration files, and its pure helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpclaunch.errors import SandboxError, SpecError
from hpclaunch.procs import Tracked
from hpclaunch.sandbox.cluster import Sandbox, check_prerequisites
from hpclaunch.sandbox.conf import (
    Mode,
    Partitions,
    Placement,
    SandboxSpec,
    gres_conf,
    hosts_file,
    layout,
    slurm_conf,
    topology_conf,
)
from hpclaunch.sandbox.state import SandboxState, UpAction, decide_up, differences
from hpclaunch.slurm.commands import NodeState, parse_sinfo_nodes

STATE = Path("/var/tmp/sbx")


def conf_lines(text: str) -> dict[str, str]:
    return dict(
        line.split("=", 1)
        for line in text.splitlines()
        if "=" in line and " " not in line.split("=", 1)[0]
    )


def test_netns_layout_gives_each_node_an_address_and_short_link_names() -> None:
    lay = layout(STATE, SandboxSpec(nodes=4), Mode.NETNS, Placement("ab12", 7, 21000))
    assert [n.name for n in lay.nodes] == ["n1", "n2", "n3", "n4"]
    assert len({n.addr for n in lay.nodes}) == 4
    assert all(n.addr.startswith(lay.subnet_prefix) for n in lay.nodes)
    assert lay.controller_addr == lay.subnet_prefix + "1"
    assert {n.port for n in lay.nodes} == {21001}
    assert all(len(name) <= 15 for n in lay.nodes for name in (n.host_link, lay.bridge))
    assert [n.switch for n in lay.nodes] == ["leaf1", "leaf1", "leaf2", "leaf2"]
    assert lay.subnet_prefix == "10.254.7." and lay.bridge == "hsab12br"
    assert lay.nodes[0].netns == "hsab12-n1" and lay.nodes[0].host_link == "hsab12v1"


def test_loopback_layout_shares_an_address_not_ports() -> None:
    lay = layout(STATE, SandboxSpec(nodes=3), Mode.LOOPBACK, Placement("ab12", 7, 22000))
    assert {n.addr for n in lay.nodes} == {"127.0.0.1"}
    assert [n.port for n in lay.nodes] == [22001, 22002, 22003]
    assert "NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=22002" in slurm_conf(lay)


def test_slurm_conf_has_the_knobs_that_make_failures_fast() -> None:
    lay = layout(
        STATE, SandboxSpec(nodes=2, gpus_per_node=2), Mode.NETNS, Placement("ab12", 7, 23000)
    )
    text = slurm_conf(lay)
    values = conf_lines(text)
    assert values["SlurmctldHost"] == f"localhost({lay.controller_addr})"
    assert values["SlurmctldPort"] == "23000"
    assert values["FirstJobId"] == "1"
    assert values["AuthInfo"] == f"socket={STATE}/munge/socket,cred_expire=5"
    assert values["ReturnToService"] == "1"
    assert values["JobRequeue"] == "1"
    assert values["TopologyPlugin"] == "topology/tree"
    assert values["GresTypes"] == "gpu"
    assert "Gres=gpu:2" in text and "PreemptType" not in values
    assert "PartitionName=debug Nodes=ALL Default=YES" in text


def test_preempt_partitions() -> None:
    lay = layout(
        STATE,
        SandboxSpec(nodes=2, partitions=Partitions.PREEMPT),
        Mode.NETNS,
        Placement("ab12", 7, 1),
    )
    text = slurm_conf(lay)
    assert "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE\n" in text
    assert (
        "PartitionName=low Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1" in text
    )
    assert "PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2" in text


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        (1, "SwitchName=leaf1 Nodes=n1\nSwitchName=spine Switches=leaf1\n"),
        (
            3,
            "SwitchName=leaf1 Nodes=n1,n2\nSwitchName=leaf2 Nodes=n3\n"
            "SwitchName=spine Switches=leaf1,leaf2\n",
        ),
    ],
)
def test_topology(nodes: int, expected: str) -> None:
    assert (
        topology_conf(layout(STATE, SandboxSpec(nodes=nodes), Mode.NETNS, Placement("ab12", 7, 1)))
        == expected
    )


def test_gres_and_hosts() -> None:
    lay = layout(STATE, SandboxSpec(nodes=2, gpus_per_node=2), Mode.NETNS, Placement("ab12", 7, 1))
    devices = f"{STATE}/dev/nvidia0,{STATE}/dev/nvidia1"
    assert (
        gres_conf(lay)
        == f"NodeName=n1 Name=gpu File={devices}\nNodeName=n2 Name=gpu File={devices}\n"
    )
    assert gres_conf(layout(STATE, SandboxSpec(nodes=2), Mode.NETNS, Placement("ab12", 7, 1))) == ""
    hosts = hosts_file(lay).splitlines()
    assert hosts[0] == "127.0.0.1 localhost"
    assert f"{lay.nodes[1].addr} n2" in hosts


def test_spec_bounds_and_unknown_node() -> None:
    with pytest.raises(SpecError, match="outside 1 to 64"):
        SandboxSpec(nodes=0)
    with pytest.raises(SpecError, match="outside 0 to 16"):
        SandboxSpec(gpus_per_node=-1)
    with pytest.raises(SpecError, match="first job id 0 is outside 1 to 1000000"):
        SandboxSpec(first_job_id=0)
    lay = layout(STATE, SandboxSpec(nodes=2), Mode.NETNS, Placement("ab12", 7, 1))
    with pytest.raises(SpecError, match="no sandbox node is called 'n9'; the nodes are n1, n2"):
        lay.node("n9")


def test_prerequisites_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="needs root"):
        check_prerequisites(euid=1000, path=str(tmp_path))
    with pytest.raises(SandboxError) as info:
        check_prerequisites(euid=0, path=str(tmp_path))
    assert "munge" in str(info.value) and "apt-get install slurm-wlm munge" in str(info.value)


def test_parse_sinfo_nodes() -> None:
    # Recorded from the sandbox (two partitions list each node twice).
    recorded = "n1 idle\nn1 idle\nn2 down*\nn3 mixed\nn4 drained\nn4 drained\nn5 idle~\n"
    assert parse_sinfo_nodes(recorded) == {
        "n1": NodeState("idle"),
        "n2": NodeState("down", responding=False),
        "n3": NodeState("mixed"),
        "n4": NodeState("drained"),
        "n5": NodeState("idle"),
    }


def test_up_decision() -> None:
    spec = SandboxSpec(nodes=2)
    place = Placement("ab12", 7, 21000)
    alive = Tracked.of(os.getpid())
    gone = Tracked(alive.pid, alive.start_time + 1)  # same PID, another process
    full = {"munged": alive, "slurmctld": alive, "n1": alive, "n2": alive}
    healthy = SandboxState(spec, Mode.NETNS, place, full, complete=True)
    assert decide_up(None, spec) is UpAction.START
    assert decide_up(healthy, spec) is UpAction.REUSE
    assert decide_up(healthy, SandboxSpec(nodes=2, mode=Mode.NETNS)) is UpAction.REUSE
    assert decide_up(healthy, SandboxSpec(nodes=2, mode=Mode.LOOPBACK)) is UpAction.CONFLICT
    assert decide_up(healthy, SandboxSpec(nodes=3)) is UpAction.CONFLICT
    assert differences(healthy, SandboxSpec(nodes=3)) == "--nodes 3 (running: 2)"
    interrupted = SandboxState(spec, Mode.NETNS, place, {"munged": alive, "slurmctld": alive})
    assert interrupted.dead() == ["n1", "n2"]
    assert decide_up(interrupted, spec) is UpAction.REPLACE
    unfinished = SandboxState(spec, Mode.NETNS, place, full, complete=False)
    assert decide_up(unfinished, spec) is UpAction.REPLACE
    reused_pid = SandboxState(spec, Mode.NETNS, place, {**full, "n2": gone}, complete=True)
    assert reused_pid.dead() == ["n2"] and decide_up(reused_pid, spec) is UpAction.REPAIR
    no_controller = SandboxState(
        spec, Mode.NETNS, place, {**full, "slurmctld": gone}, complete=True
    )
    assert decide_up(no_controller, spec) is UpAction.REPLACE
    assert SandboxState.from_json(healthy.to_json()) == healthy
    numbered = SandboxSpec(nodes=2, first_job_id=2001)
    assert decide_up(healthy, numbered) is UpAction.CONFLICT
    assert differences(healthy, numbered) == "first job id 2001 (running: 1)"
    moved = SandboxState(numbered, Mode.NETNS, place, full, complete=True)
    assert SandboxState.from_json(moved.to_json()) == moved
    assert slurm_conf(layout(STATE, numbered, Mode.NETNS, place)).count("FirstJobId=2001\n") == 1
    older = healthy.to_json()  # written before first_job_id was recorded
    del older["spec"]["first_job_id"]
    assert SandboxState.from_json(older) == healthy


def test_commands_on_a_missing_or_foreign_folder_create_nothing(tmp_path: Path) -> None:
    missing = Sandbox(tmp_path / "typo")
    assert missing.down() == []
    with pytest.raises(SandboxError, match="no sandbox is up"):
        missing.kill_node("n1")
    assert not (tmp_path / "typo").exists()
    foreign = tmp_path / "project"
    foreign.mkdir()
    (foreign / "notes.md").write_text("mine")
    with pytest.raises(SandboxError, match=r"already holds files \(notes\.md\)"):
        Sandbox(foreign).up(SandboxSpec(nodes=1))
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.md"]
