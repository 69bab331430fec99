"""Profiles (TOML) and command-line values → ``JobSpec``.

Profiles live in ``hpclaunch.toml`` in the current folder or in
``$XDG_CONFIG_HOME/hpclaunch/config.toml``, as ``[profiles.NAME]`` tables whose
keys are the ``hpclaunch sbatch`` option names with underscores. Precedence is
flags > profile > built-in defaults. Every error names the file, the profile,
the key and the fix.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpclaunch.contract import rendezvous
from hpclaunch.contract.agent import EntryKind
from hpclaunch.contract.values import TimeoutField, parse_endpoints, parse_nodes, parse_timeout
from hpclaunch.errors import ConfigError, SpecError
from hpclaunch.job.spec import GpuDirective, JobSpec
from hpclaunch.job.values import parse_mem, parse_time

PROJECT_FILE = "hpclaunch.toml"
DEFAULT_PROFILE = "default"


def _expect(kind: type | tuple[type, ...], what: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise TypeError(what)
        if not isinstance(value, kind):
            raise TypeError(what)
        return value

    return convert


def _str_or_int(parse: Callable[[str], Any], what: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        return parse(_expect(str, what)(value))

    return convert


def _choice(enum_type: Any) -> Callable[[Any], Any]:
    names = ", ".join(repr(member.value) for member in enum_type)

    def convert(value: Any) -> Any:
        try:
            return enum_type(value)
        except ValueError:
            raise TypeError(f"one of {names}") from None

    return convert


def _backend(value: Any) -> str:
    if not isinstance(value, str) or value not in rendezvous.BACKENDS:
        raise TypeError(f"one of {rendezvous.choices()}")
    return value


def _str_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TypeError("a string or a list of strings")


def _words(value: Any) -> tuple[str, ...]:
    """A command as a list of words, or one string split like a shell would."""
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as exc:
            raise TypeError(f"a command line that splits into words ({exc})") from None
    return _str_list(value)


def _table(value: Any, *, flags: bool) -> tuple[tuple[str, str | None], ...]:
    if not isinstance(value, dict):
        raise TypeError("a table of NAME = VALUE")
    out: list[tuple[str, str | None]] = []
    for key, item in value.items():
        if flags and item is True:
            out.append((key, None))
        elif isinstance(item, (str, int)) and not isinstance(item, bool):
            out.append((key, str(item)))
        else:
            raise TypeError(
                "a table of NAME = VALUE (strings or numbers"
                + (", or true for a flag)" if flags else ")")
            )
    return tuple(out)


def _timeout(field: TimeoutField) -> Callable[[Any], Any]:
    """A watch's timeout (hpclaunch.contract.values.parse_timeout): seconds, 'auto' or 'off'."""

    def convert(value: Any) -> Any:
        return parse_timeout(_expect((str, int, float), "seconds, 'auto' or 'off'")(value), field)

    return convert


_INT = _expect(int, "a whole number")
_STR = _expect(str, "a string")

