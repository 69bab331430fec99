"""Python API parameters → ``JobSpec``. Pure: no I/O, no submitit.

The parameters are the profile keys (``hpclaunch.job.profiles.PROFILE_KEYS``), so the
CLI, profiles and the Python API share one list and one set of converters.
submitit's common names are accepted too (``timeout_min``, ``mem_gb``,
``tasks_per_node``, ``name``, ``slurm_*``), as are two that only the executor
has: ``array_parallelism`` and ``cluster``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpclaunch.contract.agent import EntryKind
from hpclaunch.contract.rendezvous import EtcdRdzv
from hpclaunch.errors import SpecError
from hpclaunch.job.profiles import PROFILE_KEYS, Entry, Profile, build_spec
from hpclaunch.job.spec import DEFAULT_SIGNAL_LEAD_S, JobSpec

# The module every worker rank runs: it loads the pickled call and runs it.
WORKER_MODULE = "hpclaunch.executor.worker"
CLUSTERS = ("slurm", "local")

# submitit's names → (profile key, how the value becomes that key's value).
_SUBMITIT_NAMES: Mapping[str, str] = {
    "timeout_min": "time",
    "mem_gb": "mem",
    "name": "job_name",
    "tasks_per_node": "nproc_per_node",
    # submitit's requeues after a time-out; hpclaunch's budget counts every requeue
    # (preemptions too), so the same number is at least as strict.
    "max_num_timeout": "max_requeues",
}


class ParameterError(SpecError):
    """An Executor parameter is unknown or invalid; the message names it and the fix."""


@dataclass(frozen=True)
class Parameters:
    """What ``update_parameters`` has been given so far, converted."""

    fields: Mapping[str, Any]  # JobSpec field -> value
    given: Mapping[str, str]  # profile key -> the parameter name the user typed
    array_parallelism: int | None = None


def _profile_key(name: str) -> str:
    """The profile key a parameter name stands for (raises ParameterError)."""
    bare = name.removeprefix("slurm_")
    key = _SUBMITIT_NAMES.get(name) or _SUBMITIT_NAMES.get(bare, bare)
    if key in PROFILE_KEYS:
        return key
    known = [*PROFILE_KEYS, *_SUBMITIT_NAMES, "array_parallelism"]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"valid names: {', '.join(known)}"
    raise ParameterError(name, f"update_parameters: unknown parameter {name!r}; {hint}")


# submitit's patterns for one folder per job, as the last part of the folder's path.
_PER_JOB_PATTERNS = ("%j", "%A_%a", "%A")


def executor_folder(folder: str) -> Path:
    """The folder an Executor keeps its files in, from what it was given: submitit's
    ``log/%j`` (one folder per job) is ``log``, since hpclaunch keeps each job's files
    apart inside it by itself. Raises ParameterError for any other '%' pattern. Pure."""
    path = Path(folder)
    if "%" not in folder:
        return path
    if path.name in _PER_JOB_PATTERNS and "%" not in str(path.parent):
        return path.parent
    raise ParameterError(
        "folder",
        f"folder {folder!r} (from hpclaunch.Executor) has a '%' pattern that hpclaunch does "
        "not fill in; it keeps each job's files apart inside the folder by itself, so give "
        "a plain folder (submitit's 'log/%j' is taken as 'log')",
    )


def _submitit_value(name: str, value: Any) -> Any:
    """submitit's units in hpclaunch's: minutes and gigabytes as SLURM strings."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:
        raise ParameterError(name, f"update_parameters({name}={value!r}): give a positive number")
    if name == "timeout_min":
        return str(math.ceil(value))  # SLURM counts whole minutes
    return f"{max(1, math.ceil(value * 1024))}M"  # mem_gb; SLURM's smallest unit is 1M


