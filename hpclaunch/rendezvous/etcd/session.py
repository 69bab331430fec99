"""The HTTP side of the etcd client: a session per endpoint (TLS, client certificate,
a user's token that renews itself) and etcd's error messages read out of its answers."""

from __future__ import annotations

import json
import threading
from typing import Any

from hpclaunch.errors import EtcdError
from hpclaunch.rendezvous.etcd.access import PASSWORD_VAR, Access

try:
    import etcd3gw
    import requests
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise EtcdError(
        f"etcd support needs the etcd extra ({exc.name} is not installed); "
        "run: pip install 'hpclaunch[etcd]'"
    ) from None


class AuthSession(requests.Session):
    """A session that logs in with user and password and logs in again when etcd
    says the token expired (etcd's simple tokens last 5 minutes by default)."""

    def __init__(
        self, endpoint: str, base_url: str, user: str, password: str, timeout_s: float
    ) -> None:
        super().__init__()
        self._endpoint = endpoint
        self._login = (base_url + "/v3/auth/authenticate", {"name": user, "password": password})
        self._timeout_s = timeout_s
        self._token: str | None = None
        self._lock = threading.Lock()

    def _authenticate(self) -> str:
        url, body = self._login
        resp = super().request("POST", url, json=body, timeout=self._timeout_s)
        if resp.status_code != 200:
            raise EtcdError(
                f"etcd at {self._endpoint} refused user {body['name']!r}: "
                f"{message(resp.text)}; check --etcd-user and the password "
                f"(--etcd-password-file or ${PASSWORD_VAR})"
            )
        token = resp.json().get("token")
        if not isinstance(token, str):
            raise EtcdError(
                f"etcd at {self._endpoint} answered the login without a token: {resp.text!r}"
            )
        return token

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> Any:
        for attempt in (1, 2):
            with self._lock:
                if self._token is None:
                    self._token = self._authenticate()
                token = self._token
            headers = dict(kwargs.pop("headers", None) or {})
            headers["Authorization"] = token
            kwargs["headers"] = headers
            resp = super().request(method, url, *args, **kwargs)  # type: ignore[arg-type]
            if resp.status_code != 401 or attempt == 2:
                return resp
            with self._lock:
                if self._token == token:
                    self._token = None  # expired: log in again, once
        raise AssertionError("unreachable")


def message(text: str) -> str:
    """etcd's error message out of a gateway error body."""
    try:
        body = json.loads(text)
        return str(body.get("message") or body.get("error") or text)
    except ValueError:
        return text.strip()[:200]


def ssl_reason(detail: str) -> str:
    markers = ("CERTIFICATE_VERIFY_FAILED", "certificate required", "unknown ca", "bad certificate")
    for marker in markers:
        if marker in detail:
            return marker.lower().replace("_", " ")
    return "handshake failed"


def client_for(access: Access, endpoint: str) -> Any:
    host, _, port = endpoint.rpartition(":")
    protocol = "https" if access.tls else "http"
    base = f"{protocol}://{'[' + host + ']' if ':' in host else host}:{port}"
    session: requests.Session = (
        AuthSession(endpoint, base, access.user, access.password, access.timeout_s)
        if access.user is not None and access.password is not None
        else requests.Session()
    )
    # Not the environment's CA bundle (REQUESTS_CA_BUNDLE would override --etcd-cacert)
    # nor its proxies (etcd is on the cluster network).
    session.trust_env = False
    if access.cacert is not None:
        session.verify = access.cacert
    if access.cert is not None and access.key is not None:
        session.cert = (access.cert, access.key)
    return etcd3gw.Etcd3Client(
        host=host,
        port=int(port),
        protocol=protocol,
        timeout=access.timeout_s,
        api_path="/v3/",
        session=session,
    )
