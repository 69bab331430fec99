"""How the per-node agents find each other: one frozen settings type per backend,
and the table of backends (``BACKENDS``) that ``--rdzv``'s choices, the profile
key ``rdzv`` and the agent's option are all derived from. The job spec holds these
settings; the agent's options name them again (``hpclaunch.contract.agent``).

A new backend is one type here and one line in ``BACKENDS``. Its settings are
given flat, as flags and profile keys (``--etcd-endpoint``, ``etcd_endpoint``);
``build`` nests them into the backend's type, whose ``__post_init__`` checks its
own rules. Rules between the rendezvous and the rest of the job (the node range,
``--node-multiple``) are JobSpec's. Pure: no I/O, no etcd or torch import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from hpclaunch.errors import SpecError

# Compiled on first use (re's own cache), not by every command that loads this module.
_ENDPOINT = r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d+)\Z"


class Rendezvous:
    """The rendezvous settings of a job: a ``StaticRdzv``, ``C10dRdzv`` or ``EtcdRdzv``."""

    name: ClassVar[str]
    # The flat settings this backend takes: profile key (and flag, with dashes) -> attribute.
    keys: ClassVar[Mapping[str, str]] = {}
    # Ranks come fixed from SLURM: the node count cannot change, nor be rounded.
    fixed_ranks: ClassVar[bool] = False

    def __str__(self) -> str:
        return self.name

    @property
    def value(self) -> str:
        """The backend's name, as the ``Rendezvous`` enum this type replaced spelled it
        (templates read ``spec.rdzv.value``)."""
        return self.name

    def argv(self) -> list[str]:
        """This backend's settings as ``hpclaunch agent`` flags, after ``--rdzv NAME``."""
        return []


@dataclass(frozen=True)
class StaticRdzv(Rendezvous):
    """Fixed ranks from SLURM's node order; no rendezvous service."""

    name = "static"
    fixed_ranks = True


@dataclass(frozen=True)
class C10dRdzv(Rendezvous):
    """A store on the first node of the step (the default)."""

    name = "c10d"


@dataclass(frozen=True)
class EtcdRdzv(Rendezvous):
    """An etcd of your own (``endpoints``), or one the first node starts (``sidecar``).

    The same settings serve the login node (validated, rendered into the script) and
    the agent (``rdzv_configs``). Paths and a user name, never a password. Raises
    SpecError naming the option as users type it.
    """

    name = "etcd"
    keys: ClassVar[Mapping[str, str]] = {
        "etcd_endpoint": "endpoints",
        "etcd_sidecar": "sidecar",
        "etcd_binary": "binary",
        "etcd_cacert": "cacert",
        "etcd_cert": "cert",
        "etcd_key": "key",
        "etcd_user": "user",
        "etcd_password_file": "password_file",
        "etcd_outage_timeout": "outage_timeout",
    }

    endpoints: tuple[str, ...] = ()
    sidecar: bool = False
    binary: str | None = None
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password_file: str | None = None
    outage_timeout: float | None = None  # None: the handler's default (120 s)

    def __post_init__(self) -> None:
        if not isinstance(self.endpoints, tuple):
            raise SpecError(
                "etcd_endpoint", f"{self.endpoints!r} is not a tuple; give a tuple of strings"
            )
        if not self.endpoints and not self.sidecar:
            raise SpecError("rdzv", "--rdzv etcd needs --etcd-endpoint HOST:PORT or --etcd-sidecar")
        if self.endpoints and self.sidecar:
            raise SpecError(
                "etcd_sidecar",
                "--etcd-endpoint and --etcd-sidecar exclude each other; give one",
                also=("etcd_endpoint",),
            )
        if (self.cert is None) != (self.key is None):
            raise SpecError(
                "etcd_cert" if self.cert is not None else "etcd_key",
                "a client certificate needs both --etcd-cert and --etcd-key",
            )
        if self.password_file is not None and self.user is None:
            raise SpecError("etcd_password_file", "a password file needs --etcd-user NAME as well")
        timeout = self.outage_timeout
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            shown = f"{timeout:g}" if isinstance(timeout, (int, float)) else repr(timeout)
            raise SpecError(
                "etcd_outage_timeout",
                f"{shown} is not a positive number of seconds; give e.g. 120",
            )
        if self.sidecar and (self.cacert or self.cert or self.user):
            raise SpecError(
                "etcd_sidecar",
                "the sidecar serves plain HTTP to the job's nodes only; TLS and user "
                "settings are for an etcd of your own (--etcd-endpoint)",
            )
        for endpoint in self.endpoints:
            match = re.fullmatch(_ENDPOINT, endpoint)
            if not match or not 0 < int(match.group(2)) < 65536:
                raise SpecError(
                    "etcd_endpoint",
                    f"{endpoint!r} is not host:port with a port from 1 to 65535, e.g. etcd1:2379",
                )

    def rdzv_configs(self) -> dict[str, str]:
        """What the hpclaunch-etcd handler reads from torch's rendezvous configs."""
        given = {
            "cacert": self.cacert,
            "cert": self.cert,
            "key": self.key,
            "user": self.user,
            "password_file": self.password_file,
            "outage_timeout": None if self.outage_timeout is None else f"{self.outage_timeout:g}",
        }
        return {k: v for k, v in given.items() if v is not None}

    def argv(self) -> list[str]:
        out = ["--etcd-endpoint", ",".join(self.endpoints)] if self.endpoints else []
        if self.sidecar:
            out.append("--etcd-sidecar")
        flags = {
            "--etcd-binary": self.binary,
            **{f"--etcd-{k.replace('_', '-')}": v for k, v in self.rdzv_configs().items()},
        }
        for flag, value in flags.items():
            if value is not None:
                out += [flag, value]
        return out


# The backends by the name --rdzv takes; the first line of a new backend goes here.
BACKENDS: Mapping[str, type[Rendezvous]] = {
    StaticRdzv.name: StaticRdzv,
    C10dRdzv.name: C10dRdzv,
    EtcdRdzv.name: EtcdRdzv,
}
DEFAULT = C10dRdzv
# Every backend's flat settings, by profile key.
SETTING_KEYS = tuple(key for backend in BACKENDS.values() for key in backend.keys)


def choices() -> str:
    """The backend names for messages: ``'static', 'c10d', 'etcd'``."""
    return ", ".join(repr(name) for name in BACKENDS)


def build(name: str, given: Mapping[str, Any], *, others: bool = False) -> Rendezvous:
    """The settings of backend ``name`` from flat ``given`` settings, keyed by profile
    key; a value of None, False or () counts as not given.

    Settings of another backend are an error, unless ``others`` (the agent ignores
    them, as it always has). Raises SpecError for an unknown name, another backend's
    settings, or a rule of the backend's own.
    """
    backend = BACKENDS.get(name)
    if backend is None:
        raise SpecError("rdzv", f"{name!r} is not one of {choices()}; pick one of these")
    values = {k: v for k, v in given.items() if v is not None and v is not False and v != ()}
    foreign = [k for k in values if k not in backend.keys]
    if foreign and not others:
        owner = next(b for b in BACKENDS.values() if foreign[0] in b.keys)
        raise SpecError(
            "rdzv",
            f"{owner.name} settings are given but --rdzv is {name}; add --rdzv {owner.name}",
            also=tuple(k for k in owner.keys if k in values),
        )
    settings = {backend.keys[k]: v for k, v in values.items() if k in backend.keys}
    return backend(**settings)


def elastic_names() -> str:
    """The backends that let the node count change, for messages: ``c10d or etcd``."""
    return " or ".join(name for name, b in BACKENDS.items() if not b.fixed_ranks)
