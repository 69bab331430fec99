"""``hpclaunch doctor``: the judges. Each takes what a SLURM command printed (plain
strings) and says ok, a warning, or a problem with its fix. Pure: the commands are
run by hpclaunch.ops.doctor_probe; unit tests feed these functions strings.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpclaunch.slurm.commands import parse_show_job

COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "sinfo")
# Filesystems that live on one machine: a log folder there is not seen by the nodes.
LOCAL_FS = frozenset({"tmpfs", "ramfs", "overlayfs", "overlay", "squashfs"})


class Verdict(enum.Enum):
    OK = "ok"
    WARN = "warn"  # worth knowing; does not fail the doctor
    PROBLEM = "problem"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Finding:
    """One check's answer: one line of the doctor's report."""

    check: str
    verdict: Verdict
    message: str
    fix: str | None = None

    def line(self) -> str:
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"{self.verdict.value:<8} {self.check}: {self.message}{fix}"


def commands(found: Mapping[str, str | None]) -> Finding:
    """``found``: each SLURM command and where PATH has it (None: missing)."""
    missing = [name for name in COMMANDS if not found.get(name)]
    if missing:
        return Finding(
            "commands",
            Verdict.PROBLEM,
            f"{', '.join(missing)} not on PATH",
            "run hpclaunch on a login node of the cluster, or load SLURM's "
            "module (e.g. `module load slurm`)",
        )
    folders = sorted({str(found[name]).rsplit("/", 1)[0] for name in COMMANDS})
    return Finding("commands", Verdict.OK, f"{', '.join(COMMANDS)} in {', '.join(folders)}")


def slurm_conf(value: str | None, exists: bool) -> Finding | None:
    """A SLURM_CONF that names no file (SLURM would retry for a minute, then fail)."""
    if value is not None and not exists:
        return Finding(
            "controller",
            Verdict.PROBLEM,
            f"SLURM_CONF={value} is not a file",
            "point SLURM_CONF at the cluster's slurm.conf, or unset it",
        )
    return None


def controller(conf: str | None, returncode: int, stdout: str, stderr: str) -> Finding:
    """``scontrol ping``'s answer. ``conf``: SLURM_CONF, if set."""
    where = f"SLURM_CONF={conf}" if conf else "SLURM_CONF unset: slurm.conf found by SLURM"
    if returncode == 0 and "is UP" in stdout:
        return Finding("controller", Verdict.OK, f"{stdout.strip()} ({where})")
    text = (stderr.strip() or stdout.strip() or "no answer").splitlines()
    if "configuration source" in stderr or "DNS SRV" in stderr:
        return Finding(
            "controller",
            Verdict.PROBLEM,
            "SLURM found no slurm.conf (SLURM_CONF is unset, there is none in its "
            "default place, and no DNS SRV record names the controller)",
            "export SLURM_CONF=/path/to/slurm.conf (ask your admins where it is)",
        )
    return Finding(
        "controller",
        Verdict.PROBLEM,
        f"scontrol ping: {text[-1]} ({where})",
        "check that slurmctld runs and that this machine can reach it (`scontrol ping`)",
    )


def parse_partitions(text: str) -> dict[str, dict[str, str]]:
    """``scontrol show partition --oneliner``: name -> its KEY=VALUE fields."""
    out = {}
    for line in text.splitlines():
        fields = parse_show_job(line)
        if "PartitionName" in fields:
            out[fields["PartitionName"]] = fields
    return out


