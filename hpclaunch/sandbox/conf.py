"""The sandbox's layout and SLURM configuration files, as pure functions.

``SandboxSpec`` (what the user asked for) and a state folder give a
``Layout``: node names, addresses, ports, interface and namespace names. From
the layout come ``slurm.conf``, ``topology.conf``, ``gres.conf`` and each
node's hosts file. Nothing here touches the system.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.errors import SpecError

MAX_NODES = 64
CONTROLLER_PORT_OFFSET = 0
CPUS_PER_NODE = 4
# Far below SLURM's MaxJobId (67043328), so a sandbox can number many jobs after it.
MAX_FIRST_JOB_ID = 10**6
MEMORY_PER_NODE_MB = 4096


class Mode(enum.Enum):
    """How the nodes are separated."""

    AUTO = "auto"  # netns where permitted, else loopback
    NETNS = "netns"  # a network namespace, address, hostname and hosts file per node
    LOOPBACK = "loopback"  # several slurmd on 127.0.0.1


class Partitions(enum.Enum):
    """Which partitions the sandbox has."""

    DEFAULT = "default"  # one partition, "debug"
    PREEMPT = "preempt"  # "low" (the default) and "high", which preempts it by requeueing


@dataclass(frozen=True)
class SandboxSpec:
    """What ``hpclaunch sandbox up`` was asked for."""

    nodes: int = 4
    gpus_per_node: int = 0
    partitions: Partitions = Partitions.DEFAULT
    mode: Mode = Mode.AUTO
    # Sandboxes side by side (one per test worker) number their jobs apart: a scan
    # for SLURM_JOB_ID=N then finds only its own sandbox's job N.
    first_job_id: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise SpecError(
                "nodes",
                f"{self.nodes} sandbox nodes is outside 1 to {MAX_NODES}; pick a count in range",
            )
        if not 0 <= self.gpus_per_node <= 16:
            raise SpecError(
                "gpus_per_node", f"{self.gpus_per_node} fake GPUs per node is outside 0 to 16"
            )
        if not 1 <= self.first_job_id <= MAX_FIRST_JOB_ID:
            raise SpecError(
                "first_job_id",
                f"first job id {self.first_job_id} is outside 1 to {MAX_FIRST_JOB_ID}",
            )


@dataclass(frozen=True)
class Node:
    """One sandbox node."""

    name: str
    index: int  # 0-based
    addr: str
    port: int
    netns: str  # the namespace's name (netns mode)
    host_link: str  # the host side of its veth pair (netns mode)
    switch: str  # its leaf switch


@dataclass(frozen=True)
class Layout:
    """Every name, address and path of one sandbox; derived, never stored separately."""

    state_dir: Path
    spec: SandboxSpec
    mode: Mode  # NETNS or LOOPBACK, never AUTO
    controller_addr: str
    controller_port: int
    bridge: str
    subnet_prefix: str  # e.g. "10.254.17."
    nodes: tuple[Node, ...]

    @property
    def conf_path(self) -> Path:
        return self.state_dir / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.state_dir / "munge" / "socket"

    def node(self, name: str) -> Node:
        """The node called ``name``. Raises SpecError naming the nodes that exist."""
        for node in self.nodes:
            if node.name == name:
                return node
        names = ", ".join(n.name for n in self.nodes)
        raise SpecError("node", f"no sandbox node is called {name!r}; the nodes are {names}")


@dataclass(frozen=True)
class Placement:
    """Where a sandbox sits on this machine, chosen free at ``up`` and stored.

    ``sid`` (four hex digits) tells its links and namespaces apart from another
    sandbox's (interface names have 15 characters); ``subnet`` is the third octet
    of its 10.254.X.0/24; ``base_port`` starts a block of free TCP ports
    (controller, then one slurmd port per node in loopback mode).
    """

    sid: str
    subnet: int
    base_port: int


def short_id(state_dir: Path) -> str:
    """The preferred ``sid`` of a sandbox in ``state_dir``."""
    return hashlib.sha1(str(state_dir).encode()).hexdigest()[:4]


def layout(state_dir: Path, spec: SandboxSpec, mode: Mode, place: Placement) -> Layout:
    """The layout of a sandbox in ``state_dir`` placed at ``place``."""
    if mode is Mode.AUTO:
        raise ValueError("layout needs a concrete mode")
    sid, base_port = place.sid, place.base_port
    subnet = f"10.254.{place.subnet}."
    netns = mode is Mode.NETNS
    half = (spec.nodes + 1) // 2
    nodes = tuple(
        Node(
            name=f"n{i + 1}",
            index=i,
            addr=f"{subnet}{i + 11}" if netns else "127.0.0.1",
            # In netns mode every node has its own address and can use the same port.
            port=base_port + 1 if netns else base_port + 1 + i,
            netns=f"hs{sid}-n{i + 1}",
            host_link=f"hs{sid}v{i + 1}",
            switch="leaf1" if i < half else "leaf2",
        )
        for i in range(spec.nodes)
    )
    return Layout(
        state_dir=state_dir,
        spec=spec,
        mode=mode,
        controller_addr=f"{subnet}1" if netns else "127.0.0.1",
        controller_port=base_port + CONTROLLER_PORT_OFFSET,
        bridge=f"hs{sid}br",
        subnet_prefix=subnet,
        nodes=nodes,
    )


def slurm_conf(lay: Layout) -> str:
    """slurm.conf: short timeouts so failure tests take seconds, not minutes."""
    d = lay.state_dir
    gpus = lay.spec.gpus_per_node
    lines = [
        "# Written by hpclaunch sandbox up; rewritten at every up.",
        "ClusterName=sandbox",
        # The machine's own hostname is not a valid controller name here.
        f"SlurmctldHost=localhost({lay.controller_addr})",
        f"SlurmctldPort={lay.controller_port}",
        f"FirstJobId={lay.spec.first_job_id}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        # cred_expire below 5 is rejected (and silently becomes 120); a requeued job is
        # held for cred_expire + 1 s.
        f"AuthInfo=socket={lay.munge_socket},cred_expire=5",
        "CredType=cred/munge",
        f"StateSaveLocation={d}/ctld",
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmdPidFile={d}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd-%n.log",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={d}/log/jobcomp.txt",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "SchedulerParameters=sched_interval=2,bf_interval=1,batch_sched_delay=0,sched_min_interval=0",
        # 1: a node that stopped answering returns by itself when it registers again;
        # one set DOWN by scontrol stays down until resumed (start-node does that).
        "ReturnToService=1",
        "JobRequeue=1",
        "SlurmdTimeout=10",
        "KillWait=3",
        "MessageTimeout=5",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "MinJobAge=3600",
        "TopologyPlugin=topology/tree",
    ]
    if gpus:
        lines.append("GresTypes=gpu")
    if lay.spec.partitions is Partitions.PREEMPT:
        lines += ["PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE"]
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    for node in lay.nodes:
        hostname = node.name if lay.mode is Mode.NETNS else "localhost"
        lines.append(
            f"NodeName={node.name} NodeHostname={hostname} NodeAddr={node.addr} Port={node.port} "
            f"CPUs={CPUS_PER_NODE} RealMemory={MEMORY_PER_NODE_MB}{gres} State=UNKNOWN"
        )
    if lay.spec.partitions is Partitions.PREEMPT:
        lines += [
            "PartitionName=low Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1",
            "PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2",
        ]
    else:
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def topology_conf(lay: Layout) -> str:
    """Two leaf switches under one spine (one leaf for a one-node sandbox)."""
    leaves: dict[str, list[str]] = {}
    for node in lay.nodes:
        leaves.setdefault(node.switch, []).append(node.name)
    lines = [f"SwitchName={leaf} Nodes={','.join(names)}" for leaf, names in leaves.items()]
    lines.append(f"SwitchName=spine Switches={','.join(leaves)}")
    return "\n".join(lines) + "\n"


def gpu_device(lay: Layout, index: int) -> Path:
    """The fake GPU device file ``index`` (a character device like /dev/nvidiaN)."""
    return lay.state_dir / "dev" / f"nvidia{index}"


def gres_conf(lay: Layout) -> str:
    """Fake GPUs: the same device files on every node."""
    gpus = lay.spec.gpus_per_node
    if not gpus:
        return ""
    files = ",".join(str(gpu_device(lay, i)) for i in range(gpus))
    return "".join(f"NodeName={n.name} Name=gpu File={files}\n" for n in lay.nodes)


def hosts_file(lay: Layout) -> str:
    """/etc/hosts as every node sees it in netns mode: all node names resolve."""
    lines = ["127.0.0.1 localhost", f"{lay.controller_addr} sandbox-controller"]
    lines += [f"{n.addr} {n.name}" for n in lay.nodes]
    return "\n".join(lines) + "\n"
