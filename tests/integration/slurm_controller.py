"""A real SLURM controller (munged + slurmctld from Debian's slurm-wlm) for
submission tests: jobs are accepted, queued and inspected, never run (there is
no slurmd). Started and stopped by PID; all state in one temporary folder."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.integration.helpers import wait_for

DAEMONS = ("munged", "mungekey", "slurmctld", "sbatch", "squeue", "scontrol")

CONFIG = """\
ClusterName=hpclaunch-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={state}/munge/socket,cred_expire=5
CredType=cred/munge
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool/%n
SlurmctldPidFile={state}/slurmctld.pid
SlurmctldLogFile={state}/slurmctld.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
MpiDefault=none
MailProg=/bin/true
MinJobAge=3600
NodeName=n[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=17101-17102 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
"""


@dataclass(frozen=True)
class Controller:
    """A running controller; ``env`` reaches it (SLURM_CONF)."""

    env: dict[str, str]


def _missing() -> list[str]:
    return [
        name
        for name in DAEMONS
        if shutil.which(name, path=os.environ["PATH"] + ":/usr/sbin") is None
    ]


def _free_port() -> int:
    """A loopback port nothing listens on now (two test runs must not collide)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def slurm_controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    missing = _missing()
    if missing:
        pytest.skip(
            f"SLURM/munge not installed ({', '.join(missing)}): apt-get install slurm-wlm munge"
        )
    if os.geteuid() != 0:
        pytest.skip("the SLURM controller test runs its daemons as root")
    state = tmp_path_factory.mktemp("slurm")
    state.chmod(0o755)  # munged wants every ancestor of its socket o+x
    (state / "munge").mkdir(mode=0o700)
    (state / "ctld").mkdir()
    key = state / "munge" / "munge.key"
    subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True)
    key.chmod(0o600)
    conf = state / "slurm.conf"
    conf.write_text(CONFIG.format(state=state, port=_free_port()))
    env = {"PATH": f"/usr/sbin:{os.environ['PATH']}", "SLURM_CONF": str(conf)}
    log = (state / "daemons.log").open("w")
    procs = []
    try:
        procs.append(
            subprocess.Popen(
                [
                    "munged",
                    "-F",
                    "--force",
                    f"--socket={state}/munge/socket",
                    f"--key-file={key}",
                    f"--log-file={state}/munged.log",
                    f"--pid-file={state}/munged.pid",
                    f"--seed-file={state}/munged.seed",
                ],
                stdout=log,
                stderr=log,
            )
        )
        wait_for((state / "munge" / "socket").exists, what="munged's socket")
        procs.append(
            subprocess.Popen(
                ["slurmctld", "-D", "-i", "-f", str(conf)], env=env, stdout=log, stderr=log
            )
        )

        def up() -> bool:
            ping = subprocess.run(
                ["scontrol", "ping"], env=env, capture_output=True, text=True, check=False
            )
            return "is UP" in ping.stdout

        wait_for(up, timeout_s=30, what="slurmctld to answer scontrol ping")
        yield Controller({**os.environ, **env})
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
