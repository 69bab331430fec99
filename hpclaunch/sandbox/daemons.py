"""Starting and stopping the sandbox's daemons, by PID.

Each slurmd runs under a child subreaper (``reaper.py``), in its node's
namespaces in netns mode; killing a node kills the reaper's whole tree, which
holds every process of the node, however it was started.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from hpclaunch import procs
from hpclaunch.errors import SandboxError
from hpclaunch.procs import Tracked
from hpclaunch.sandbox import net
from hpclaunch.sandbox.conf import Layout, Mode, Node
from hpclaunch.slurm.commands import NodeState, Slurm

START_TIMEOUT_S = 30.0
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def daemon_env(lay: Layout) -> dict[str, str]:
    """The whole environment of every sandbox daemon."""
    return {"PATH": SBIN_PATH, "SLURM_CONF": str(lay.conf_path), "HOME": "/root", "LANG": "C.UTF-8"}


def slurm(lay: Layout) -> Slurm:
    """SLURM's client commands pointed at the sandbox."""
    return Slurm(env=daemon_env(lay), timeout_s=15)


def log_of(lay: Layout, name: str) -> Path:
    """Where daemon ``name`` (munged, slurmctld or a node) writes its output."""
    label = name if name in ("munged", "slurmctld") else f"slurmd-{name}"
    return lay.state_dir / "log" / f"{label}.out"


def node_marker(lay: Layout, name: str) -> str:
    """An environment entry every process of node ``name`` inherits from its slurmd
    (slurmstepd keeps slurmd's environment): how a node's processes are found when
    its reaper is gone."""
    return f"HPCLAUNCH_SANDBOX_NODE={lay.state_dir}:{name}"


def spawn(
    argv: list[str], lay: Layout, name: str, keep: dict[int, subprocess.Popen[bytes]]
) -> Tracked:
    """Start a daemon in a session of its own (terminal signals do not reach it)."""
    env = daemon_env(lay)
    if name not in ("munged", "slurmctld"):
        key, _, value = node_marker(lay, name).partition("=")
        env[key] = value
    with log_of(lay, name).open("wb") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    keep[proc.pid] = proc  # so its exit can be reaped, not left a zombie
    return Tracked.of(proc.pid)


