"""How to reach etcd: endpoints, TLS files, user and password (pure, no client import).

The etcd settings as users give them are ``hpclaunch.contract.rendezvous.EtcdRdzv``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpclaunch.errors import EtcdError
from hpclaunch.rendezvous.etcd.outage import DEFAULT_OUTAGE_TIMEOUT_S

PASSWORD_VAR = "HPCLAUNCH_ETCD_PASSWORD"
DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Access:
    """Where etcd is and the credentials for it. The password never shows in a repr."""

    endpoints: tuple[str, ...]
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout_s: float = DEFAULT_TIMEOUT_S
    # How long a running job waits for an unreachable etcd (--etcd-outage-timeout).
    outage_timeout_s: float = DEFAULT_OUTAGE_TIMEOUT_S

    @property
    def tls(self) -> bool:
        return self.cacert is not None or self.cert is not None

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise EtcdError("no etcd endpoint given; pass --etcd-endpoint HOST:PORT")
        if (self.cert is None) != (self.key is None):
            given = "--etcd-cert" if self.cert is not None else "--etcd-key"
            raise EtcdError(
                f"{given} is given alone; a client certificate needs both --etcd-cert and "
                "--etcd-key"
            )
        if not self.outage_timeout_s > 0:
            raise EtcdError(
                f"--etcd-outage-timeout {self.outage_timeout_s:g} is not a positive number "
                "of seconds; give e.g. --etcd-outage-timeout 120"
            )
        if self.user is not None and self.password is None:
            raise EtcdError(
                f"--etcd-user {self.user!r} has no password; give --etcd-password-file PATH "
                f"or set ${PASSWORD_VAR}"
            )
        for option, path in (
            ("--etcd-cacert", self.cacert),
            ("--etcd-cert", self.cert),
            ("--etcd-key", self.key),
        ):
            if path is not None and not Path(path).expanduser().is_file():
                raise EtcdError(f"{option} {path!r} is not a readable file on this node")


def read_password(env: Mapping[str, str], password_file: str | None) -> str | None:
    """The etcd password: from ``password_file`` (first line) if given, else from
    $HPCLAUNCH_ETCD_PASSWORD, else None. Never from the command line, so that it
    is neither in the rendered script nor in ``ps``."""
    if password_file is not None:
        try:
            text = Path(password_file).expanduser().read_text()
        except OSError as exc:
            raise EtcdError(
                f"--etcd-password-file {password_file!r} cannot be read ({exc.strerror}); "
                "give a file this node can read, or set $" + PASSWORD_VAR
            ) from None
        lines = text.splitlines()
        if not lines or not lines[0]:
            raise EtcdError(
                f"--etcd-password-file {password_file!r} is empty; write the password on "
                "its first line"
            )
        return lines[0]
    return env.get(PASSWORD_VAR) or None
