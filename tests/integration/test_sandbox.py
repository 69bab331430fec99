"""The sandbox is a real SLURM cluster: jobs span its nodes, nodes die and come
back, preemption requeues, and `down` leaves nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpclaunch import procs
from hpclaunch.procs import Tracked
from hpclaunch.sandbox import daemons as daemons_mod
from hpclaunch.sandbox import net
from hpclaunch.sandbox.cluster import NodeAction, Sandbox
from hpclaunch.sandbox.conf import Mode, SandboxSpec
from hpclaunch.slurm.commands import NodeState
from tests.integration.helpers import wait_for
from tests.integration.sandbox_fixture import Running, client_env, require_sandbox

pytestmark = pytest.mark.integration

PROBE = """
import json, os, socket, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[1])
node_id = int(os.environ["SLURM_NODEID"])
hosts = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                       capture_output=True, text=True, check=True).stdout.split()
first = hosts[0]
record = {k: v for k, v in os.environ.items() if k.startswith(("SLURM", "CUDA_"))}
record["first_addr"] = socket.gethostbyname(first)
if node_id == 0:
    public = socket.create_server(("0.0.0.0", 29511))
    private = socket.create_server(("127.0.0.1", 29512))
    (out / "ready").write_text("")
    for _ in range(len(hosts) - 1):
        public.accept()[0].close()