def _limit(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def partition(wanted: str | None, text: str, min_nodes: int) -> Finding:
    """Whether ``wanted`` (None: the default) exists, is up, and holds ``min_nodes``."""
    parts = parse_partitions(text)
    listing = ", ".join(n + ("*" if f.get("Default") == "YES" else "") for n, f in parts.items())
    if wanted is None:
        default = [n for n, f in parts.items() if f.get("Default") == "YES"]
        if not default:
            return Finding(
                "partition",
                Verdict.PROBLEM,
                f"no partition given and the cluster has no default ({listing})",
                "give --partition, or partition in the profile",
            )
        wanted = default[0]
    if wanted not in parts:
        return Finding(
            "partition",
            Verdict.PROBLEM,
            f"{wanted!r} does not exist; the partitions here are {listing or 'none'} "
            "(* the default)",
            "give one of these with --partition, or as partition in the profile",
        )
    fields = parts[wanted]
    total = _limit(fields.get("TotalNodes", ""))
    max_nodes = _limit(fields.get("MaxNodes", ""))
    shown = (
        f"{wanted!r}: {fields.get('TotalNodes', '?')} nodes ({fields.get('Nodes', '?')}), "
        f"MaxNodes={fields.get('MaxNodes', '?')}, MaxTime={fields.get('MaxTime', '?')}, "
        f"State={fields.get('State', '?')}"
    )
    if fields.get("State", "UP") != "UP":
        return Finding(
            "partition",
            Verdict.PROBLEM,
            shown,
            "jobs wait until an admin sets it UP; pick another partition",
        )
    cap = min(x for x in (total, max_nodes, min_nodes) if x is not None)
    if cap < min_nodes:
        return Finding(
            "partition",
            Verdict.PROBLEM,
            f"{shown}; the job asks for {min_nodes} nodes and could never start",
            f"ask for at most {cap} nodes (--nodes)",
        )
    return Finding("partition", Verdict.OK, shown)


def test_only(returncode: int, stderr: str, gpus: int, directive: str) -> Finding:
    """``sbatch --test-only`` of the rendered job script. ``directive``: how the
    script asks for GPUs (``gpus-per-node`` or ``gres``)."""
    last = (stderr.strip().splitlines() or ["no answer"])[-1].removeprefix("sbatch: ")
    asked = f"{gpus} GPUs per node as --{directive}" if gpus else "no GPUs"
    if returncode == 0:
        return Finding("job script", Verdict.OK, f"sbatch --test-only accepts it ({asked}): {last}")
    fix = "check the values named above with `hpclaunch config show`"
    lowered = stderr.lower()
    if gpus and ("gres" in lowered or "gpu" in lowered or "node configuration" in lowered):
        other = "gres" if directive == "gpus-per-node" else "gpus-per-node"
        fix = (
            f"the partition's nodes may have fewer GPUs, or the cluster may want "
            f"gpu_directive = {other!r} in the profile"
        )
    return Finding(
        "job script", Verdict.PROBLEM, f"sbatch --test-only refuses it ({asked}): {last}", fix
    )


def requeue(config: str, partition_fields: Mapping[str, str], max_requeues: int) -> Finding:
    """Whether SLURM lets the job be requeued as often as its supervisor will ask:
    ``scontrol show config`` and the partition's fields."""
    conf = {}
    for line in config.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            conf[key.strip()] = value.strip()
    notes = [f"JobRequeue={conf.get('JobRequeue', '?')} (hpclaunch asks --requeue itself)"]
    cap = _limit(conf.get("MaxBatchRequeue", ""))
    if cap is not None:
        notes.append(f"MaxBatchRequeue={cap}")
        if cap < max_requeues:
            return Finding(
                "requeue",
                Verdict.PROBLEM,
                f"{', '.join(notes)}: SLURM holds the job after {cap} requeues, "
                f"before the supervisor's {max_requeues}",
                f"set max_requeues = {cap} or lower",
            )
    mode = partition_fields.get("PreemptMode") or conf.get("PreemptMode", "?")
    notes.append(f"PreemptMode={mode}")
    if "CANCEL" in mode.upper():
        return Finding(
            "requeue",
            Verdict.WARN,
            f"{', '.join(notes)}: a preempted job is cancelled, not requeued",
            "use a partition whose PreemptMode is REQUEUE for long jobs",
        )
    return Finding("requeue", Verdict.OK, ", ".join(notes))


def sections(stdout: str) -> dict[str, str]:
    """The ``@@NAME`` sections the node probe prints."""
    out: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith("@@"):
            current = line[2:].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return {key: "\n".join(lines).strip() for key, lines in out.items()}


def allocation(returncode: int, stderr: str) -> Finding | None:
    """Why the node probe got no node, if it did not."""
    if returncode == 0:
        return None
    last = (stderr.strip().splitlines() or ["no answer"])[-1]
    return Finding(
        "nodes",
        Verdict.WARN,
        f"no node to look at: {last}",
        "run again when the partition has an idle node, or skip with --no-allocate",
    )


def on_nodes(probe: Mapping[str, str], launcher: Sequence[str], version: str) -> Finding:
    """``hpclaunch`` on a node's PATH (the supervisor runs it) and the launcher's version."""
    where = probe.get("which", "")
    answer = probe.get("version", "")
    command = " ".join(launcher)
    if not where:
        return Finding(
            "hpclaunch on nodes",
            Verdict.PROBLEM,
            f"`hpclaunch` is not on PATH on {probe.get('host', 'the node')}",
            "install hpclaunch where the nodes see it (a shared venv) and activate "
            "it in a setup line",
        )
    if not answer.endswith(version):
        return Finding(
            "hpclaunch on nodes",
            Verdict.PROBLEM,
            f"`{command} --version` on the node printed {answer!r}, not {version}",
            "install the same hpclaunch on the nodes as here",
        )
    return Finding(
        "hpclaunch on nodes",
        Verdict.OK,
        f"{where} on {probe.get('host', 'the node')}; `{command} --version`: {answer}",
    )


def shared(folder: str, marker: str, probe: Mapping[str, str]) -> Finding:
    """Whether a node read the marker this machine wrote into the log folder."""
    seen = probe.get("marker", "")
    if seen == marker:
        return Finding(
            "log folder",
            Verdict.OK,
            f"{folder} is shared: {probe.get('host', 'a node')} read this machine's "
            f"marker ({probe.get('fs', '?')})",
        )
    return Finding(
        "log folder",
        Verdict.PROBLEM,
        f"{probe.get('host', 'the node')} cannot read {folder}'s marker "
        f"({seen.splitlines()[-1] if seen else 'nothing'})",
        "give --log-dir (or log_dir) a folder on a filesystem the nodes share",
    )


def filesystem(folder: str, fs_type: str) -> Finding:
    """The log folder's filesystem type alone (``stat -f -c %T``), without a node."""
    if fs_type in LOCAL_FS:
        return Finding(
            "log folder",
            Verdict.PROBLEM,
            f"{folder} is on {fs_type}, which the nodes cannot see",
            "give --log-dir (or log_dir) a folder on a shared filesystem",
        )
    return Finding(
        "log folder",
        Verdict.WARN,
        f"{folder} is on {fs_type or 'an unknown filesystem'}; not checked from a node",
    )
