"""``hpclaunch init``: a commented profile file with every key profiles accept.

Each key is written commented out, with a line saying what it does; its value is
the built-in default, read from ``JobSpec``'s own defaults (so the file cannot
disagree with the code), or an example where there is no default to show.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from hpclaunch.contract import rendezvous
from hpclaunch.job.profiles import DEFAULT_PROFILE, PROFILE_KEYS
from hpclaunch.job.spec import JobSpec
from hpclaunch.ops.settings import jsonable

# key -> (what it does, an example value for keys whose default is "unset").
DESCRIPTIONS: Mapping[str, tuple[str, Any]] = {
    "nodes": ('Node count N, or "MIN:MAX" for an elastic job.', None),
    "gpus_per_node": ("GPUs per node; 0 for a CPU job.", None),
    "nproc_per_node": ("Workers per node. Default: GPUs per node, or 1.", 8),
    "time": (
        "Time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED. Default: the partition's.",
        "04:00:00",
    ),
    "partition": ("SLURM partition. Default: SLURM's default partition.", "gpu"),
    "account": ("SLURM account to charge. Default: your default account.", "proj42"),
    "qos": ("SLURM quality of service.", "normal"),
    "constraint": ("Node features the job needs (SLURM --constraint).", "a100"),
    "exclude": ("Nodes to keep the job off (a SLURM hostlist).", "node[01-02]"),
    "mem": ('Memory per node, e.g. "64G" ("0": all of it). Default: the partition\'s.', "64G"),
    "cpus_per_task": ("CPUs for each node's agent and its workers.", 32),
    "job_name": ("Job name. Default: the script's name.", "train"),
    "log_dir": ("Folder for logs and job folders (relative: to the submit folder).", None),
    "checkpoint_dir": (
        "HPCLAUNCH_CHECKPOINT_DIR for workers. Default: LOG_DIR/JOBID/checkpoints.",
        "/scratch/me/checkpoints",
    ),
    "adopt_checkpoints": (
        "Continue from the checkpoints an ended job left in checkpoint_dir.",
        None,
    ),
    "checkpoint_patterns": (
        "Globs naming checkpoints the job writes its own way, for `hpclaunch status`.",
        ["ckpt/*.pt"],
    ),
    "max_restarts": ("In-place worker-group restarts per node.", None),
    "hang_timeout": (
        'Seconds without training progress before workers count as hung; "auto" or "off".',
        None,
    ),
    "checkpoint_timeout": (
        'Seconds a save or load through hpclaunch.checkpoint may take; "auto" or "off".',
        None,
    ),
    "pause_timeout": (
        'Seconds a pause (hpclaunch.progress.paused) may last; "auto" or "off".',
        None,
    ),
    "first_step_timeout": (
        'Seconds from an attempt\'s start to its first step; "auto" or "off".',
        None,
    ),
    "max_requeues": ("Requeue budget of the batch-step supervisor.", None),
    "max_failure_requeues": (
        "Requeues without bad nodes (preemptions and time limits do not count).",
        None,
    ),
    "signal_lead": ("Seconds before the time limit that SLURM warns the job (USR1).", None),
    "slurm_patience": (
        "Seconds the supervisor keeps trying an unreachable SLURM controller after a failed step.",
        None,
    ),
    "watch_timeout": (
        "Seconds after which a stopped srun, a silent agent or a silent supervisor is acted on.",
        None,
    ),
    "rdzv": (f"Rendezvous backend: {rendezvous.choices()}.", None),
    "etcd_endpoint": ('etcd endpoints for rdzv = "etcd".', ["etcd1:2379", "etcd2:2379"]),
    "etcd_sidecar": ('Start an etcd server on the first node (rdzv = "etcd").', True),
    "etcd_binary": ("The etcd server the sidecar runs.", "etcd"),
    "etcd_cacert": ("CA certificate of your etcd (a path on the nodes).", "/etc/etcd/ca.pem"),
    "etcd_cert": ("Client certificate for your etcd (with etcd_key).", "/etc/etcd/client.pem"),
    "etcd_key": ("Client key for your etcd (with etcd_cert).", "/etc/etcd/client-key.pem"),
    "etcd_user": ("etcd user name.", "train"),
    "etcd_password_file": (
        "A file holding the etcd password (never the password itself).",
        "~/.config/etcd-password",
    ),
    "etcd_outage_timeout": ("Seconds an etcd outage is waited out.", 120),
    "no_kill": ('Keep the job when a node is lost (with nodes = "MIN:MAX").', None),
    "node_multiple": ("Keep the node count a multiple of K.", None),
    "master_port": (
        "The rendezvous port on the first node. Default: 15000 + job id % 10000.",
        29500,
    ),
    "template": (
        "A Jinja template instead of the built-in one (relative: to this file).",
        "templates/site.sh.j2",
    ),
    "gpu_directive": ('How GPUs are asked for: "gpus-per-node" or "gres".', None),
    "sbatch_options": (
        "Extra #SBATCH options; true for a bare flag.",
        {"exclusive": True, "mail-type": "END"},
    ),
    "srun_options": ("Extra srun options for the agents' step.", {"cpu-bind": "none"}),
    "setup": (
        "Shell lines run before the launch, as written.",
        ["module load cuda/12.4", "source ~/venvs/train/bin/activate"],
    ),
    "env": ("Environment variables for the job.", {"NCCL_DEBUG": "WARN"}),
    "launcher": ("The command that starts the agent on each node.", None),
}


def toml_value(value: Any) -> str:
    """``value`` (bool, number, string, list, table) as a TOML literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for what these values hold
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")


def default_value(key: str) -> Any:
    """The built-in default of profile key ``key`` as a profile writes it; None where the
    default is "not set" (SLURM or hpclaunch decides) or an etcd setting."""
    if key in rendezvous.SETTING_KEYS:
        return None
    if key == "rdzv":
        return rendezvous.DEFAULT.name
    field = next(f for f in dataclasses.fields(JobSpec) if f.name == PROFILE_KEYS[key][0])
    value = jsonable(field.default)
    if key == "nodes":
        return int(value)
    return None if value in (None, [], {}) else value


def text(profile: str = DEFAULT_PROFILE) -> str:
    """The file ``hpclaunch init`` writes: one ``[profiles.NAME]`` table, every key
    commented out with its default (or an example)."""
    lines = [
        "# hpclaunch profiles: `hpclaunch sbatch` reads this file from the folder it runs in",
        "# (./hpclaunch.toml) or from ~/.config/hpclaunch/config.toml. Uncomment a line to",
        "# change a setting; a flag on the command line still wins. Check the result with",
        "# `hpclaunch config show`. All keys: docs/profiles.md.",
        "",
        f"[profiles.{profile}]",
    ]
    for key in PROFILE_KEYS:
        what, example = DESCRIPTIONS[key]
        default = default_value(key)
        lines += ["", f"# {what}"]
        if default is not None:
            lines.append(f"# {key} = {toml_value(default)}")
        else:
            lines.append(f"# {key} = {toml_value(example)}    # an example")
    return "\n".join(lines) + "\n"