else:
    deadline = time.monotonic() + 20
    while not (out / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    socket.create_connection((first, 29511), timeout=5).close()
    record["public"] = "connected"
    try:
        socket.create_connection((first, 29512), timeout=5).close()
        record["private"] = "connected"
    except OSError as exc:
        record["private"] = type(exc).__name__
(out / f"node{node_id}.json").write_text(json.dumps(record))
"""

JOB = """#!/bin/bash
echo "${SLURM_RESTART_COUNT:-0} $SLURM_JOB_NODELIST" >> "$1"
srun sleep 600
"""


def run(env: dict[str, str], *argv: str) -> str:
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout


def states(box: Sandbox) -> dict[str, NodeState]:
    return box.slurm().node_states()


def step_running(sandbox: Running, job: str) -> bool:
    """The batch script's srun step is running (killing a node before that fails
    the step launch instead of the node)."""
    return f"{job}.0" in run(sandbox.env, "squeue", "--steps", "-h", "-j", job, "-o", "%i").split()


def netns_only(sandbox: Running) -> None:
    if sandbox.layout.mode is not Mode.NETNS:
        pytest.fail("this machine allows network namespaces as root, so the sandbox must use them")


def test_tasks_see_one_job_and_reach_the_first_node(sandbox: Running, tmp_path: Path) -> None:
    netns_only(sandbox)
    run(sandbox.env, "srun", "-N4", "--gpus-per-node=2", sys.executable, "-c", PROBE, str(tmp_path))
    records = [json.loads((tmp_path / f"node{i}.json").read_text()) for i in range(4)]
    assert {r["SLURM_JOB_ID"] for r in records} == {records[0]["SLURM_JOB_ID"]}
    assert {r["SLURM_JOB_NODELIST"] for r in records} == {"n[1-4]"}
    assert [r["SLURM_NODEID"] for r in records] == ["0", "1", "2", "3"]
    assert [r["SLURMD_NODENAME"] for r in records] == ["n1", "n2", "n3", "n4"]
    assert [r["SLURM_TOPOLOGY_ADDR"] for r in records] == [
        "spine.leaf1.n1",
        "spine.leaf1.n2",
        "spine.leaf2.n3",
        "spine.leaf2.n4",
    ]
    assert {r["CUDA_VISIBLE_DEVICES"] for r in records} == {"0,1"}
    assert {r["SLURM_GPUS_ON_NODE"] for r in records} == {"2"}
    assert {r["first_addr"] for r in records} == {sandbox.layout.node("n1").addr}
    for r in records[1:]:
        assert r["public"] == "connected"
        assert r["private"] == "ConnectionRefusedError"  # 127.0.0.1 is n1's own


def test_killed_node_goes_down_and_the_job_is_requeued(sandbox: Running, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    (tmp_path / "job.sh").write_text(JOB)
    job = run(
        sandbox.env,
        "sbatch",
        "--parsable",
        "--requeue",
        "-N2",
        f"--output={tmp_path}/out",
        str(tmp_path / "job.sh"),
        str(starts),
    ).strip()
    try:
        wait_for(lambda: starts.exists() and starts.read_text().startswith("0 "), what="the start")
        wait_for(lambda: step_running(sandbox, job), what="the job's srun step")
        first_nodes = run(
            sandbox.env, "scontrol", "show", "hostnames", starts.read_text().split()[1]
        )
        victim = first_nodes.split()[1]
        sandbox.box.kill_node(victim)
        sandbox.box.set_node_state(
            victim, NodeAction.DOWN, "test: node killed"
        )  # SLURM's own takes ~25 s
        wait_for(lambda: states(sandbox.box)[victim].state == "down", what=f"{victim} DOWN")
        wait_for(lambda: len(starts.read_text().splitlines()) == 2, timeout_s=60, what="the rerun")
        restart, nodes = starts.read_text().splitlines()[1].split()
        assert restart == "1"
        assert victim not in run(sandbox.env, "scontrol", "show", "hostnames", nodes).split()
        sandbox.box.start_node(victim)
        wait_for(lambda: states(sandbox.box)[victim] == NodeState("idle"), what=f"{victim} back")
    finally:
        run(sandbox.env, "scancel", job)
    wait_for(lambda: not run(sandbox.env, "squeue", "-h", "-j", job).strip(), what="the job's end")


def test_high_partition_preempts_and_requeues_low(sandbox: Running, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    (tmp_path / "job.sh").write_text(JOB)
    low = run(
        sandbox.env,
        "sbatch",
        "--parsable",
        "--requeue",
        "--exclusive",
        "-N4",
        "--partition=low",
        f"--output={tmp_path}/low.out",
        str(tmp_path / "job.sh"),
        str(starts),
    ).strip()
    try:
        wait_for(
            lambda: starts.exists() and starts.read_text().startswith("0 "),
            what="the low job to start",
        )
        wait_for(lambda: step_running(sandbox, low), what="the low job's srun step")
        high = ["sbatch", "-N4", "--partition=high", f"--output={tmp_path}/high.out"]
        run(sandbox.env, *high, "--wrap", "srun true")
        wait_for(
            lambda: len(starts.read_text().splitlines()) == 2, timeout_s=60, what="low to run again"
        )
        assert starts.read_text().splitlines()[1].startswith("1 ")
    finally:
        run(sandbox.env, "scancel", low)


def test_drain_and_resume_through_scontrol(sandbox: Running) -> None:
    sandbox.box.set_node_state("n3", NodeAction.DRAIN, "test")
    wait_for(lambda: states(sandbox.box)["n3"].state == "drained", what="n3 drained")
    sandbox.box.set_node_state("n3", NodeAction.RESUME, "test")
    wait_for(lambda: states(sandbox.box)["n3"].state == "idle", what="n3 idle again")


def test_cut_node_partitions_the_network(sandbox: Running) -> None:
    netns_only(sandbox)
    node = sandbox.layout.node("n4")
    slurmd = (node.addr, node.port)

    def reachable() -> bool:
        try:
            connect = f"import socket; socket.create_connection({slurmd!r}, timeout=0.5)"
            subprocess.run([sys.executable, "-c", connect], check=True, capture_output=True)
        except subprocess.CalledProcessError:
            return False
        return True

    assert reachable()
    sandbox.box.cut_node("n4")
    try:
        assert not reachable()
    finally:
        sandbox.box.cut_node("n4", heal=True)
    wait_for(reachable, what="n4 reachable again")


# A task that leaves an orphan in a session of its own behind, as torch workers do.
ORPHAN_JOB = "srun bash -c '(setsid sleep 600 &); sleep 600'"


def node_sleeps(box: Sandbox) -> dict[str, list[Tracked]]:
    """The `sleep` processes under each node's reaper (found by PID, only to be checked)."""
    table = procs.parents()
    out: dict[str, list[Tracked]] = {}
    for name, reaper in json.loads(box.state_file.read_text())["procs"].items():
        if name.startswith("n"):
            out[name] = []
            for pid in procs.descendants(reaper[0], table):
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                        out[name].append(Tracked.of(pid))
    return out


