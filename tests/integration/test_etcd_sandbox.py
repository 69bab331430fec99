"""--rdzv etcd on the SLURM sandbox: agents on their nodes (their own network
namespaces where the machine allows) rendezvous through a real etcd on the
controller's address, through the sidecar, and through TLS with a user; and an
elastic job survives a lost node without a requeue, on fewer nodes or with a spare."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hpclaunch import procs
from hpclaunch.slurm.hostlist import expand
from tests.integration.etcd_fixture import PASSWORD, USER, EtcdServer, etcd_server
from tests.integration.helpers import wait_for
from tests.integration.sandbox_fixture import Running
from tests.integration.test_agent import finished, reports, submit
from tests.integration.test_fault_tolerance import submit as submit_training

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def etcd_on_host(
    sandbox: Running, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EtcdServer]:
    """An etcd of the user's own, on the address the nodes reach the controller at."""
    folder = tmp_path_factory.mktemp("etcd-host")
    with etcd_server(folder, sandbox.layout.controller_addr) as server:
        yield server


def check_ranks(tmp_path: Path, job_id: int, nodes: int) -> None:
    got = sorted(reports(tmp_path, job_id), key=lambda r: int(str(r["rank"])))
    world = 2 * nodes
    assert [r["rank"] for r in got] == list(range(world))
    assert {r["world_size"] for r in got} == {world}
    assert {r["sum"] for r in got} == {world * (world - 1) / 2}
    assert len({r["node"] for r in got}) == nodes


@pytest.mark.parametrize("nodes", [2, 4])
def test_agents_rendezvous_through_etcd(
    sandbox: Running, etcd_on_host: EtcdServer, tmp_path: Path, nodes: int
) -> None:
    job_id, env = submit(
        sandbox,
        tmp_path,
        "--nodes",
        str(nodes),
        "--nproc-per-node",
        "2",
        "--rdzv",
        "etcd",
        "--etcd-endpoint",
        etcd_on_host.endpoint,
        "allreduce.py",
    )
    log_path = tmp_path / "logs" / f"allreduce-{job_id}.out"
    assert finished(env, job_id) == "COMPLETED", log_path.read_text()
    check_ranks(tmp_path, job_id, nodes)
    log = log_path.read_text()
    assert log.count(f"rendezvous hpclaunch-etcd at {etcd_on_host.endpoint}") == nodes


def etcd_servers_of(job_id: int) -> list[int]:
    """Live processes whose command line names the job's sidecar member."""
    name = f"hpclaunch-{job_id}-".encode()
    found = []
    for pid in procs.parents():
        try:
            if name in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def test_sidecar_serves_the_job_and_goes_with_it(sandbox: Running, tmp_path: Path) -> None:
    job_id, env = submit(
        sandbox,
        tmp_path,
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv",
        "etcd",
        "--etcd-sidecar",
        "allreduce.py",
    )
    log_path = tmp_path / "logs" / f"allreduce-{job_id}.out"
    assert finished(env, job_id) == "COMPLETED", log_path.read_text()
    check_ranks(tmp_path, job_id, 2)
    assert etcd_servers_of(job_id) == []
    assert not list(Path("/tmp").glob(f"hpclaunch-{job_id}-*"))  # its data is gone too


