"""`hpclaunch doctor`'s judges, fed what SLURM printed on the sandbox (22.05) and
what it prints when something is broken."""

from __future__ import annotations

from hpclaunch.ops import doctor
from hpclaunch.ops.doctor import Verdict

PARTITIONS = (
    "PartitionName=low AllowGroups=ALL Default=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED "
    "Nodes=n[1-4] PreemptMode=REQUEUE State=UP TotalCPUs=16 TotalNodes=4\n"
    "PartitionName=high AllowGroups=ALL Default=NO MaxNodes=2 MaxTime=1-00:00:00 "
    "Nodes=n[1-4] PreemptMode=CANCEL State=UP TotalCPUs=16 TotalNodes=4\n"
    "PartitionName=old Default=NO MaxNodes=UNLIMITED Nodes=n9 State=DOWN TotalNodes=1\n"
)
CONFIG = "JobRequeue              = 1\nPreemptMode             = REQUEUE\nMaxBatchRequeue = 5\n"


def test_commands() -> None:
    found = {name: f"/usr/bin/{name}" for name in doctor.COMMANDS}
    assert doctor.commands(found).verdict is Verdict.OK
    missing = doctor.commands({**found, "srun": None, "sinfo": None})
    assert missing.verdict is Verdict.PROBLEM
    assert missing.message == "srun, sinfo not on PATH"


def test_controller() -> None:
    up = doctor.controller("/etc/slurm.conf", 0, "Slurmctld(primary) at vm is UP\n", "")
    assert up.verdict is Verdict.OK
    dns = (
        "scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
        "scontrol: error: fetch_config: DNS SRV lookup failed\n"
        "scontrol: fatal: Could not establish a configuration source\n"
    )
    unset = doctor.controller(None, 1, "", dns)
    assert unset.verdict is Verdict.PROBLEM
    assert "SLURM found no slurm.conf" in unset.message and "export SLURM_CONF" in str(unset.fix)
    down = doctor.controller(None, 1, "", "slurm_ping error: Unable to contact slurm controller")
    assert "Unable to contact" in down.message
    assert doctor.slurm_conf("/nope", exists=False) is not None
    assert doctor.slurm_conf(None, exists=True) is None


def test_partition() -> None:
    ok = doctor.partition(None, PARTITIONS, 2)
    assert ok.verdict is Verdict.OK and ok.message.startswith("'low': 4 nodes (n[1-4])")
    nope = doctor.partition("gpu", PARTITIONS, 1)
    assert nope.verdict is Verdict.PROBLEM
    assert "'gpu' does not exist; the partitions here are low*, high, old" in nope.message
    big = doctor.partition("high", PARTITIONS, 3)
    assert big.verdict is Verdict.PROBLEM and big.fix == "ask for at most 2 nodes (--nodes)"
    assert doctor.partition("old", PARTITIONS, 1).verdict is Verdict.PROBLEM
    none = doctor.partition(None, PARTITIONS.replace("Default=YES", "Default=NO"), 1)
    assert "no partition given and the cluster has no default" in none.message


def test_test_only() -> None:
    ok = doctor.test_only(
        0,
        "sbatch: Job 1 to start at 2026-11-25T04:59:49 using 1 processors "
        "on nodes n1 in partition high\n",
        2,
        "gpus-per-node",
    )
    assert ok.verdict is Verdict.OK and "2 GPUs per node as --gpus-per-node" in ok.message
    refused = doctor.test_only(
        1, "allocation failure: Requested node configuration is not available\n", 8, "gpus-per-node"
    )
    assert refused.verdict is Verdict.PROBLEM
    assert "gpu_directive = 'gres'" in str(refused.fix)
    gres = doctor.test_only(
        1, "sbatch: error: Invalid generic resource (gres) specification", 4, "gres"
    )
    assert "gpu_directive = 'gpus-per-node'" in str(gres.fix)


def test_requeue() -> None:
    fields = doctor.parse_partitions(PARTITIONS)
    assert doctor.requeue(CONFIG, fields["low"], 3).verdict is Verdict.OK
    capped = doctor.requeue(CONFIG, fields["low"], 10)
    assert capped.verdict is Verdict.PROBLEM and capped.fix == "set max_requeues = 5 or lower"
    cancel = doctor.requeue(CONFIG, fields["high"], 3)
    assert cancel.verdict is Verdict.WARN and "cancelled, not requeued" in cancel.message


PROBE = (
    "@@host\nn1\n@@which\n/v/bin/hpclaunch\n@@version\nhpclaunch, version 0.1.0\n"
    "@@marker\nab12\n@@fs\nnfs\n"
)


def test_node_probe() -> None:
    probe = doctor.sections(PROBE)
    version = "hpclaunch, version 0.1.0"
    assert probe == {
        "host": "n1",
        "which": "/v/bin/hpclaunch",
        "version": version,
        "marker": "ab12",
        "fs": "nfs",
    }
    assert doctor.on_nodes(probe, ["hpclaunch"], "0.1.0").verdict is Verdict.OK
    other = doctor.on_nodes(probe, ["hpclaunch"], "0.2.0")
    assert other.verdict is Verdict.PROBLEM and "not 0.2.0" in other.message
    gone = doctor.on_nodes({**probe, "which": ""}, ["hpclaunch"], "0.1.0")
    assert "`hpclaunch` is not on PATH on n1" in gone.message
    assert doctor.shared("/logs", "ab12", probe).verdict is Verdict.OK
    local = doctor.shared("/logs", "ab12", {**probe, "marker": "cat: /logs/m: No such file"})
    assert local.verdict is Verdict.PROBLEM and "No such file" in local.message
    assert doctor.filesystem("/tmp/x", "tmpfs").verdict is Verdict.PROBLEM
    assert doctor.filesystem("/home/x", "nfs").verdict is Verdict.WARN
    assert doctor.allocation(0, "") is None
    busy = doctor.allocation(1, "srun: error: Unable to allocate resources: Immediate fail\n")
    assert busy is not None and busy.verdict is Verdict.WARN


def test_a_finding_is_one_line() -> None:
    line = doctor.Finding("partition", Verdict.PROBLEM, "'x' does not exist", "give -p").line()
    assert line == "problem  partition: 'x' does not exist; fix: give -p"
