"""The etcd v3 client, the rendezvous backend and the sidecar against a real etcd
(Debian's etcd-server, v2 API off), on loopback."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hpclaunch import procs
from hpclaunch.errors import EtcdError
from hpclaunch.rendezvous.etcd.access import Access
from hpclaunch.rendezvous.etcd.client import Etcd, LeaseKeeper
from hpclaunch.rendezvous.etcd.sidecar import Sidecar, find, member_at
from tests.integration.etcd_fixture import PASSWORD, USER, EtcdServer, etcd_server, free_port
from tests.integration.helpers import VENV_BIN, base_env, wait_for

# One pytest-xdist worker for the etcd modules: they share one uninterrupted run
# (etcd_reference), and their agents run on this host under fixed job ids (ports).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("etcd-local")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "allreduce.py"


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> EtcdServer:
    with etcd_server(tmp_path_factory.mktemp("etcd")) as server:
        yield server  # type: ignore[misc]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> EtcdServer:
    with etcd_server(tmp_path_factory.mktemp("etcd-tls"), tls=True, auth=True) as server:
        yield server  # type: ignore[misc]


def test_the_server_has_no_v2_api(plain: EtcdServer) -> None:
    """What torch's own etcd backends need, and what this one does without."""
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://{plain.endpoint}/v2/keys", timeout=5)
    assert info.value.code == 404
    info.value.close()


def test_swap_is_a_compare_and_swap_on_the_revision(plain: EtcdServer) -> None:
    etcd = Etcd.connect(plain.access())
    key = "/hpclaunch/test/cas"
    done, first = etcd.swap(key, b"one", None)
    assert done and first is not None and first.value == b"one"
    again, current = etcd.swap(key, b"other", None)  # exists already: not set
    assert not again and current == first
    done, second = etcd.swap(key, b"two", first.mod_revision)
    assert done and second is not None and second.mod_revision > first.mod_revision
    stale, now = etcd.swap(key, b"three", first.mod_revision)  # a stale token loses
    assert not stale and now is not None and now.value == b"two"
    assert etcd.get(key)[0] == second


def test_wait_change_wakes_on_a_write_and_misses_none(plain: EtcdServer) -> None:
    etcd = Etcd.connect(plain.access())
    key = "/hpclaunch/test/watch"
    _, revision = etcd.get(key)
    etcd.put(key, b"written before the watch starts")
    started = time.monotonic()
    assert etcd.wait_change(key, revision, 10)  # the write after `revision` counts
    assert time.monotonic() - started < 2
    _, revision = etcd.get(key)
    assert not etcd.wait_change(key, revision, 0.3)  # nothing happened: times out
    writer = threading.Timer(0.2, lambda: etcd.put(key, b"later"))
    writer.start()
    started = time.monotonic()
    assert etcd.wait_change(key, revision, 10)
    assert 0.15 < time.monotonic() - started < 2
    writer.join()


def test_keys_on_a_lease_vanish_after_its_holder_stops(plain: EtcdServer) -> None:
    etcd = Etcd.connect(plain.access())
    keeper = LeaseKeeper(etcd, ttl_s=2)
    etcd.put("/hpclaunch/test/leased", b"x", keeper.lease)
    time.sleep(3)  # longer than the TTL: only the keeper's renewals keep the key
    assert etcd.get("/hpclaunch/test/leased")[0] is not None
    keeper.stop()
    wait_for(
        lambda: etcd.get("/hpclaunch/test/leased")[0] is None,
        timeout_s=10,
        what="the leased key to expire",
    )


def test_tls_and_user_work_and_each_mistake_is_named(secured: EtcdServer) -> None:
    etcd = Etcd.connect(secured.access())
    etcd.put("/hpclaunch/test/secured", b"ok")
    assert etcd.get("/hpclaunch/test/secured")[0] is not None
    where = f"etcd at {secured.endpoint}"
    cases = [
        ({"password": "wrong"}, f"{where} refused user '{USER}'.*invalid user ID or password"),
        ({"cacert": None}, f"{where}: TLS failed.*check --etcd-cacert"),
        ({"cert": None, "key": None}, f"{where}: TLS failed"),
        ({"user": None, "password": None}, f"{where} refused.*give --etcd-user"),
    ]
    for overrides, message in cases:
        with pytest.raises(EtcdError, match=message):
            Etcd.connect(secured.access(**overrides))
    with pytest.raises(EtcdError, match="permission denied; give the user read-write on"):
        etcd.put("/outside/the/prefix", b"x")


def test_an_unreachable_etcd_is_an_error_within_the_timeout() -> None:
    refused = free_port("127.0.0.1")
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        mute = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(EtcdError) as info:
            Etcd.connect(Access((f"127.0.0.1:{refused}", mute), timeout_s=1.0))
        took = time.monotonic() - started
    assert f"etcd at 127.0.0.1:{refused}: connection refused" in str(info.value)
    assert f"etcd at {mute} did not answer within 1 s" in str(info.value)
    assert took < 5


def torchrun(server: EtcdServer, run_id: str, conf: str, tmp_path: Path) -> list[str]:
    """Two torchrun agents (plain torchrun: the entry point) through hpclaunch-etcd."""
    argv = [
        str(VENV_BIN / "torchrun"),
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "hpclaunch-etcd",
        "--rdzv-endpoint",
        server.endpoint,
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        conf,
        str(EXAMPLE),
    ]
    out = subprocess.PIPE
    agents = [
        subprocess.Popen(argv, env=base_env(), cwd=tmp_path, stdout=out, stderr=out, text=True)
        for _ in range(2)
    ]
    outputs = ["".join(agent.communicate(timeout=180)) for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], outputs
    return outputs