def test_tls_and_a_user_with_the_password_from_the_environment(
    sandbox: Running, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("etcd-tls")
    with etcd_server(folder, sandbox.layout.controller_addr, tls=True, auth=True) as server:
        assert server.tls_dir is not None
        tls = server.tls_dir
        sandbox.env["HPCLAUNCH_ETCD_PASSWORD"] = PASSWORD  # sbatch passes it to the job
        try:
            job_id, env = submit(
                sandbox,
                tmp_path,
                "--nodes",
                "2",
                "--nproc-per-node",
                "2",
                "--rdzv",
                "etcd",
                "--etcd-endpoint",
                server.endpoint,
                "--etcd-cacert",
                str(tls / "ca.crt"),
                "--etcd-cert",
                str(tls / "client.crt"),
                "--etcd-key",
                str(tls / "client.key"),
                "--etcd-user",
                USER,
                "allreduce.py",
            )
        finally:
            del sandbox.env["HPCLAUNCH_ETCD_PASSWORD"]
        log_path = tmp_path / "logs" / f"allreduce-{job_id}.out"
        assert finished(env, job_id) == "COMPLETED", log_path.read_text()
    check_ranks(tmp_path, job_id, 2)
    script = (tmp_path / "logs" / str(job_id) / "job.sbatch").read_text()
    assert f"--etcd-user {USER}" in script and PASSWORD not in script


def test_a_lost_node_shrinks_the_job_without_a_requeue(
    sandbox: Running, etcd_on_host: EtcdServer, tmp_path: Path
) -> None:
    options = (
        "--nodes",
        "2:3",
        "--no-kill",
        "--rdzv",
        "etcd",
        "--etcd-endpoint",
        etcd_on_host.endpoint,
    )
    job = submit_training(sandbox, tmp_path, "--steps", "40", "--step-time", "0.3", options=options)
    job.wait_checkpoint(9)
    nodes = expand(job.fields()["NodeList"])
    assert len(nodes) == 3, f"SLURM gave {nodes}, not the 3 of --nodes 2:3"
    lost = nodes[2]  # not the node of the batch step
    try:
        sandbox.box.kill_node(lost)
        # No checkpoint can complete without the lost node's ranks: this is the last one.
        saved = sorted(p.name for p in (job.job_dir / "checkpoints").glob("step-*.pt"))
        assert job.wait_end() == "COMPLETED", job.log
    finally:
        sandbox.box.start_node(lost)  # back to service, for the next tests
    last_step = int(saved[-1].removeprefix("step-").removesuffix(".pt"))
    starts = job.lines("START")
    assert [(s["attempt"], s["requeue"], s["world_size"]) for s in starts] == [
        ("0", "0", 6),
        ("1", "0", 4),  # a smaller world, same run: no requeue
    ]
    assert starts[0]["step"] == 0 and starts[1]["step"] == last_step + 1
    [result] = job.lines("RESULT")
    assert result["world_size"] == 4 and result["steps"] == 40
    assert job.fields()["Restarts"] == "0"
    assert job.history() == [(0, "completed", "none")]
    assert "round 0 is down to 2 of 3 nodes" in job.log


def worker_nodes(job_id: int) -> set[str]:
    """The nodes where workers of the job run. A fresh worker shows torchrun's LOCAL_RANK
    in /proc/PID/environ; a warm one shows the environment its agent started with (a
    fork's /proc/PID/environ does not follow os.environ): see _is_warm_worker."""
    table = procs.parents()
    job = set(procs.with_environ(f"SLURM_JOB_ID={job_id}".encode(), table))
    found = set()
    for pid in job:
        try:
            entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(e.decode(errors="replace").split("=", 1) for e in entries if b"=" in e)
        warm = _is_warm_worker(pid, table)
        if "LOCAL_RANK" in env or warm:
            found.add(env["SLURMD_NODENAME"])
    return found


def _is_warm_worker(pid: int, table: dict[int, int]) -> bool:
    """A fork of a fork of an agent: the worker, its zygote and its agent share the
    agent's command line (the zygote alone is a fork of one)."""
    try:
        lines = [
            Path(f"/proc/{p}/cmdline").read_bytes() for p in (pid, table[pid], table[table[pid]])
        ]
    except (OSError, KeyError):
        return False
    return b"agent" in lines[0] and lines[0] == lines[1] == lines[2]


def test_a_spare_node_takes_the_place_of_a_lost_one(
    sandbox: Running, etcd_on_host: EtcdServer, tmp_path: Path
) -> None:
    options = (
        "--nodes",
        "2:3",
        "--no-kill",
        "--node-multiple",
        "2",
        "--rdzv",
        "etcd",
        "--etcd-endpoint",
        etcd_on_host.endpoint,
    )
    job = submit_training(sandbox, tmp_path, "--steps", "40", "--step-time", "0.3", options=options)
    job.wait_checkpoint(9)
    nodes = expand(job.fields()["NodeList"])
    assert len(nodes) == 3, f"SLURM gave {nodes}, not the 3 of --nodes 2:3"
    running = worker_nodes(job.id)
    assert len(running) == 2, running  # a multiple of 2: the third node stands by
    [spare] = set(nodes) - running
    lost = next(node for node in sorted(running) if node != nodes[0])  # not the batch node
    try:
        sandbox.box.kill_node(lost)
        saved = sorted(p.name for p in (job.job_dir / "checkpoints").glob("step-*.pt"))
        wait_for(
            lambda: spare in worker_nodes(job.id),
            timeout_s=60,
            what=f"the spare {spare} to run workers",
        )
        assert job.wait_end() == "COMPLETED", job.log
    finally:
        sandbox.box.start_node(lost)
    last_step = int(saved[-1].removeprefix("step-").removesuffix(".pt"))
    starts = job.lines("START")
    assert [(s["attempt"], s["world_size"]) for s in starts] == [("0", 4), ("1", 4)]  # same size
    assert starts[1]["step"] == last_step + 1
    assert job.fields()["Restarts"] == "0"
    assert job.history() == [(0, "completed", "none")]
