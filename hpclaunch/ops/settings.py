"""``hpclaunch config show``: the settings ``hpclaunch sbatch`` would use, each with
its source. Pure: the values and their sources come from
``hpclaunch.job.profiles.resolve``, the code ``sbatch`` itself runs; this module
only names the defaults and the environment variables SLURM reads on top.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from hpclaunch.contract import rendezvous
from hpclaunch.contract.values import NodeRange
from hpclaunch.job.profiles import PROFILE_KEYS, Origin, Resolved, flag_for
from hpclaunch.job.values import format_time

# What an unset (None) value means: who decides instead.
UNSET = {
    "nproc_per_node": "GPUs per node, or 1",
    "time": "the partition's default time limit",
    "partition": "SLURM's default partition",
    "account": "your default SLURM account",
    "qos": "the default QOS",
    "constraint": "none",
    "exclude": "none",
    "mem": "the partition's default",
    "cpus_per_task": "SLURM's default",
    "job_name": "the script's name",
    "checkpoint_dir": "LOG_DIR/JOBID/checkpoints",
    "master_port": "15000 + job id % 10000",
    "template": "the built-in template",
}

# sbatch reads these environment variables and lets them override the #SBATCH lines of
# the script (sbatch(1), INPUT ENVIRONMENT VARIABLES): set in the submitting shell, they
# change the job behind hpclaunch's back.
SLURM_ENV = {
    "gpus_per_node": "SBATCH_GPUS_PER_NODE",
    "time": "SBATCH_TIMELIMIT",
    "partition": "SBATCH_PARTITION",
    "account": "SBATCH_ACCOUNT",
    "qos": "SBATCH_QOS",
    "constraint": "SBATCH_CONSTRAINT",
    "mem": "SBATCH_MEM_PER_NODE",
    "job_name": "SBATCH_JOB_NAME",
    "no_kill": "SBATCH_NO_KILL",
}
# Others that fight the directives hpclaunch renders, with the setting they fight.
SLURM_ENV_CONFLICTS = {
    "SBATCH_GRES": "gpus_per_node",
    "SBATCH_GPUS": "gpus_per_node",
    "SBATCH_GPUS_PER_TASK": "gpus_per_node",
    "SBATCH_OPEN_MODE": "log_dir",
    "SBATCH_NO_REQUEUE": "max_requeues",  # requeue off: hpclaunch's requeues would fail
    "SBATCH_SIGNAL": "signal_lead",  # replaces the time-limit warning hpclaunch asks for
}


class Kind(enum.Enum):
    """Where a value came from."""

    DEFAULT = "default"
    PROFILE = "profile"
    FLAG = "flag"
    PROFILE_AND_FLAG = "profile and flag"
    ENVIRONMENT = "environment"


@dataclass(frozen=True)
class Setting:
    """One setting as ``config show`` prints it."""

    key: str  # the profile key
    value: Any  # JSON-ready
    text: str  # the value as the table shows it
    kind: Kind
    source: str  # the file and profile, the flag, the variable, or what decides a default
    overridden: Setting | None = None  # hpclaunch's value, where SLURM's environment wins


def _origin_kind(origin: Origin) -> Kind:
    if origin.profile and origin.flag:
        return Kind.PROFILE_AND_FLAG
    return Kind.FLAG if origin.flag else Kind.PROFILE


def raw_value(resolved: Resolved, key: str) -> Any:
    """The value of profile key ``key`` in the resolved job, as JobSpec holds it."""
    spec = resolved.spec
    if key == "rdzv":
        return spec.rdzv.name
    if key == "etcd_endpoint":
        return spec.etcd_endpoints
    return getattr(spec, PROFILE_KEYS[key][0])


def jsonable(value: Any) -> Any:
    """A JobSpec value as JSON holds it: tables as objects, durations as SLURM writes them."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, NodeRange):
        return str(value)
    if isinstance(value, timedelta):
        return format_time(value)
    if (
        isinstance(value, tuple)
        and value
        and all(isinstance(v, tuple) and len(v) == 2 for v in value)
    ):
        return {k: (True if v is None else v) for k, v in value}
    if isinstance(value, tuple):
        return list(value)
    return value


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return ", ".join(k if v is True else f"{k}={v}" for k, v in value.items()) or "(none)"
    if isinstance(value, list):
        return "; ".join(value) or "(none)"
    return str(value)


