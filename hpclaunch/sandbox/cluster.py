"""The sandbox: a real SLURM cluster (munged, slurmctld, one slurmd per node) on
this machine, started and stopped by PID, with all state in one folder.

``Sandbox(state_dir)`` is the whole interface: ``up``, ``down``, ``status``,
``env`` and the fault injections. Operations that change the sandbox hold a
lock on its folder, so two commands never interleave.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hpclaunch.errors import HpclaunchError, SandboxError
from hpclaunch.procs import Tracked
from hpclaunch.sandbox import conf, daemons, files, net, placement, state
from hpclaunch.sandbox.conf import Layout, Mode, SandboxSpec
from hpclaunch.sandbox.daemons import SBIN_PATH
from hpclaunch.sandbox.state import SandboxState, UpAction
from hpclaunch.slurm.commands import NodeState, Slurm

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
MARKER = ".hpclaunch-sandbox"
# slurm.conf values end at whitespace, and AuthInfo's at a comma.
_CONF_SAFE = re.compile(r"[A-Za-z0-9._/+-]+\Z")
_OWN_DIRS = ("etc", "ctld", "run", "dev", "spool", "munge")


class NodeAction(enum.Enum):
    """What ``scontrol update`` does to a node."""

    DOWN = "DOWN"
    DRAIN = "DRAIN"
    RESUME = "RESUME"


def default_state_dir(env: dict[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/hpclaunch/sandbox``, by default ``~/.cache/hpclaunch/sandbox``."""
    env = dict(os.environ) if env is None else env
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return Path(cache) / "hpclaunch" / "sandbox"


