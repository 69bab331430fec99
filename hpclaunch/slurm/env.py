"""``NodeContext``: what one node of an allocation knows about the job, from SLURM's
environment alone. Pure: every function takes a ``Mapping[str, str]``.

The step's node list (``SLURM_STEP_NODELIST``, else the job's) in SLURM's order
gives the node ranks; ``SLURM_NODEID`` is this node's index in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from hpclaunch.contract.agent import RankOrder
from hpclaunch.errors import ExitCode, HpclaunchError
from hpclaunch.slurm.hostlist import HostlistError, expand

# Rendezvous ports derived from the job id fall in [PORT_BASE, PORT_BASE + PORT_SPAN):
# below Linux's ephemeral range (32768+), and below the sandbox's daemons (25000+).
PORT_BASE = 15000
PORT_SPAN = 10000


class ContextError(HpclaunchError):
    """SLURM's environment is missing or garbled; the message names the variable."""

    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class NodeContext:
    """This node's place in the job. ``hosts`` is in rank order."""

    job_id: int
    node_rank: int
    hosts: tuple[str, ...]
    restart_count: int  # SLURM_RESTART_COUNT: 0 on the first run, then 1, 2, ...
    nproc_per_node: int
    nproc_source: str  # where nproc_per_node came from, for --dry-run and messages
    master_port: int
    topology_addr: str | None = None
    step_id: str = "batch"  # SLURM_STEP_ID; the batch step has none

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def hostname(self) -> str:
        return self.hosts[self.node_rank]

    @property
    def first_host(self) -> str:
        """The node that hosts the rendezvous store: always rank 0."""
        return self.hosts[0]

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        nproc_per_node: int | None = None,
        master_port: int | None = None,
    ) -> NodeContext:
        """Read SLURM's variables. Raises ContextError naming the variable and value."""
        if "SLURM_JOB_ID" not in env:
            raise ContextError(
                "not inside a SLURM allocation (SLURM_JOB_ID is not set); run it through "
                "srun in a job, e.g. srun --ntasks-per-node=1 hpclaunch agent train.py"
            )
        job_id = _int(env, "SLURM_JOB_ID", minimum=1)
        list_var = "SLURM_STEP_NODELIST" if "SLURM_STEP_NODELIST" in env else "SLURM_JOB_NODELIST"
        if list_var not in env:
            raise ContextError(f"{list_var} is not set; run the agent through srun")
        try:
            hosts = tuple(expand(env[list_var]))
        except HostlistError as exc:
            raise ContextError(f"{list_var}={env[list_var]!r} is not a hostlist: {exc}") from None
        count_var = (
            "SLURM_STEP_NUM_NODES" if "SLURM_STEP_NUM_NODES" in env else "SLURM_JOB_NUM_NODES"
        )
        if count_var in env and _int(env, count_var, minimum=1) != len(hosts):
            raise ContextError(
                f"{count_var}={env[count_var]!r} does not match the {len(hosts)} hosts of "
                f"{list_var}={env[list_var]!r}"
            )
        node_rank = _int(env, "SLURM_NODEID", minimum=0)
        if node_rank >= len(hosts):
            raise ContextError(
                f"SLURM_NODEID={node_rank} is outside the {len(hosts)} nodes of {list_var}"
            )
        restart = _int(env, "SLURM_RESTART_COUNT", minimum=0) if "SLURM_RESTART_COUNT" in env else 0
        nproc, source = _nproc(env, nproc_per_node)
        port = master_port if master_port is not None else derive_port(job_id)
        return cls(
            job_id=job_id,
            node_rank=node_rank,
            hosts=hosts,
            restart_count=restart,
            nproc_per_node=nproc,
            nproc_source=source,
            master_port=port,
            topology_addr=env.get("SLURM_TOPOLOGY_ADDR"),
            step_id=str(_int(env, "SLURM_STEP_ID", minimum=0))
            if "SLURM_STEP_ID" in env
            else "batch",
        )

    def ordered(self, order: RankOrder, switch_of: Mapping[str, str]) -> NodeContext:
        """This context with node ranks laid out by ``order``; ``switch_of`` maps each
        host to its leaf switch (from ``scontrol show topology``)."""
        if order is RankOrder.SLURM:
            return self
        missing = [h for h in self.hosts if h not in switch_of]
        if missing:
            raise ContextError(
                f"--rank-order topology needs every node's leaf switch, but SLURM's topology "
                f"does not place {', '.join(missing[:3])}; use --rank-order slurm"
            )
        hosts = topology_order(self.hosts, switch_of)
        return replace(self, hosts=hosts, node_rank=hosts.index(self.hostname))


def job_nodes(env: Mapping[str, str]) -> list[str]:
    """The job's nodes as the batch step sees them (``SLURM_JOB_NODELIST``, expanded);
    none when it is unset or not a hostlist (the supervisor then names no node)."""
    try:
        return expand(env.get("SLURM_JOB_NODELIST", ""))
    except HostlistError:
        return []


def topology_order(hosts: Sequence[str], switch_of: Mapping[str, str]) -> tuple[str, ...]:
    """Hosts grouped by leaf switch (switches in order of first appearance), SLURM's
    order kept within a switch."""
    switches = list(dict.fromkeys(switch_of[h] for h in hosts))
    return tuple(h for switch in switches for h in hosts if switch_of[h] == switch)


def derive_port(job_id: int) -> int:
    """The rendezvous port every node of job ``job_id`` computes alike. Jobs sharing a
    node collide only if their ids differ by a multiple of PORT_SPAN."""
    return PORT_BASE + job_id % PORT_SPAN


def _int(env: Mapping[str, str], name: str, *, minimum: int) -> int:
    raw = env.get(name)
    if raw is None:
        raise ContextError(f"{name} is not set; run the agent through srun inside a job")
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or int(text) < minimum:
        raise ContextError(f"{name}={raw!r} is not a whole number of at least {minimum}")
    return int(text)


def _nproc(env: Mapping[str, str], given: int | None) -> tuple[int, str]:
    """Workers per node: --nproc-per-node, else SLURM_GPUS_ON_NODE, else the count in
    CUDA_VISIBLE_DEVICES, else 1."""
    if given is not None:
        if given < 1:
            raise ContextError(f"--nproc-per-node {given} is below 1")
        return given, "--nproc-per-node"
    if env.get("SLURM_GPUS_ON_NODE"):
        gpus = _int(env, "SLURM_GPUS_ON_NODE", minimum=0)
        if gpus:
            return gpus, "SLURM_GPUS_ON_NODE"
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        devices = [d for d in visible.split(",") if d.strip()]
        if not devices or any(not d.strip() for d in visible.split(",")):
            raise ContextError(f"CUDA_VISIBLE_DEVICES={visible!r} is not a list like 0,1,2")
        return len(devices), "CUDA_VISIBLE_DEVICES"
    return 1, "default"


def parse_topology(text: str) -> dict[str, str]:
    """Leaf switch of each node, from ``scontrol show topology`` (level-0 switches)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if fields.get("Level") == "0" and fields.get("Nodes", "(null)") != "(null)":
            for host in expand(fields["Nodes"]):
                out[host] = fields["SwitchName"]
    return out
