"""The session's sandbox: a real 4-node SLURM cluster (netns mode where this
machine allows it), with two fake GPUs per node and the preemption partitions."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpclaunch.errors import HpclaunchError
from hpclaunch.sandbox.cluster import Sandbox, check_prerequisites
from hpclaunch.sandbox.conf import Layout, Mode, Partitions, SandboxSpec
from hpclaunch.sandbox.daemons import SBIN_PATH


@dataclass(frozen=True)
class Running:
    """A sandbox that is up; ``env`` reaches it with SLURM's commands."""

    box: Sandbox
    layout: Layout
    env: dict[str, str]


def client_env(box: Sandbox) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{env.get('PATH', '')}:{SBIN_PATH}"
    # hpclaunch's job list goes with the sandbox, not into the user's home.
    env["XDG_STATE_HOME"] = str(box.state_dir / "state")
    env.update(box.env())
    return env


def require_sandbox() -> None:
    try:
        check_prerequisites()
    except HpclaunchError as exc:
        pytest.skip(f"no sandbox here: {exc}")


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    require_sandbox()
    box = Sandbox(Path(tmp_path_factory.mktemp("sandbox")))
    spec = SandboxSpec(nodes=4, gpus_per_node=2, partitions=Partitions.PREEMPT, mode=Mode.AUTO)
    try:
        lay = box.up(spec)
        yield Running(box, lay, client_env(box))
    finally:
        left = box.down()
        assert not left, f"sandbox down left {left}"