@dataclass
class Sandbox:
    """The sandbox whose state lives in ``state_dir`` (made absolute and resolved)."""

    state_dir: Path
    # Daemons this object started: kept so their exit can be reaped (no zombies).
    _children: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.state_dir = self.state_dir.expanduser().resolve()

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    def _state(self) -> SandboxState:
        current = state.read(self.state_file)
        if current is None:
            raise SandboxError(
                f"no sandbox is up in {self.state_dir}; start one with hpclaunch sandbox up"
            )
        return current

    def layout(self) -> Layout:
        """The sandbox's layout. Raises SandboxError if none is up."""
        return _layout(self.state_dir, self._state())

    def env(self) -> dict[str, str]:
        """What a SLURM client needs to talk to this sandbox."""
        return {"SLURM_CONF": str(self.layout().conf_path)}

    def slurm(self) -> Slurm:
        """SLURM's client commands pointed at this sandbox."""
        return daemons.slurm(self.layout())

    @contextlib.contextmanager
    def _locked(self, create: bool = False) -> Iterator[bool]:
        """Hold the folder's lock; yields False (and locks nothing) when the folder
        does not exist and ``create`` is not set: there is no sandbox to change."""
        if not self.state_dir.is_dir():
            if not create:
                yield False
                return
            self.state_dir.mkdir(parents=True)
        with (self.state_dir / "lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield True

    # -- up / down -------------------------------------------------------------

    def up(self, spec: SandboxSpec) -> Layout:
        """Start the sandbox, or return the one already up with the same settings.

        Raises SandboxError naming what is missing or what failed; a failed or
        interrupted up is torn down again.
        """
        if not _CONF_SAFE.match(str(self.state_dir)):
            raise SandboxError(
                f"the state folder {str(self.state_dir)!r} has characters slurm.conf cannot "
                "hold (spaces, quotes, commas, '#', '='); choose another --state-dir"
            )
        self._refuse_foreign_folder()
        with self._locked(create=True):
            current = state.read(self.state_file)
            action = state.decide_up(current, spec)
            if current is not None and action is UpAction.REUSE:
                return _layout(self.state_dir, current)
            if current is not None and action is UpAction.REPAIR:
                for name in current.dead():
                    current = self._start_node(current, name)
                return _layout(self.state_dir, current)
            if current is not None and action is UpAction.CONFLICT:
                raise SandboxError(
                    f"a sandbox with other settings is up in {self.state_dir} "
                    f"({state.differences(current, spec)}); run hpclaunch sandbox down first"
                )
            if current is not None:  # broken or half-started: clear it
                log.warning(
                    "sandbox: replacing a sandbox whose %s is gone", ", ".join(current.dead())
                )
                left = self._down(current)
                if left:
                    raise SandboxError(f"could not clear the old sandbox: {', '.join(left)}")
            self._claim_folder()
            # Held from choosing the subnet, link names and ports until the daemons
            # listen on them: two sandboxes coming up at once would otherwise pick the same.
            with placement.machine_lock():
                mode = placement.choose_mode(spec.mode)
                place = placement.place(self.state_dir, spec, mode)
                lay = conf.layout(self.state_dir, spec, mode, place)
                record = SandboxState(spec, mode, place)
                state.write(self.state_file, record)
                try:
                    files.prepare_files(lay)
                    if mode is Mode.NETNS:
                        net.create(lay)
                    procs: dict[str, Tracked] = {}

                    def keep(name: str, tracked: Tracked) -> None:  # recorded at once: a failed
                        procs[name] = tracked  # up can then be torn down
                        state.write(self.state_file, replace(record, procs=dict(procs)))

                    daemons.start_control(lay, self._children, keep)
                    for node in lay.nodes:
                        keep(node.name, daemons.start_slurmd(lay, node, self._children))
                    daemons.wait_responding(lay, [n.name for n in lay.nodes], procs, idle=True)
                    state.write(self.state_file, replace(record, procs=procs, complete=True))
                except BaseException:
                    self._down(state.read(self.state_file) or record)
                    raise
        log.info("sandbox: %d nodes up in %s mode", spec.nodes, mode.value)
        return lay

    def down(self) -> list[str]:
        """Stop every process of the sandbox and remove its namespaces and links.

        Idempotent. Returns what could not be removed (empty when all is gone).
        """
        with self._locked() as exists:
            current = state.read(self.state_file) if exists else None
            return [] if current is None else self._down(current)

    def _down(self, current: SandboxState) -> list[str]:
        lay = _layout(self.state_dir, current)
        for node in lay.nodes:
            daemons.kill_node(lay, node.name, current.procs.get(node.name))
        for name in reversed(state.CONTROL_DAEMONS):
            daemons.stop(current.procs.get(name))
        # Until slurmctld was gone, it could still reach a node's slurmd with a request
        # that slurmd forks to serve: once in CI a fork outlived its node's kill.
        stragglers = daemons.kill_stragglers(lay)
        if lay.mode is Mode.NETNS:
            net.destroy(lay)
        self._reap()
        left = net.leftovers(lay) if lay.mode is Mode.NETNS else []
        left += [f"{name} (pid {t.pid})" for name, t in current.procs.items() if t.alive()]
        left += [f"a process of the sandbox's nodes (pid {pid})" for pid in stragglers]
        if not left:
            self.state_file.unlink(missing_ok=True)
            for sub in _OWN_DIRS:
                shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        return left

    # -- status ----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What is running: mode, daemons, and each node's SLURM state."""
        current = state.read(self.state_file)
        if current is None:
            return {"up": False, "state_dir": str(self.state_dir)}
        lay = _layout(self.state_dir, current)
        states: dict[str, NodeState] = {}
        with contextlib.suppress(HpclaunchError):
            states = daemons.slurm(lay).node_states()
        unknown = NodeState("unknown", responding=False)
        return {
            "up": current.healthy(),
            "dead": current.dead(),
            "state_dir": str(self.state_dir),
            "mode": lay.mode.value,
            "slurm_conf": str(lay.conf_path),
            "daemons": {
                name: {"pid": t.pid, "alive": t.alive()} for name, t in current.procs.items()
            },
            "nodes": {
                n.name: {
                    "addr": n.addr,
                    "switch": n.switch,
                    "state": states.get(n.name, unknown).state,
                    "responding": states.get(n.name, unknown).responding,
                }
                for n in lay.nodes
            },
        }

    # -- faults ----------------------------------------------------------------

    def kill_node(self, name: str) -> None:
        """Kill the node's slurmd and every process of the node, as a crash would; in
        netns mode its link goes down first, so its peers hear nothing more from it."""
        with self._locked():
            current = self._state()
            lay = _layout(self.state_dir, current)
            node = lay.node(name)
            if lay.mode is Mode.NETNS:
                net.set_link(node, up=False)
            daemons.kill_node(lay, name, current.procs.get(name))
            self._reap()

    def start_node(self, name: str) -> None:
        """Start a killed node again and wait until it answers; if it was marked
        DOWN meanwhile, return it to service."""
        with self._locked():
            current = self._state()
            old = current.procs.get(name)
            if old is not None and old.alive():
                raise SandboxError(f"node {name} is running; kill-node it first")
            self._start_node(current, name)

    def _start_node(self, current: SandboxState, name: str) -> SandboxState:
        lay = _layout(self.state_dir, current)
        node = lay.node(name)
        if lay.mode is Mode.NETNS:
            net.set_link(node, up=True)
        tracked = daemons.start_slurmd(lay, node, self._children)
        current = replace(current, procs={**current.procs, name: tracked})
        state.write(self.state_file, current)
        daemons.wait_responding(lay, [name], {name: tracked}, idle=False)
        client = daemons.slurm(lay)
        if client.node_states()[name].state in ("down", "drained", "draining"):
            client.update_node(name, NodeAction.RESUME.value)
            daemons.wait_responding(lay, [name], {name: tracked}, idle=True)
        return current

    def restart_node(self, name: str) -> None:
        """Restart the node's slurmd as an administrator does (SIGTERM, then a new one):
        its jobs go on running and the new slurmd takes them over."""
        with self._locked():
            current = self._state()
            _layout(self.state_dir, current).node(name)
            daemons.stop_slurmd(name, current.procs.get(name))
            self._start_node(current, name)

    def stop_controller(self) -> None:
        """Stop slurmctld as an administrator does (SIGTERM: it saves its state first);
        the jobs go on running on the nodes. Nothing happens when it is stopped."""
        with self._locked():
            daemons.stop(self._state().procs.get("slurmctld"))

    def start_controller(self) -> None:
        """Start a stopped slurmctld with the state it saved (jobs, queue, nodes) and
        wait until it answers."""
        with self._locked():
            current = self._state()
            running = {n: t.alive() for n, t in current.procs.items() if n in state.CONTROL_DAEMONS}
            if running.get("slurmctld"):
                raise SandboxError("slurmctld is running; stop it first with stop-controller")
            if not running.get("munged"):
                raise SandboxError("munged is gone too; hpclaunch sandbox up starts a new sandbox")

            def record(name: str, tracked: Tracked) -> None:
                state.write(
                    self.state_file, replace(current, procs={**current.procs, name: tracked})
                )

            lay = _layout(self.state_dir, current)
            daemons.start_slurmctld(lay, self._children, record, current.procs["munged"])

    def cut_node(self, name: str, *, heal: bool = False) -> None:
        """Cut the node off the network (or heal it). netns mode only."""
        lay = self.layout()
        node = lay.node(name)
        if lay.mode is not Mode.NETNS:
            raise SandboxError(
                "cutting a node off the network needs netns mode; this sandbox runs in "
                "loopback mode (hpclaunch sandbox down, then up --mode netns)"
            )
        net.set_link(node, up=heal)

    def set_node_state(self, name: str, action: NodeAction, reason: str) -> None:
        """``scontrol update NodeName=NAME State=ACTION Reason=REASON``."""
        self.layout().node(name)
        self.slurm().update_node(name, action.value, reason)

    # -- internals -------------------------------------------------------------

    def _reap(self) -> None:
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[pid]

    def _refuse_foreign_folder(self) -> None:
        """Refuse a folder that holds something else: down deletes what up made there."""
        if not self.state_dir.is_dir() or (self.state_dir / MARKER).exists():
            return
        entries = sorted(p.name for p in self.state_dir.iterdir())
        if entries:
            raise SandboxError(
                f"{self.state_dir} already holds files ({', '.join(entries[:3])}) and is "
                "not a sandbox folder; choose an empty or new --state-dir"
            )

    def _claim_folder(self) -> None:
        (self.state_dir / MARKER).touch()
        mode = self.state_dir.stat().st_mode
        if mode & 0o005 != 0o005:  # munged wants every ancestor of its socket searchable
            os.chmod(self.state_dir, mode | 0o005)


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


def _layout(state_dir: Path, current: SandboxState) -> Layout:
    return conf.layout(state_dir, current.spec, current.mode, current.place)
