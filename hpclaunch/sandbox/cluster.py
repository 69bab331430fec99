"""The sandbox: a real SLURM cluster (munged, slurmctld, one slurmd per node) on
this machine, started and stopped by PID, with all state in one folder.

``Sandbox(state_dir)`` is the whole interface: ``up``, ``down``, ``status``,
``env`` and the fault injections. The state file records what was asked for
and every process started (PID and start time); everything else (names,
addresses, ports) is derived from it again by ``conf.layout``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpclaunch.sandbox import conf, net, procs
from hpclaunch.sandbox.conf import Layout, Mode, Partitions, SandboxSpec
from hpclaunch.sandbox.net import SandboxError
from hpclaunch.slurm import NodeState, Slurm

log = logging.getLogger(__name__)

REQUIRED_COMMANDS = {
    "munged": "munge",
    "mungekey": "munge",
    "slurmctld": "slurmctld (or slurm-wlm)",
    "slurmd": "slurmd (or slurm-wlm)",
    "sinfo": "slurm-client (or slurm-wlm)",
    "scontrol": "slurm-client (or slurm-wlm)",
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
}
START_TIMEOUT_S = 30.0
_CONF_SAFE = re.compile(r"[A-Za-z0-9._/+@:,-]+\Z")
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def default_state_dir(env: dict[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/hpclaunch/sandbox``, by default ``~/.cache/hpclaunch/sandbox``."""
    env = dict(os.environ) if env is None else env
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return Path(cache) / "hpclaunch" / "sandbox"


