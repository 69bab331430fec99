"""Where a new sandbox goes: loopback or network namespaces, a free link-name id,
subnet and block of TCP ports, so that sandboxes side by side never collide."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hpclaunch.errors import SandboxError
from hpclaunch.sandbox import conf, net
from hpclaunch.sandbox.conf import Mode, Placement, SandboxSpec

log = logging.getLogger(__name__)


def choose_mode(mode: Mode) -> Mode:
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


# One file for the machine: whoever places a sandbox holds it until its daemons listen.
MACHINE_LOCK = Path(tempfile.gettempdir()) / "hpclaunch-sandbox-placement.lock"


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """Hold the machine-wide placement lock (blocks while another up holds it)."""
    with MACHINE_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def place(state_dir: Path, spec: SandboxSpec, mode: Mode) -> Placement:
    """A free link-name id, subnet and port block for a new sandbox."""
    sid = conf.short_id(state_dir)
    while net.links_with_prefix(f"hs{sid}"):  # another sandbox's, or a leftover
        sid = f"{random.randrange(0x10000):04x}"
    used = net.subnets_in_use() if mode is Mode.NETNS else set()
    preferred = int(sid, 16) % 250 + 1
    free = [x for x in [preferred, *range(1, 251)] if x not in used]
    if not free:
        raise SandboxError(
            "every 10.254.X.0/24 network is in use here; run down on other sandboxes"
        )
    return Placement(sid, free[0], _free_port_block(spec.nodes + 1))


def _free_port_block(count: int) -> int:
    """The first of ``count`` consecutive TCP ports that nothing listens on now; above
    the ports jobs derive from their ids (hpclaunch.slurm.env), below the ephemeral range."""
    for _ in range(200):
        base = random.randrange(25000, 30000 - count)
        try:
            for port in range(base, base + count):
                with socket.socket() as probe:
                    probe.bind(("0.0.0.0", port))
        except OSError:
            continue
        return base
    raise SandboxError("found no block of free TCP ports between 25000 and 30000")