# Profile key → (JobSpec field, converter of the TOML value). The rendezvous settings
# (rdzv and the keys of contract.rendezvous.SETTING_KEYS) are flat here and in flags;
# build_spec nests them into JobSpec.rdzv.
PROFILE_KEYS: Mapping[str, tuple[str, Callable[[Any], Any]]] = {
    "nodes": ("nodes", _str_or_int(parse_nodes, "a number or a string like '2:4'")),
    "gpus_per_node": ("gpus_per_node", _INT),
    "nproc_per_node": ("nproc_per_node", _INT),
    "time": ("time_limit", _str_or_int(parse_time, "a SLURM time string like '04:00:00'")),
    "partition": ("partition", _STR),
    "account": ("account", _STR),
    "qos": ("qos", _STR),
    "constraint": ("constraint", _STR),
    "exclude": ("exclude", _STR),
    "mem": ("mem", _str_or_int(parse_mem, "a memory size like '64G'")),
    "cpus_per_task": ("cpus_per_task", _INT),
    "job_name": ("job_name", _STR),
    "log_dir": ("log_dir", _STR),
    "checkpoint_dir": ("checkpoint_dir", _STR),
    "adopt_checkpoints": ("adopt_checkpoints", _expect(bool, "true or false")),
    "checkpoint_patterns": ("checkpoint_patterns", _str_list),
    "max_restarts": ("max_restarts", _INT),
    "hang_timeout": ("hang_timeout", _timeout(TimeoutField.HANG)),
    "checkpoint_timeout": ("checkpoint_timeout", _timeout(TimeoutField.CHECKPOINT)),
    "pause_timeout": ("pause_timeout", _timeout(TimeoutField.PAUSE)),
    "first_step_timeout": ("first_step_timeout", _timeout(TimeoutField.FIRST_STEP)),
    "max_requeues": ("max_requeues", _INT),
    "max_failure_requeues": ("max_failure_requeues", _INT),
    "signal_lead": ("signal_lead_s", _INT),
    "slurm_patience": ("slurm_patience_s", _INT),
    "watch_timeout": ("watch_timeout_s", _INT),
    "rdzv": ("rdzv", _backend),
    "etcd_endpoint": ("etcd_endpoint", lambda v: parse_endpoints(",".join(_str_list(v)))),
    "etcd_sidecar": ("etcd_sidecar", _expect(bool, "true or false")),
    "etcd_binary": ("etcd_binary", _STR),
    "etcd_cacert": ("etcd_cacert", _STR),
    "etcd_cert": ("etcd_cert", _STR),
    "etcd_key": ("etcd_key", _STR),
    "etcd_user": ("etcd_user", _STR),
    "etcd_password_file": ("etcd_password_file", _STR),
    "etcd_outage_timeout": ("etcd_outage_timeout", _expect((int, float), "a number of seconds")),
    "no_kill": ("no_kill", _expect(bool, "true or false")),
    "node_multiple": ("node_multiple", _INT),
    "master_port": ("master_port", _INT),
    "template": ("template", _STR),
    "gpu_directive": ("gpu_directive", _choice(GpuDirective)),
    "sbatch_options": ("sbatch_options", lambda v: _table(v, flags=True)),
    "srun_options": ("srun_options", lambda v: _table(v, flags=True)),
    "setup": ("setup", _str_list),
    "env": (
        "env",
        lambda v: tuple((k, val) for k, val in _table(v, flags=False) if val is not None),
    ),
    "launcher": ("launcher", _words),
}
_PATH_KEYS = ("log_dir", "checkpoint_dir", "template")
_FLAG_SPELLING = {
    "sbatch_options": "--sbatch-option",
    "srun_options": "--srun-option",
    "checkpoint_patterns": "--checkpoint-pattern",
    "gpu_directive": "gpu_directive (a profile key)",
    "launcher": "launcher (a profile key)",
}
_MERGED_BY_KEY = ("sbatch_options", "srun_options", "env")


@dataclass(frozen=True)
class Profile:
    """One ``[profiles.NAME]`` table, converted to JobSpec field values."""

    name: str
    path: Path
    values: Mapping[str, Any]

    @property
    def source(self) -> str:
        return f"{self.path}, profile {self.name!r}"


def profile_files(cwd: Path, env: Mapping[str, str]) -> list[Path]:
    """Where profiles are looked for, first match wins."""
    config_home = env.get("XDG_CONFIG_HOME") or str(
        Path(env.get("HOME", "~")).expanduser() / ".config"
    )
    return [cwd / PROJECT_FILE, Path(config_home) / "hpclaunch" / "config.toml"]


def _read(path: Path) -> dict[str, Any]:
    """The profile tables of the TOML file ``path``. Raises ConfigError."""
    # Imported here: only a folder with a profile file pays for the TOML parser.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}; fix the file") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    unknown = sorted(set(data) - {"profiles"})
    if unknown:
        raise ConfigError(
            f"{path} has the top-level key {unknown[0]!r}; profiles go in [profiles.NAME] tables"
        )
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict) or not all(isinstance(v, dict) for v in profiles.values()):
        raise ConfigError(f"{path}: 'profiles' must hold [profiles.NAME] tables")
    return profiles


def convert_profile(name: str, path: Path, table: Mapping[str, Any]) -> Profile:
    """Check and convert one profile table. Raises ConfigError."""
    values: dict[str, Any] = {}
    for key, raw in table.items():
        if key not in PROFILE_KEYS:
            import difflib  # the hint of an error only

            close = difflib.get_close_matches(key.replace("-", "_"), PROFILE_KEYS, n=1, cutoff=0.5)
            hint = (
                f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(PROFILE_KEYS)}"
            )
            raise ConfigError(f"{path}, profile {name!r}: unknown key {key!r}; {hint}")
        field, convert = PROFILE_KEYS[key]
        try:
            value = convert(raw)
        except TypeError as exc:
            raise ConfigError(
                f"{path}, profile {name!r}, key {key!r}: {raw!r} is not {exc}; fix the value"
            ) from None
        except SpecError as exc:
            raise ConfigError(f"{path}, profile {name!r}, key {key!r}: {exc.message}") from None
        if key in _PATH_KEYS:
            value = os.path.expanduser(value)
            if key == "template" and not Path(value).is_absolute():
                value = str(path.parent / value)  # relative to the profile file
        values[field] = value
    return Profile(name, path, values)