@pytest.mark.parametrize("mode", [Mode.NETNS, Mode.LOOPBACK])
def test_kill_node_kills_that_node_only_and_down_leaves_nothing(tmp_path: Path, mode: Mode) -> None:
    require_sandbox()
    box = Sandbox(tmp_path / "box")
    spec = SandboxSpec(nodes=2, mode=mode)
    lay = box.up(spec)
    try:
        first = json.loads(box.state_file.read_text())
        assert box.up(spec) == lay  # already up: nothing restarted
        assert json.loads(box.state_file.read_text()) == first
        daemons = [Tracked(*rec) for rec in first["procs"].values()]
        env = client_env(box)
        run(env, "sbatch", "--parsable", "-N2", f"--output={tmp_path}/out", "--wrap", ORPHAN_JOB)
        wait_for(
            lambda: [len(v) for v in node_sleeps(box).values()] == [2, 2], what="2 sleeps a node"
        )
        sleeps = node_sleeps(box)
        orphan_parents = {procs.parents().get(t.pid) for t in sleeps["n2"]}
        assert first["procs"]["n2"][0] in orphan_parents  # the setsid orphan was adopted
        box.kill_node("n2")
        assert not [t for t in sleeps["n2"] if t.alive()]
        assert all(t.alive() for t in sleeps["n1"])  # the other node is untouched
        assert box.status()["dead"] == ["n2"]
        box.up(spec)  # starts the killed node again, touches nothing else
        assert box.status()["up"] is True
        assert all(t.alive() for t in sleeps["n1"])
        assert all(Tracked(*first["procs"][n]).alive() for n in ("munged", "slurmctld", "n1"))
    finally:
        left = box.down()
    assert left == []
    assert not [t for t in [*daemons, *sleeps["n1"]] if t.alive()]
    # Nothing that any of its nodes started (the restarted n2's slurmd included) is left.
    markers = [daemons_mod.node_marker(lay, node.name).encode() for node in lay.nodes]
    assert not [pid for marker in markers for pid in procs.with_environ(marker)]
    assert net.links_with_prefix(lay.bridge[:6]) == []  # checked apart from down's own list
    assert not box.state_file.exists()
    assert box.down() == []  # idempotent


def test_cli_commands(tmp_path: Path, hpclaunch_bin: Path) -> None:
    require_sandbox()
    spaced = subprocess.run(
        [str(hpclaunch_bin), "sandbox", "--state-dir", str(tmp_path / "a b"), "up"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert spaced.returncode == 1 and "characters slurm.conf cannot hold" in spaced.stderr
    state = tmp_path / "cli-box"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(hpclaunch_bin), "sandbox", "--state-dir", str(state), *args]
        return subprocess.run(argv, capture_output=True, text=True, check=False)

    try:
        up = cli("up", "--nodes", "2", "--mode", "loopback")
        assert up.returncode == 0, up.stderr
        assert "sandbox up: 2 nodes (loopback mode)" in up.stderr
        env = cli("env")
        assert env.stdout == f"export SLURM_CONF={state}/etc/slurm.conf\n"
        info = json.loads(cli("status", "--json").stdout)
        assert info["up"] is True and info["mode"] == "loopback"
        assert {name: node["state"] for name, node in info["nodes"].items()} == {
            "n1": "idle",
            "n2": "idle",
        }
        unknown = cli("kill-node", "n7")
        assert unknown.returncode == 2
        assert "no sandbox node is called 'n7'; the nodes are n1, n2" in unknown.stderr
        cut = cli("cut-node", "n1")
        assert cut.returncode == 1 and "needs netns mode" in cut.stderr
        other = cli("up", "--nodes", "3")
        assert other.returncode == 1 and "a sandbox with other settings is up" in other.stderr
        assert cli("down-node", "n2").returncode == 0
        text = cli("status").stdout
        assert "n2" in text and "down" in text.split("n2", 1)[1].splitlines()[0]
    finally:
        down = cli("down")
    assert down.returncode == 0, down.stderr
    gone = cli("status")
    assert gone.returncode == 1 and gone.stdout == f"no sandbox in {state}\n"


def test_kill_node_finds_a_slurmd_whose_reaper_is_gone(tmp_path: Path) -> None:
    require_sandbox()
    box = Sandbox(tmp_path / "box")
    box.up(SandboxSpec(nodes=1, mode=Mode.LOOPBACK))
    try:
        reaper = Tracked(*json.loads(box.state_file.read_text())["procs"]["n1"])
        (slurmd_pid,) = procs.descendants(reaper.pid)
        slurmd = Tracked.of(slurmd_pid)
        os.kill(reaper.pid, signal.SIGKILL)  # the node's slurmd is now an orphan of PID 1
        wait_for(lambda: not reaper.alive(), what="the reaper to die")
        assert slurmd.alive()
        box.kill_node("n1")
        assert not slurmd.alive()
    finally:
        assert box.down() == []
