"""Real etcd servers for the tests: Debian's etcd-server, v2 API off (its default),
started by PID in a temporary folder, optionally with TLS and users."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpclaunch.rendezvous.etcd.access import Access

USER = "trainer"
PASSWORD = "s3cret pass'word"  # a space and a quote: never interpreted by a shell
ROLE = "hpclaunch-rdzv"


@dataclass(frozen=True)
class EtcdServer:
    endpoint: str
    proc: subprocess.Popen[bytes]
    tls_dir: Path | None = None
    auth: bool = False

    def access(self, **overrides: object) -> Access:
        """How a client reaches it, with the right certificates and user."""
        fields: dict[str, object] = {"endpoints": (self.endpoint,), "timeout_s": 5.0}
        if self.tls_dir is not None:
            fields.update(
                cacert=str(self.tls_dir / "ca.crt"),
                cert=str(self.tls_dir / "client.crt"),
                key=str(self.tls_dir / "client.key"),
            )
        if self.auth:
            fields.update(user=USER, password=PASSWORD)
        fields.update(overrides)
        return Access(**fields)  # type: ignore[arg-type]


def require_etcd() -> str:
    path = shutil.which("etcd")
    if path is None:
        pytest.skip("no etcd binary here (Debian: apt-get install etcd-server)")
    return path


def free_port(ip: str) -> int:
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


def make_certs(folder: Path, ips: list[str]) -> Path:
    """A CA, a server certificate for ``ips`` and a client certificate (EC keys: fast)."""
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req",
        "-x509",
        *key,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=hpclaunch test CA",
    )
    sans = {
        "server": "subjectAltName=" + ",".join(f"IP:{ip}" for ip in ips),
        "client": "extendedKeyUsage=clientAuth",
    }
    for name, ext in sans.items():
        (folder / f"{name}.ext").write_text(ext + "\n")
        # No CN: etcd 3.4's JSON gateway reaches the server with the server's own
        # certificate and refuses every authenticated request if it names a CN.
        openssl(
            "req",
            *key,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/O=hpclaunch {name}",
        )
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
        )
    return folder


def _etcdctl(server: EtcdServer, *args: str) -> None:
    argv = ["etcdctl", "--endpoints", _url(server), *args]
    if server.tls_dir is not None:
        argv += [
            "--cacert",
            str(server.tls_dir / "ca.crt"),
            "--cert",
            str(server.tls_dir / "client.crt"),
            "--key",
            str(server.tls_dir / "client.key"),
        ]
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def _url(server: EtcdServer) -> str:
    return ("https://" if server.tls_dir else "http://") + server.endpoint


def _enable_auth(server: EtcdServer) -> None:
    """root (required by etcd) and a user with read-write on /hpclaunch/ only."""
    _etcdctl(server, "user", "add", "root", "--new-user-password", "root-" + PASSWORD)
    _etcdctl(server, "user", "grant-role", "root", "root")
    _etcdctl(server, "role", "add", ROLE)
    _etcdctl(server, "role", "grant-permission", ROLE, "--prefix=true", "readwrite", "/hpclaunch/")
    _etcdctl(server, "user", "add", USER, "--new-user-password", PASSWORD)
    _etcdctl(server, "user", "grant-role", USER, ROLE)
    _etcdctl(server, "auth", "enable")


def _argv(binary: str, folder: Path, ip: str, port: int, tls_dir: Path | None) -> list[str]:
    scheme = "https" if tls_dir is not None else "http"
    argv = [
        binary,
        "--name",
        "test",
        "--data-dir",
        str(folder / "data"),
        "--listen-client-urls",
        f"{scheme}://{ip}:{port}",
        "--advertise-client-urls",
        f"{scheme}://{ip}:{port}",
        "--listen-peer-urls",
        "http://127.0.0.1:0",
        "--initial-advertise-peer-urls",
        "http://127.0.0.1:0",
        "--initial-cluster",
        "test=http://127.0.0.1:0",
        "--election-timeout=100",
        "--heartbeat-interval=10",
    ]
    if tls_dir is not None:
        argv += [
            "--cert-file",
            str(tls_dir / "server.crt"),
            "--key-file",
            str(tls_dir / "server.key"),
            "--trusted-ca-file",
            str(tls_dir / "ca.crt"),
            "--client-cert-auth",
        ]
    return argv


def _start(argv: list[str], folder: Path) -> subprocess.Popen[bytes]:
    with (folder / "etcd.log").open("ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def etcd_server(
    folder: Path, ip: str = "127.0.0.1", *, tls: bool = False, auth: bool = False
) -> Iterator[EtcdServer]:
    """An etcd on ``ip`` and a free port, stopped (by PID) and removed afterwards."""
    binary = require_etcd()
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port(ip)
    tls_dir = make_certs(folder / "tls", sorted({ip, "127.0.0.1"})) if tls else None
    proc = _start(_argv(binary, folder, ip, port, tls_dir), folder)
    server = EtcdServer(f"{ip}:{port}", proc, tls_dir, auth=False)
    try:
        _wait_healthy(server, folder / "etcd.log")
        if auth:
            _enable_auth(server)
            server = EtcdServer(server.endpoint, proc, tls_dir, auth=True)
        yield server
    finally:
        _stop(proc)


class RestartableEtcd:
    """A plain etcd that can be killed and started again on the same port and data
    folder (its keys and leases kept), as an operator's restart does."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        port = free_port("127.0.0.1")
        self.endpoint = f"127.0.0.1:{port}"
        self._argv = _argv(require_etcd(), folder, "127.0.0.1", port, None)
        self.proc = _start(self._argv, folder)
        _wait_healthy(EtcdServer(self.endpoint, self.proc), folder / "etcd.log")

    def outage(self, down_s: float) -> None:
        """Kill etcd (SIGKILL, as a crash), keep it down ``down_s``, start it again
        and wait until it serves."""
        self.proc.kill()
        self.proc.wait()
        time.sleep(down_s)  # the outage itself, not a wait for a condition
        self.proc = _start(self._argv, self.folder)
        _wait_healthy(EtcdServer(self.endpoint, self.proc), self.folder / "etcd.log")

    def wipe(self, down_s: float) -> None:
        """Kill etcd, delete its data folder (every key and lease gone) and start it
        again on the same port: a restore that lost the data, or a new etcd there."""
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.folder / "data")
        time.sleep(down_s)  # the outage itself, not a wait for a condition
        self.proc = _start(self._argv, self.folder)
        _wait_healthy(EtcdServer(self.endpoint, self.proc), self.folder / "etcd.log")

    def stop(self) -> None:
        _stop(self.proc)


def _wait_healthy(server: EtcdServer, log: Path, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _etcdctl(server, "endpoint", "health")
            return
        except subprocess.CalledProcessError:
            pass
        if server.proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"etcd did not become healthy: {log.read_text()[-2000:]}")
        time.sleep(0.05)