def load_profile(name: str | None, cwd: Path, env: Mapping[str, str]) -> Profile | None:
    """The profile ``name``, or the ``default`` profile if ``name`` is None and one exists.

    Raises ConfigError for an unknown name, a broken file or an invalid value.
    """
    files = [path for path in profile_files(cwd, env) if path.is_file()]
    available: list[str] = []
    for path in files:
        tables = _read(path)
        wanted = name if name is not None else DEFAULT_PROFILE
        if wanted in tables:
            return convert_profile(wanted, path, tables[wanted])
        available += [f"{n} ({path})" for n in tables]
    if name is None:
        return None
    searched = " and ".join(str(p) for p in profile_files(cwd, env))
    fix = (
        f"profiles found: {', '.join(available)}; "
        f"pick one of these or add a [profiles.{name}] table"
        if available
        else f"no profiles are defined; add a [profiles.{name}] table to one of these files"
    )
    raise ConfigError(f"unknown profile {name!r} (from --profile); searched {searched}; {fix}")


@dataclass(frozen=True)
class Entry:
    """The training command: what runs on every worker."""

    target: str
    args: tuple[str, ...] = ()
    kind: EntryKind = EntryKind.SCRIPT


def flag_for(key: str) -> str:
    """The command-line spelling of a profile key, for messages."""
    return _FLAG_SPELLING.get(key, "--" + key.replace("_", "-"))


@dataclass(frozen=True)
class Origin:
    """Where one setting's value came from: a profile's key, a flag, or both (a value
    merged from the two: env, sbatch_options, srun_options, setup, checkpoint_patterns)."""

    profile: str | None = None  # "PATH, profile 'NAME', key 'KEY'"
    flag: str | None = None  # the flag as its user typed it

    def __str__(self) -> str:
        return " and ".join(part for part in (self.profile, self.flag) if part)


@dataclass(frozen=True)
class Resolved:
    """A job as flags and a profile describe it, and where each value came from."""

    spec: JobSpec
    profile: Profile | None
    # profile key -> where its value came from; keys absent have the built-in default.
    origins: Mapping[str, Origin]


def build_spec(
    entry: Entry,
    flags: Mapping[str, Any],
    profile: Profile | None,
    spell: Callable[[str], str] = flag_for,
) -> JobSpec:
    """Merge defaults < profile < flags into a JobSpec (``resolve``'s spec).
    Raises SpecError, prefixed with where each value it names came from."""
    return resolve(entry, flags, profile, spell).spec


def resolve(
    entry: Entry,
    flags: Mapping[str, Any],
    profile: Profile | None,
    spell: Callable[[str], str] = flag_for,
) -> Resolved:
    """Merge defaults < profile < flags into a JobSpec, and say where each value came from.

    ``flags`` maps JobSpec field names to values given on the command line, or
    through the Python API (absent or None when not given); ``spell`` names a
    key as its user typed it, for messages. Raises SpecError, prefixed with
    where each value it names came from.
    """
    key_of = {field: key for key, (field, _) in PROFILE_KEYS.items()}
    fields: dict[str, Any] = {}
    sources: dict[str, str] = {}  # profile key -> where its value came from
    if profile is not None:
        for field, value in profile.values.items():
            fields[field] = value
            sources[key_of[field]] = f"{profile.source}, key {key_of[field]!r}"
    origins = {key: Origin(profile=text) for key, text in sources.items()}
    for field, value in flags.items():
        if value is None or value == ():
            continue
        key = key_of[field]
        if field in _MERGED_BY_KEY and field in fields:
            merged = dict(fields[field])
            merged.update(value)
            value = tuple(merged.items())
        elif field in ("setup", "checkpoint_patterns") and field in fields:
            value = fields[field] + tuple(value)
        merges = field in (*_MERGED_BY_KEY, "setup", "checkpoint_patterns")
        origins[key] = Origin(
            origins[key].profile if merges and key in origins else None, spell(key)
        )
        fields[field] = value
        sources[key] = spell(key)
    try:
        fields["rdzv"] = _nest_rendezvous(fields)
        spec = JobSpec(entrypoint=entry.target, args=entry.args, entry_kind=entry.kind, **fields)
    except SpecError as exc:
        named = [sources[k] for k in exc.fields if k in sources]
        named += [
            f"the default {spell(k)}" for k in exc.fields if k in PROFILE_KEYS and k not in sources
        ]
        where = " and ".join(named) or "the command line"  # script, module, args
        raise SpecError(exc.field, f"{where}: {exc.message}", exc.fields[1:]) from None
    return Resolved(spec, profile, origins)


def _nest_rendezvous(fields: dict[str, Any]) -> rendezvous.Rendezvous:
    """Take the flat rendezvous settings (``rdzv``, ``etcd_endpoint``, ...) out of
    ``fields`` and nest them into the backend's settings. Raises SpecError."""
    given = {key: fields.pop(key) for key in rendezvous.SETTING_KEYS if key in fields}
    return rendezvous.build(fields.pop("rdzv", rendezvous.DEFAULT.name), given)
