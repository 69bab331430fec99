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


def first_job_id() -> int:
    """Where this session's sandbox numbers its jobs from: 1 in a plain pytest run;
    1 + (N + 1) * JOB_IDS_PER_WORKER under pytest-xdist's worker gwN (scripts/test runs
    several workers, each with its own session sandbox). A scan for the processes of job
    J (SLURM_JOB_ID=J, node-local folders named by job id) then never finds another
    worker's job J, nor one of a plain run beside it. A session submits a few hundred
    jobs; the rendezvous ports (15000 + id % 10000) differ too."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return 1
    return 1 + (int(worker.removeprefix("gw")) + 1) * JOB_IDS_PER_WORKER


JOB_IDS_PER_WORKER = 1000


def require_sandbox() -> None:
    try:
        check_prerequisites()
    except HpclaunchError as exc:
        pytest.skip(f"no sandbox here: {exc}")


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    require_sandbox()
    box = Sandbox(Path(tmp_path_factory.mktemp("sandbox")))
    spec = SandboxSpec(
        nodes=4,
        gpus_per_node=2,
        partitions=Partitions.PREEMPT,
        mode=Mode.AUTO,
        first_job_id=first_job_id(),
    )
    try:
        lay = box.up(spec)
        yield Running(box, lay, client_env(box))
    finally:
        left = box.down()
        assert not left, f"sandbox down left {left}"