def convert(params: Mapping[str, Any], before: Parameters | None = None) -> Parameters:
    """Merge ``params`` into ``before``. Raises ParameterError naming the parameter."""
    fields = dict(before.fields) if before else {}
    given = dict(before.given) if before else {}
    parallelism = before.array_parallelism if before else None
    for name, raw in params.items():
        if name in ("array_parallelism", "slurm_array_parallelism"):
            if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
                raise ParameterError(
                    name, f"update_parameters({name}={raw!r}): give a whole number of 1 or more"
                )
            parallelism = raw
            continue
        key = _profile_key(name)
        value = _submitit_value(name, raw) if name in ("timeout_min", "mem_gb") else raw
        field, converter = PROFILE_KEYS[key]
        try:
            fields[field] = converter(value)
        except TypeError as exc:
            raise ParameterError(
                name, f"update_parameters({name}={raw!r}): the value is not {exc}; fix the value"
            ) from None
        except SpecError as exc:
            raise ParameterError(name, f"update_parameters({name}=...): {exc.message}") from None
        given[key] = name
    return Parameters(fields, given, parallelism)


def job_spec(
    folder: Path, params: Parameters, profile: Profile | None, path: str | None = None
) -> JobSpec:
    """The JobSpec of a function job whose pickles live in ``folder``.

    Every worker rank runs ``python -m hpclaunch.executor.worker FOLDER``.
    Unless a profile or parameter sets them, the logs go under ``folder``, and
    the job's PATH is ``path`` when given (the executor passes the submitting
    Python's bin folder first, so the job runs the submitter's hpclaunch).
    """
    fields = dict(params.fields)
    if "log_dir" not in fields and (profile is None or "log_dir" not in profile.values):
        fields["log_dir"] = str(folder)
    env = dict(profile.values.get("env", ()) if profile else ())
    env.update(fields.get("env", ()))
    # submitit.JobEnvironment() in the workers (and in the user's function) knows it is
    # in a SLURM job by this variable, which submitit's own scripts export.
    added = [("SUBMITIT_EXECUTOR", "slurm")]
    if path is not None and "PATH" not in env:
        added.append(("PATH", path))
    fields["env"] = (*fields.get("env", ()), *added)
    _fit_signal_lead(fields, profile)
    entry = Entry(WORKER_MODULE, (str(folder),), EntryKind.MODULE)

    def spell(key: str) -> str:
        return f"update_parameters({params.given.get(key, key)}=...)"

    spec = build_spec(entry, fields, profile, spell)
    if any(key == "array" for key, _ in spec.sbatch_options):
        raise ParameterError(
            "sbatch_options",
            "update_parameters(sbatch_options=...): 'array' is set by map_array; "
            "use map_array(...) with array_parallelism=N instead",
        )
    return spec


def _fit_signal_lead(fields: dict[str, Any], profile: Profile | None) -> None:
    """A short job (``timeout_min=2``) gets its stop warning half-way through the
    time limit instead of the default lead, which would not fit; a lead the user
    set is left as it is (and checked)."""
    defaults = profile.values if profile else {}
    if "signal_lead_s" in fields or "signal_lead_s" in defaults:
        return
    limit = fields.get("time_limit", defaults.get("time_limit"))
    if limit is not None and limit.total_seconds() <= DEFAULT_SIGNAL_LEAD_S:
        fields["signal_lead_s"] = max(1, int(limit.total_seconds()) // 2)


def local_conflicts(spec: JobSpec, params: Parameters) -> None:
    """Refuse what ``cluster="local"`` (one node, this machine) cannot do. SLURM's
    scheduling settings (partition, account, mem, template, sbatch_options, ...)
    mean nothing there and are left unused, so one parameter set serves both."""

    def refuse(key: str, why: str) -> None:
        name = params.given.get(key, key)
        raise ParameterError(key, f"update_parameters({name}=...): {why}")

    if spec.nodes.min != 1 or spec.nodes.max != 1:
        refuse(
            "nodes",
            f"cluster='local' runs one node, not {spec.nodes.sbatch}; "
            "set nodes=1, or use cluster='slurm'",
        )
    if isinstance(spec.rdzv, EtcdRdzv):
        refuse(
            "rdzv",
            "cluster='local' rendezvouses on 127.0.0.1 without etcd; "
            "leave out rdzv='etcd' and the etcd settings",
        )