def test_torchrun_rendezvous_through_tls_and_a_user(secured: EtcdServer, tmp_path: Path) -> None:
    assert secured.tls_dir is not None
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    tls = secured.tls_dir
    conf = (
        f"cacert={tls / 'ca.crt'},cert={tls / 'client.crt'},key={tls / 'client.key'},"
        f"user={USER},password_file={tmp_path / 'pw'}"
    )
    outputs = torchrun(secured, "tls-run", conf, tmp_path)
    reports = [
        json.loads(line.split("ALLREDUCE ", 1)[1])
        for out in outputs
        for line in out.splitlines()
        if "ALLREDUCE " in line
    ]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert {r["world_size"] for r in reports} == {2} and {r["sum"] for r in reports} == {1.0}
    # Every key of the run is on a lease, so etcd forgets it once the agents are gone.
    etcd = Etcd.connect(secured.access())
    keys = etcd._post(
        "/kv/range",
        {"key": _b64("/hpclaunch/rdzv/tls-run/"), "range_end": _b64("/hpclaunch/rdzv/tls-run0")},
    ).get("kvs", [])
    assert keys, "the run left no keys to check"
    assert all(int(kv.get("lease", 0)) != 0 for kv in keys)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


HOSTS = ("localhost", "127.0.0.1", "127.0.0.2")


def agents_env(job_id: int, node: int, nodes: int = 2) -> dict[str, str]:
    """``nodes`` 'nodes' on this machine, as SLURM would describe them to the agents."""
    return base_env(
        SLURM_JOB_ID=str(job_id),
        SLURM_JOB_NODELIST=",".join(HOSTS[:nodes]),
        SLURM_JOB_NUM_NODES=str(nodes),
        SLURM_NODEID=str(node),
        SLURM_STEP_ID="0",
    )


def run_agents(job_id: int, tmp_path: Path, *options: str, nodes: int = 2) -> list[tuple[int, str]]:
    argv = [
        str(VENV_BIN / "hpclaunch"),
        "agent",
        "--nproc-per-node",
        "1",
        "--job-dir",
        str(tmp_path / "job"),
        "--rdzv",
        "etcd",
        *options,
        str(EXAMPLE),
    ]
    out, err = subprocess.PIPE, subprocess.STDOUT
    agents = [
        subprocess.Popen(
            argv, env=agents_env(job_id, node, nodes), stdout=out, stderr=err, text=True
        )
        for node in range(nodes)
    ]
    return [(a.wait(timeout=180), a.communicate()[0]) for a in agents]


def test_agent_with_an_unreachable_etcd_fails_naming_it(tmp_path: Path) -> None:
    port = free_port("127.0.0.1")
    started = time.monotonic()
    results = run_agents(8101, tmp_path, "--etcd-endpoint", f"127.0.0.1:{port}")
    assert time.monotonic() - started < 60  # torch's import, then the first request fails
    for status, out in results:
        assert status == 1, out
        assert f"etcd at 127.0.0.1:{port}: connection refused" in out
        assert "Traceback" not in out


def test_sidecar_agents_run_and_leave_no_server(tmp_path: Path) -> None:
    job_id = 8102
    results = run_agents(job_id, tmp_path, "--etcd-sidecar")
    for status, out in results:
        assert status == 0, out
        assert "ALLREDUCE" in out
    name = f"hpclaunch-{job_id}-0".encode()
    assert not [p for p in procs.parents() if name in _cmdline(p)]
    assert not list(Path("/tmp").glob(f"hpclaunch-{job_id}-0-*"))


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_sidecar_takes_a_free_port_and_is_found_by_its_name(
    plain: EtcdServer, tmp_path: Path
) -> None:
    busy_port = int(plain.endpoint.rsplit(":", 1)[1])  # another etcd answers there
    with socket.socket() as taken:  # and something that is not etcd holds this one
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        ports = [busy_port, taken.getsockname()[1], free_port("127.0.0.1")]
        server = Sidecar.start(None, "hpclaunch-5-1", "127.0.0.1", ports)
    try:
        assert server.endpoint == f"127.0.0.1:{ports[2]}"
        assert find("127.0.0.1", "hpclaunch-5-1", ports, timeout_s=5) == server.endpoint
        with pytest.raises(EtcdError, match=r"hpclaunch-5-2\) did not answer"):
            find("127.0.0.1", "hpclaunch-5-2", ports, timeout_s=0.5)  # another run's name
    finally:
        server.stop()
    assert server.proc.poll() is not None and not server.data_dir.exists()
    assert member_at("127.0.0.1", ports[2]) is None
    assert member_at("127.0.0.1", busy_port) == "test"  # the other etcd is untouched


def test_node_multiple_runs_a_multiple_and_the_spare_stands_by(
    plain: EtcdServer, tmp_path: Path
) -> None:
    results = run_agents(
        8103,
        tmp_path,
        "--etcd-endpoint",
        plain.endpoint,
        "--nnodes",
        "2:3",
        "--node-multiple",
        "2",
        nodes=3,
    )
    assert [status for status, _ in results] == [0, 0, 0], results
    reports = [
        json.loads(line.split("ALLREDUCE ", 1)[1])
        for _, out in results
        for line in out.splitlines()
        if "ALLREDUCE " in line
    ]
    assert sorted(r["rank"] for r in reports) == [0, 1]  # two nodes ran, one worker each
    assert {r["world_size"] for r in reports} == {2}
    spares = [out for _, out in results if "ALLREDUCE " not in out]
    assert len(spares) == 1
