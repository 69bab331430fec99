"""Network namespaces for netns mode: one per node, veth pairs on a bridge.

Only the sandbox's own private addresses are used; the bridge's address in
the host's namespace is where the nodes reach slurmctld.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from hpclaunch.errors import SandboxError
from hpclaunch.sandbox.conf import Layout, Node

NETNS_DIR = Path("/run/netns")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``. Raises SandboxError when ``check`` and it fails."""
    argv = ["ip", *args]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except FileNotFoundError:
        raise SandboxError("ip is not installed; apt-get install iproute2") from None
    if check and result.returncode != 0:
        raise SandboxError(
            f"{' '.join(argv)} failed: {result.stderr.strip()}; if a sandbox that was not "
            "shut down holds it, run hpclaunch sandbox down with its --state-dir"
        )
    return result


def netns_path(node: Node) -> Path:
    return NETNS_DIR / node.netns


def netns_permitted() -> str | None:
    """None if network namespaces can be made here, else why not."""
    probe = f"hpclaunch-probe-{os.getpid()}"
    result = ip("netns", "add", probe, check=False)
    if result.returncode != 0:
        return result.stderr.strip() or "ip netns add failed"
    ip("netns", "del", probe, check=False)
    return None


def create(lay: Layout) -> None:
    """The bridge, and per node a namespace with a veth pair on the bridge."""
    ip("link", "add", lay.bridge, "type", "bridge")
    ip("addr", "add", f"{lay.controller_addr}/24", "dev", lay.bridge)
    ip("link", "set", lay.bridge, "up")
    for node in lay.nodes:
        ip("netns", "add", node.netns)
        peer = ("peer", "name", "eth0", "netns", node.netns)
        ip("link", "add", node.host_link, "type", "veth", *peer)
        ip("link", "set", node.host_link, "master", lay.bridge, "up")
        inside: Sequence[Sequence[str]] = (
            ("addr", "add", f"{node.addr}/24", "dev", "eth0"),
            ("link", "set", "eth0", "up"),
            ("link", "set", "lo", "up"),
        )
        for args in inside:
            ip("-n", node.netns, *args)


def destroy(lay: Layout) -> None:
    """Remove what ``create`` made; missing parts are fine (idempotent)."""
    for node in lay.nodes:
        ip("link", "del", node.host_link, check=False)
        if netns_path(node).exists():
            ip("netns", "del", node.netns, check=False)
    ip("link", "del", lay.bridge, check=False)


def set_link(node: Node, up: bool) -> None:
    """Cut a node off the network (``up=False``) or heal it."""
    ip("link", "set", node.host_link, "up" if up else "down")


def leftovers(lay: Layout) -> list[str]:
    """Namespaces and links of this sandbox that still exist."""
    names = {n.netns for n in lay.nodes}
    links = {n.host_link for n in lay.nodes} | {lay.bridge}
    listed = ip("netns", "list", check=False).stdout.splitlines()
    found = [line.split()[0] for line in listed if line]
    present = ip("-o", "link", "show", check=False).stdout
    out = [f"netns {name}" for name in found if name in names]
    out += [f"link {link}" for link in sorted(links) if re.search(rf" {link}[:@]", present)]
    return out


def subnets_in_use() -> set[int]:
    """Third octets of the 10.254.X.0/24 networks this machine already has addresses in."""
    out = set()
    for line in ip("-o", "-4", "addr", "show", check=False).stdout.splitlines():
        match = re.search(r" inet 10\.254\.(\d+)\.", line)
        if match:
            out.add(int(match.group(1)))
    return out


def links_with_prefix(prefix: str) -> list[str]:
    """Namespaces and links whose names start with ``prefix`` (for leak checks)."""
    netns = [
        line.split()[0] for line in ip("netns", "list", check=False).stdout.splitlines() if line
    ]
    links = re.findall(r"^\d+: ([^:@]+)", ip("-o", "link", "show", check=False).stdout, re.M)
    return sorted(name for name in [*netns, *links] if name.startswith(prefix))