def wait(
    condition: Callable[[], bool],
    what: str,
    lay: Layout,
    watched: Mapping[str, Tracked],
    explain: Callable[[], str] = lambda: "",
) -> None:
    """Poll ``condition``; fail at once, quoting its output, if a watched daemon dies."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        for name, tracked in watched.items():
            if not tracked.alive():
                out = log_of(lay, name)
                tail = (
                    out.read_text(errors="replace").strip().splitlines()[-3:]
                    if out.exists()
                    else []
                )
                label = name if name in ("munged", "slurmctld") else f"slurmd of {name}"
                raise SandboxError(
                    f"{label} exited while waiting for {what}: {' | '.join(tail) or 'no output'}; "
                    f"see {lay.state_dir / 'log'}"
                )
        if time.monotonic() > deadline:
            raise SandboxError(
                f"timed out after {START_TIMEOUT_S:g} s waiting for {what}{explain()}; "
                f"see {lay.state_dir / 'log'}"
            )
        time.sleep(0.05)


def node_states_text(lay: Layout) -> str:
    try:
        states = slurm(lay).node_states()
    except SandboxError:
        return ""
    return (
        " ("
        + ", ".join(f"{n}: {s.state}{'' if s.responding else '*'}" for n, s in states.items())
        + ")"
    )


def start_control(
    lay: Layout, keep: dict[int, subprocess.Popen[bytes]], record: Callable[[str, Tracked], None]
) -> None:
    """munged, then slurmctld; returns once slurmctld answers."""
    d = lay.state_dir
    munged = spawn(
        [
            "munged",
            "--foreground",
            "--force",
            f"--socket={lay.munge_socket}",
            f"--key-file={d}/munge/munge.key",
            f"--log-file={d}/log/munged.log",
            f"--pid-file={d}/run/munged.pid",
            f"--seed-file={d}/munge/seed",
        ],
        lay,
        "munged",
        keep,
    )
    record("munged", munged)
    wait(lay.munge_socket.exists, "munged's socket", lay, {"munged": munged})
    start_slurmctld(lay, keep, record, munged)


def start_slurmctld(
    lay: Layout,
    keep: dict[int, subprocess.Popen[bytes]],
    record: Callable[[str, Tracked], None],
    munged: Tracked,
) -> None:
    """slurmctld, which reads the state it saved last (StateSaveLocation: jobs, queue,
    node states) unless there is none; returns once it answers."""
    ctld = spawn(["slurmctld", "-D", "-i", "-f", str(lay.conf_path)], lay, "slurmctld", keep)
    record("slurmctld", ctld)
    wait(slurm(lay).ping, "slurmctld to answer", lay, {"munged": munged, "slurmctld": ctld})


def stop_slurmd(name: str, reaper: Tracked | None) -> None:
    """SIGTERM the slurmd of node ``name`` (run by ``reaper``), as an administrator's
    restart does: slurmstepd and the job's tasks go on running. Raises SandboxError
    when it is not running."""
    table = procs.parents()
    children = [pid for pid, parent in table.items() if reaper and parent == reaper.pid]
    slurmd = [pid for pid in children if _comm(pid) == "slurmd"]
    if reaper is None or not reaper.alive() or not slurmd:
        raise SandboxError(f"node {name} is not running; start it with start-node")
    procs.kill(slurmd, signal.SIGTERM)
    if procs.wait_gone(slurmd, timeout_s=10):
        procs.kill(slurmd, signal.SIGKILL)
        procs.wait_gone(slurmd, timeout_s=5)


def _comm(pid: int) -> str:
    try:
        return (procs.PROC / str(pid) / "comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def start_slurmd(lay: Layout, node: Node, keep: dict[int, subprocess.Popen[bytes]]) -> Tracked:
    reaper = [sys.executable, "-m", "hpclaunch.sandbox.reaper"]
    slurmd = ["slurmd", "-D", "-N", node.name, "-f", str(lay.conf_path)]
    if lay.mode is Mode.NETNS:
        # Not `ip netns exec`: it remounts /sys and slurmd 22.05 then dies at start.
        setup = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'
        argv = [
            "nsenter",
            f"--net={net.netns_path(node)}",
            "unshare",
            "--mount",
            "--uts",
            "--",
            "/bin/sh",
            "-c",
            setup,
            "sh",
            str(lay.state_dir / "etc" / "hosts"),
            node.name,
            *reaper,
            *slurmd,
        ]
    else:
        argv = [*reaper, *slurmd]
    return spawn(argv, lay, node.name, keep)


def wait_responding(
    lay: Layout, names: list[str], watched: Mapping[str, Tracked], idle: bool
) -> None:
    """Until every node in ``names`` answers the controller (and is idle, if asked)."""
    client = slurm(lay)

    def ready() -> bool:
        states = client.node_states()
        wanted = NodeState("idle")
        return all(
            (states.get(n) == wanted) if idle else states.get(n, NodeState("?", False)).responding
            for n in names
        )

    wait(
        ready,
        "every node to be idle" if idle else f"{', '.join(names)} to answer",
        lay,
        watched,
        lambda: node_states_text(lay),
    )


def kill_node(lay: Layout, name: str, tracked: Tracked | None) -> None:
    """SIGKILL every process of the node, the reaper last: while it lives it adopts
    what a dying process leaves behind, so each pass finds the orphans of the last."""
    node = lay.node(name)
    reaper = tracked if tracked is not None and tracked.alive() else None
    marker = node_marker(lay, name).encode()
    for _ in range(50):
        table = procs.parents()
        victims = procs.descendants(reaper.pid, table) if reaper else []
        for pid in procs.with_environ(marker, table):  # found even if the reaper is gone
            if not reaper or pid != reaper.pid:
                victims += [pid, *procs.descendants(pid, table)]
        victims = sorted(set(victims))
        if lay.mode is Mode.NETNS:
            victims += [
                p for p in procs.in_netns(net.netns_path(node)) if not reaper or p != reaper.pid
            ]
        if not victims:
            break
        procs.kill(victims, signal.SIGKILL)
        procs.wait_gone(victims, timeout_s=5)
    else:
        raise SandboxError(f"processes of {name} kept appearing while it was being killed")
    if reaper is not None:
        procs.kill([reaper.pid], signal.SIGKILL)
        procs.wait_gone([reaper.pid], timeout_s=5)


def kill_stragglers(lay: Layout, passes: int = 5) -> list[int]:
    """SIGKILL what still carries a node's marker once every node and daemon has been
    stopped; returns the pids that outlived every pass (none, normally)."""
    markers = [node_marker(lay, node.name).encode() for node in lay.nodes]
    left: list[int] = []
    for _ in range(passes):
        table = procs.parents()
        left = sorted({pid for marker in markers for pid in procs.with_environ(marker, table)})
        if not left:
            break
        procs.kill(left, signal.SIGKILL)
        left = procs.wait_gone(left, timeout_s=5)
    return left


def stop(tracked: Tracked | None) -> None:
    """SIGTERM a daemon, SIGKILL it if it is still there after 5 s."""
    if tracked is None or not tracked.alive():
        return
    procs.kill([tracked.pid], signal.SIGTERM)
    if procs.wait_gone([tracked.pid], timeout_s=5):
        procs.kill([tracked.pid], signal.SIGKILL)
        procs.wait_gone([tracked.pid], timeout_s=5)