def _wait(
    condition: Callable[[], bool], what: str, logs: Path, daemons: dict[str, list[int]]
) -> None:
    """Poll ``condition``; fail at once, quoting its output, if a daemon dies meanwhile."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        for name, rec in daemons.items():
            if not procs.Tracked(*rec).alive():
                out = logs / f"{name if name in ('munged', 'slurmctld') else 'slurmd-' + name}.out"
                tail = (
                    out.read_text(errors="replace").strip().splitlines()[-3:]
                    if out.exists()
                    else []
                )
                raise SandboxError(
                    f"{name} exited while waiting for {what}: "
                    + (" | ".join(tail) or "no output")
                    + f"; see {logs}"
                )
        if time.monotonic() > deadline:
            raise SandboxError(
                f"timed out after {START_TIMEOUT_S:g} s waiting for {what}; see {logs}"
            )
        time.sleep(0.05)


def _free_port_block(count: int) -> int:
    """The first of ``count`` consecutive TCP ports that nothing listens on now."""
    for _ in range(200):
        base = random.randrange(20000, 30000)
        try:
            for port in range(base, base + count):
                with socket.socket() as probe:
                    probe.bind(("0.0.0.0", port))
        except OSError:
            continue
        return base
    raise SandboxError("found no block of free TCP ports between 20000 and 30000")


@dataclass
class Sandbox:
    """The sandbox whose state lives in ``state_dir``."""

    state_dir: Path
    # Daemons this object started: kept so their exit can be reaped (no zombies).
    _children: dict[int, subprocess.Popen[bytes]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    # -- state -----------------------------------------------------------------

    def _load(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return None
        return data

    def _save(self, state: dict[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.state_file)

    def layout(self) -> Layout:
        """The running sandbox's layout. Raises SandboxError if none is up."""
        return _layout_of(self.state_dir, self._require())

    def env(self) -> dict[str, str]:
        """What a SLURM client needs to talk to this sandbox."""
        return {"SLURM_CONF": str(self.layout().conf_path)}

    def slurm(self) -> Slurm:
        """SLURM's commands pointed at this sandbox."""
        environ = dict(os.environ)
        environ["PATH"] = f"{environ.get('PATH', '')}:{SBIN_PATH}"
        environ.update(self.env())
        return Slurm(env=environ, timeout_s=15)

    # -- up / down -------------------------------------------------------------

    def up(self, spec: SandboxSpec) -> Layout:
        """Start the sandbox, or return the one already up with the same settings.

        Raises SandboxError naming what is missing or what failed.
        """
        if not _CONF_SAFE.match(str(self.state_dir)):
            raise SandboxError(
                f"the state folder {str(self.state_dir)!r} has characters slurm.conf cannot "
                "hold (spaces, quotes, '#', '='); choose another --state-dir"
            )
        state = self._load()
        if state is not None:
            running = _layout_of(self.state_dir, state)
            if self._all_alive(state):
                wanted_mode = spec.mode in (Mode.AUTO, running.mode)
                if running.spec == _with_mode(spec, running.spec.mode) and wanted_mode:
                    return running
                raise SandboxError(
                    f"a sandbox with other settings is up in {self.state_dir}; "
                    "run hpclaunch sandbox down first"
                )
            self.down()  # a half-dead sandbox from before: clear it
        mode = _choose_mode(spec.mode)
        lay = conf.layout(self.state_dir, spec, mode, _free_port_block(spec.nodes + 1))
        state = {"spec": _spec_json(spec), "mode": mode.value, "base_port": lay.controller_port}
        self._prepare_files(lay)
        self._save({**state, "procs": {}})
        try:
            if mode is Mode.NETNS:
                net.create(lay)
            procs_started = self._start_daemons(lay, state)
        except BaseException:
            self.down()
            raise
        self._save({**state, "procs": procs_started})
        log.info("sandbox: %d nodes up in %s mode", spec.nodes, mode.value)
        return lay

    def down(self) -> list[str]:
        """Stop every process of the sandbox and remove its namespaces and links.

        Idempotent. Returns what could not be removed (empty when all is gone).
        """
        state = self._load()
        if state is None:
            return []
        lay = _layout_of(self.state_dir, state)
        recorded = state.get("procs", {})
        for node in lay.nodes:
            self._kill_node_processes(lay, node.name, recorded.get(node.name))
        for name in ("slurmctld", "munged"):
            _stop(recorded.get(name))
        if lay.mode is Mode.NETNS:
            net.destroy(lay)
        self._reap()
        left = net.leftovers(lay) if lay.mode is Mode.NETNS else []
        left += [f"process {pid}" for pid in self._live_pids(lay, recorded)]
        if not left:
            self.state_file.unlink(missing_ok=True)
            for sub in ("ctld", "spool", "run", "munge", "dev", "etc"):
                shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        return left

    # -- status ----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What is running: mode, daemons, and each node's SLURM state."""
        state = self._load()
        if state is None:
            return {"up": False, "state_dir": str(self.state_dir)}
        lay = _layout_of(self.state_dir, state)
        recorded = state.get("procs", {})
        states: dict[str, NodeState] = {}
        if self.slurm().ping():
            states = self.slurm().node_states()
        return {
            "up": self._all_alive(state),
            "state_dir": str(self.state_dir),
            "mode": lay.mode.value,
            "slurm_conf": str(lay.conf_path),
            "daemons": {
                name: {"pid": rec[0], "alive": procs.Tracked(*rec).alive()}
                for name, rec in recorded.items()
            },
            "nodes": {
                n.name: {
                    "addr": n.addr,
                    "switch": n.switch,
                    "state": states[n.name].state if n.name in states else "unknown",
                    "responding": states[n.name].responding if n.name in states else False,
                }
                for n in lay.nodes
            },
        }

    # -- faults ----------------------------------------------------------------

    def kill_node(self, name: str) -> None:
        """Kill the node's slurmd and every process of the node, as a crash would."""
        state = self._require()
        lay = _layout_of(self.state_dir, state)
        lay.node(name)
        self._kill_node_processes(lay, name, state["procs"].get(name))
        self._reap()

    def start_node(self, name: str) -> None:
        """Start a killed node's slurmd again. Raises SandboxError if it is running."""
        state = self._require()
        lay = _layout_of(self.state_dir, state)
        node = lay.node(name)
        rec = state["procs"].get(name)
        if rec is not None and procs.Tracked(*rec).alive():
            raise SandboxError(f"node {name} is running; kill-node it first")
        state["procs"][name] = self._start_slurmd(lay, node)
        self._save(state)

    def cut_node(self, name: str, *, heal: bool = False) -> None:
        """Cut the node off the network (or heal it). netns mode only."""
        lay = _layout_of(self.state_dir, self._require())
        node = lay.node(name)
        if lay.mode is not Mode.NETNS:
            raise SandboxError(
                "cutting a node off the network needs netns mode; this sandbox runs in "
                "loopback mode (hpclaunch sandbox down, then up --mode netns)"
            )
        net.set_link(node, up=heal)

    def set_node_state(self, name: str, state: str, reason: str) -> None:
        """``scontrol update`` the node to ``state`` (DOWN, DRAIN, RESUME)."""
        self.layout().node(name)
        self.slurm().update_node(name, state, reason)

    # -- internals -------------------------------------------------------------

    def _reap(self) -> None:
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[pid]

    def _require(self) -> dict[str, Any]:
        state = self._load()
        if state is None:
            raise SandboxError(
                f"no sandbox is up in {self.state_dir}; start one with hpclaunch sandbox up"
            )
        return state

    def _all_alive(self, state: dict[str, Any]) -> bool:
        recorded = state.get("procs", {})
        return bool(recorded) and all(procs.Tracked(*rec).alive() for rec in recorded.values())

    def _prepare_files(self, lay: Layout) -> None:
        d = self.state_dir
        for sub in ("etc", "ctld", "run", "log", "dev"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        for node in lay.nodes:
            (d / "spool" / node.name).mkdir(parents=True, exist_ok=True)
        # munged wants its folder private and every ancestor searchable.
        (d / "munge").mkdir(mode=0o700, exist_ok=True)
        os.chmod(d, 0o755)
        (d / "etc" / "slurm.conf").write_text(conf.slurm_conf(lay))
        (d / "etc" / "topology.conf").write_text(conf.topology_conf(lay))
        (d / "etc" / "gres.conf").write_text(conf.gres_conf(lay))
        (d / "etc" / "hosts").write_text(conf.hosts_file(lay))
        for i in range(lay.spec.gpus_per_node):
            device = conf.gpu_device(lay, i)
            if not device.exists():
                # Character devices with NVIDIA's major number: GRES binds them like GPUs.
                os.mknod(device, 0o666 | 0o020000, os.makedev(195, i))
        key = d / "munge" / "munge.key"
        if not key.exists():
            create = ["mungekey", "--create", f"--keyfile={key}"]
            subprocess.run(create, check=True, capture_output=True)
        key.chmod(0o600)

    def _daemon_env(self, lay: Layout) -> dict[str, str]:
        return {
            "PATH": SBIN_PATH,
            "SLURM_CONF": str(lay.conf_path),
            "HOME": "/root",
            "LANG": "C.UTF-8",
        }

    def _spawn(self, argv: list[str], lay: Layout, log_name: str) -> list[int]:
        with (self.state_dir / "log" / log_name).open("ab") as out:
            proc = subprocess.Popen(
                argv, env=self._daemon_env(lay), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self._children[proc.pid] = proc
        tracked = procs.Tracked.of(proc.pid)
        return [tracked.pid, tracked.start_time]

    def _start_daemons(self, lay: Layout, state: dict[str, Any]) -> dict[str, list[int]]:
        d = self.state_dir
        started: dict[str, list[int]] = {}
        logs = d / "log"

        def save() -> None:  # record each PID at once, so a failed up can be torn down
            self._save({**state, "procs": started})

        started["munged"] = self._spawn(
            ["munged", "--foreground", "--force", f"--socket={lay.munge_socket}",
             f"--key-file={d}/munge/munge.key", f"--log-file={d}/log/munged.log",
             f"--pid-file={d}/run/munged.pid", f"--seed-file={d}/munge/seed"],
            lay, "munged.out",
        )  # fmt: skip
        save()
        _wait(lay.munge_socket.exists, "munged's socket", logs, started)
        started["slurmctld"] = self._spawn(
            ["slurmctld", "-D", "-i", "-f", str(lay.conf_path)], lay, "slurmctld.out"
        )
        save()
        slurm = self.slurm_for(lay)
        _wait(slurm.ping, "slurmctld to answer", logs, started)
        for node in lay.nodes:
            started[node.name] = self._start_slurmd(lay, node)
            save()

        def all_idle() -> bool:
            states = slurm.node_states()
            return all(
                states.get(n.name, NodeState("unknown")).state == "idle"
                and states[n.name].responding
                for n in lay.nodes
            )

        _wait(all_idle, "every node to be idle", logs, started)
        return started

    def slurm_for(self, lay: Layout) -> Slurm:
        environ = self._daemon_env(lay)
        return Slurm(env=environ, timeout_s=15)

    def _start_slurmd(self, lay: Layout, node: conf.Node) -> list[int]:
        reaper = [sys.executable, "-m", "hpclaunch.sandbox.reaper"]
        slurmd = ["slurmd", "-D", "-N", node.name, "-f", str(lay.conf_path)]
        if lay.mode is Mode.NETNS:
            # Not `ip netns exec`: it remounts /sys and slurmd 22.05 then dies at start.
            setup = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'
            argv = [
                "nsenter", f"--net={net.netns_path(node)}", "unshare", "--mount", "--uts", "--",
                "/bin/sh", "-c", setup, "sh", str(self.state_dir / "etc" / "hosts"), node.name,
                *reaper, *slurmd,
            ]  # fmt: skip
        else:
            argv = [*reaper, *slurmd]
        return self._spawn(argv, lay, f"slurmd-{node.name}.out")

    def _kill_node_processes(self, lay: Layout, name: str, rec: list[int] | None) -> None:
        """SIGKILL the node's reaper tree (it adopts the node's orphans) and, in
        netns mode, anything else still in the node's namespace."""
        node = lay.node(name)
        for _ in range(5):  # a process may fork while it is being killed
            victims = []
            if rec is not None and procs.Tracked(*rec).alive():
                victims = [*procs.descendants(rec[0]), rec[0]]
            if lay.mode is Mode.NETNS:
                victims += procs.in_netns(net.netns_path(node))
            if not victims:
                return
            procs.kill(victims, signal.SIGKILL)
            procs.wait_gone(victims, timeout_s=5)

    def _live_pids(self, lay: Layout, recorded: dict[str, list[int]]) -> list[int]:
        pids = [rec[0] for rec in recorded.values() if procs.Tracked(*rec).alive()]
        if lay.mode is Mode.NETNS:
            for node in lay.nodes:
                pids += procs.in_netns(net.netns_path(node))
        return pids


def _stop(rec: list[int] | None) -> None:
    """SIGTERM a daemon, SIGKILL it if it is still there after 5 s."""
    if rec is None or not procs.Tracked(*rec).alive():
        return
    procs.kill([rec[0]], signal.SIGTERM)
    if procs.wait_gone([rec[0]], timeout_s=5):
        procs.kill([rec[0]], signal.SIGKILL)
        procs.wait_gone([rec[0]], timeout_s=5)


def _choose_mode(mode: Mode) -> Mode:
    if mode is Mode.LOOPBACK:
        return mode
    why = "it needs root" if os.geteuid() != 0 else net.netns_permitted()
    if why is None:
        return Mode.NETNS
    if mode is Mode.NETNS:
        raise SandboxError(
            f"network namespaces are not available here ({why}); use --mode loopback"
        )
    log.warning("sandbox: no network namespaces (%s); running in loopback mode", why)
    return Mode.LOOPBACK


def check_prerequisites(euid: int | None = None, path: str | None = None) -> None:
    """Raise SandboxError saying exactly what to install or how to run.

    ``euid`` and ``path`` default to this process's.
    """
    if (os.geteuid() if euid is None else euid) != 0:
        raise SandboxError(
            "the sandbox runs slurmd, which starts jobs as any user, so it needs root; "
            "run hpclaunch sandbox as root (sudo -E hpclaunch sandbox up)"
        )
    path = f"{os.environ.get('PATH', '')}:{SBIN_PATH}" if path is None else path
    missing = sorted(
        {pkg for cmd, pkg in REQUIRED_COMMANDS.items() if not shutil.which(cmd, path=path)}
    )
    if missing:
        raise SandboxError(
            f"missing commands from these Debian packages: {', '.join(missing)}; "
            "install them with apt-get install slurm-wlm munge iproute2 util-linux"
        )


def _spec_json(spec: SandboxSpec) -> dict[str, Any]:
    return {
        "nodes": spec.nodes,
        "gpus_per_node": spec.gpus_per_node,
        "partitions": spec.partitions.value,
        "mode": spec.mode.value,
    }


def _with_mode(spec: SandboxSpec, mode: Mode) -> SandboxSpec:
    return SandboxSpec(spec.nodes, spec.gpus_per_node, spec.partitions, mode)


def _layout_of(state_dir: Path, state: dict[str, Any]) -> Layout:
    raw = state["spec"]
    spec = SandboxSpec(
        nodes=raw["nodes"],
        gpus_per_node=raw["gpus_per_node"],
        partitions=Partitions(raw["partitions"]),
        mode=Mode(raw["mode"]),
    )
    return conf.layout(state_dir, spec, Mode(state["mode"]), state["base_port"])