def settings(resolved: Resolved, env: Mapping[str, str], script_named: bool) -> list[Setting]:
    """Every profile key's effective value and source, in the profile key order; the etcd
    keys only under ``rdzv = "etcd"``. ``env`` is the submitting shell's environment."""
    etcd = resolved.spec.rdzv.name == "etcd"
    out: list[Setting] = []
    for key in PROFILE_KEYS:
        if key in rendezvous.SETTING_KEYS and not etcd:
            continue
        value = jsonable(raw_value(resolved, key))
        origin = resolved.origins.get(key)
        if origin is not None:
            setting = Setting(key, value, _text(value), _origin_kind(origin), str(origin))
        else:
            setting = _default(resolved, key, value, script_named)
        out.append(_slurm_env(setting, env))
    return out


def _default(resolved: Resolved, key: str, value: Any, script_named: bool) -> Setting:
    spec = resolved.spec
    if key == "nproc_per_node" and value is None:
        value = spec.effective_nproc_per_node
    elif key == "job_name" and value is None and script_named:
        value = spec.effective_job_name
    if value is None or (key == "job_name" and not script_named):
        return Setting(key, None, "-", Kind.DEFAULT, f"default: {UNSET[key]}")
    note = f": {UNSET[key]}" if key in UNSET else ""
    return Setting(key, value, _text(value), Kind.DEFAULT, f"default{note}")


def _slurm_env(setting: Setting, env: Mapping[str, str]) -> Setting:
    var = SLURM_ENV.get(setting.key)
    if var is None or var not in env:
        return setting
    return Setting(
        setting.key,
        env[var],
        env[var],
        Kind.ENVIRONMENT,
        f"${var}: sbatch lets it override the #SBATCH line",
        setting,
    )


def warnings(rows: list[Setting], env: Mapping[str, str]) -> list[str]:
    """What to fix in the submitting shell: SLURM variables that override or fight
    the directives hpclaunch renders."""
    out = [
        f"${SLURM_ENV[row.key]}={row.text} is set, so sbatch uses it instead of "
        f"{row.overridden.text} ({row.overridden.source}); unset it: it overrides any "
        f"{flag_for(row.key)}"
        for row in rows
        if row.overridden is not None
    ]
    out += [
        f"${var}={env[var]} is set, so sbatch adds it to the job against hpclaunch's "
        f"{flag_for(key)}; unset it"
        for var, key in SLURM_ENV_CONFLICTS.items()
        if var in env
    ]
    return out


def table(rows: list[Setting]) -> str:
    """The text form: one line per setting, ``KEY  VALUE  SOURCE``."""
    width_key = max(len(r.key) for r in rows)
    width_value = min(max(len(r.text) for r in rows), 24)
    lines = []
    for row in rows:
        lines.append(f"{row.key:<{width_key}}  {row.text:<{width_value}}  {row.source}")
        if row.overridden is not None:
            was = row.overridden
            lines.append(
                f"{'':<{width_key}}  {'':<{width_value}}  (instead of {was.text}: {was.source})"
            )
    return "\n".join(lines)


def as_json(rows: list[Setting]) -> dict[str, Any]:
    """``--json``'s ``settings`` object: key -> value, source kind and source."""
    out: dict[str, Any] = {}
    for row in rows:
        entry: dict[str, Any] = {"value": row.value, "from": row.kind.value, "source": row.source}
        if row.overridden is not None:
            entry["overrides"] = {
                "value": row.overridden.value,
                "from": row.overridden.kind.value,
                "source": row.overridden.source,
            }
        out[row.key] = entry
    return out
