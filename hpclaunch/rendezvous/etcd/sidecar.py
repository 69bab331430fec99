"""``--etcd-sidecar``: an etcd server on the job's first node, for the job's lifetime.

The first node's agent starts ``etcd`` (from PATH or ``--etcd-binary``) listening
on the first node's address, data in a fresh temporary folder, with election
settings for a one-member cluster (healthy in well under a second). The port is
the first free one of a few candidates derived from the job id, so the other
nodes find the server without a shared filesystem or a message: they try the
same candidates and take the one whose member name is this job's and run's
(``hpclaunch-JOBID-REQUEUE``); another job's server is never mistaken for it.

The server dies with the agent (SIGKILL via PR_SET_PDEATHSIG where setpriv
exists) and the agent stops it and removes its data when the job step ends,
requeue included. Only standard-library HTTP here: no etcd client needed to
start or find it. The sidecar is not highly available: if the first node dies,
the rendezvous dies with it; an etcd cluster of your own (``--etcd-endpoint``)
survives any node.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from hpclaunch.errors import EtcdError
from hpclaunch.slurm.env import PORT_BASE, PORT_SPAN

log = logging.getLogger(__name__)

CANDIDATES = 4
START_TIMEOUT_S = 30.0
FIND_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 0.5
# A one-member cluster elects itself at once with these (0.06 s to healthy measured).
ELECTION = ("--election-timeout=100", "--heartbeat-interval=10")


def member_name(job_id: int, restart_count: int) -> str:
    """The sidecar's etcd member name: one per job and run (requeue)."""
    return f"hpclaunch-{job_id}-{restart_count}"


def candidate_ports(job_id: int) -> list[int]:
    """The ports the sidecar may take, in order. Half the span away from the
    c10d port of the same job id (hpclaunch.slurm.env.derive_port)."""
    offset = (job_id + PORT_SPAN // 2) % PORT_SPAN
    return [PORT_BASE + (offset + k) % PORT_SPAN for k in range(CANDIDATES)]


def server_argv(binary: str, name: str, ip: str, port: int, data_dir: Path) -> list[str]:
    """The etcd command line (pure). Peers: none; the peer URL only has to be valid."""
    host = f"[{ip}]" if ":" in ip else ip
    client = f"http://{host}:{port}"
    return [
        binary,
        "--name",
        name,
        "--data-dir",
        str(data_dir),
        "--listen-client-urls",
        client,
        "--advertise-client-urls",
        client,
        "--listen-peer-urls",
        "http://127.0.0.1:0",
        "--initial-advertise-peer-urls",
        "http://127.0.0.1:0",
        "--initial-cluster",
        f"{name}=http://127.0.0.1:0",
        "--initial-cluster-state",
        "new",
        *ELECTION,
    ]


def member_at(ip: str, port: int) -> str | None:
    """The name of the etcd member answering at ip:port, or None if none answers."""
    host = f"[{ip}]" if ":" in ip else ip
    request = urllib.request.Request(
        f"http://{host}:{port}/v3/cluster/member/list", data=b"{}", method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as resp:
            members = json.load(resp).get("members", [])
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return str(members[0].get("name")) if len(members) == 1 else None


class Sidecar:
    """A running sidecar server; ``stop()`` ends it and removes its data."""

    def __init__(self, proc: subprocess.Popen[bytes], data_dir: Path, endpoint: str) -> None:
        self.proc = proc
        self.data_dir = data_dir
        self.endpoint = endpoint

    @classmethod
    def start(
        cls,
        binary: str | None,
        name: str,
        ip: str,
        ports: list[int],
        guard: list[str] | None = None,
        timeout_s: float = START_TIMEOUT_S,
    ) -> Sidecar:
        """Start etcd on the first free port of ``ports``; wait until it answers
        with ``name``. ``guard`` goes before the command (setpriv --pdeathsig)."""
        path = binary or shutil.which("etcd")
        if path is None or not Path(path).exists():
            raise EtcdError(
                f"--etcd-sidecar: no etcd binary ({binary or 'etcd on PATH'}) on this node; "
                "install etcd (Debian: apt-get install etcd-server) or pass --etcd-binary PATH"
            )
        problems = []
        for port in ports:
            if member_at(ip, port) is not None:
                problems.append(f"port {port}: another etcd answers there")
                continue
            data_dir = Path(tempfile.mkdtemp(prefix=f"{name}-"))
            logfile = data_dir / "etcd.log"
            with logfile.open("wb") as out:
                proc = subprocess.Popen(
                    [*(guard or []), *server_argv(path, name, ip, port, data_dir / "data")],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            sidecar = cls(proc, data_dir, f"{ip}:{port}")
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                if member_at(ip, port) == name:
                    log.info("etcd sidecar %s up at %s", name, sidecar.endpoint)
                    return sidecar
                time.sleep(0.02)
            tail = _tail(logfile)
            sidecar.stop()
            if proc.returncode is None or "address already in use" not in tail:
                raise EtcdError(
                    f"--etcd-sidecar: etcd at {ip}:{port} did not become healthy within "
                    f"{timeout_s:g} s; its log ends: {tail}"
                )
            problems.append(f"port {port}: in use")
        raise EtcdError(
            f"--etcd-sidecar: no free port for etcd on {ip} ({'; '.join(problems)}); "
            "free one of them or use --etcd-endpoint"
        )

    def stop(self) -> None:
        """SIGTERM, SIGKILL after STOP_TIMEOUT_S; then remove the data (idempotent)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def find(ip: str, name: str, ports: list[int], timeout_s: float = FIND_TIMEOUT_S) -> str:
    """Wait for the first node's sidecar; return its endpoint. The first node may
    still be importing or starting it, so this polls (nothing to subscribe to)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for port in ports:
            if member_at(ip, port) == name:
                return f"{ip}:{port}"
        if time.monotonic() >= deadline:
            raise EtcdError(
                f"--etcd-sidecar: the first node's etcd ({name}) did not answer at {ip} on "
                f"ports {', '.join(map(str, ports))} within {timeout_s:g} s; see the first "
                "node's agent log"
            )
        time.sleep(0.1)


def _tail(logfile: Path) -> str:
    try:
        lines = logfile.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(lines[-3:]) or "(empty)"
