"""A small etcd v3 client for the rendezvous, over etcd's JSON gateway.

Built on ``etcd3gw`` (the ``etcd`` extra): maintained, pure Python, no protobuf
or gRPC, so it cannot clash with the protobuf a training script imports (the
``etcd3`` package needs protobuf<4 or a global switch set before import). The
gateway speaks the v3 API, so this works with v2 disabled (etcd ≥ 3.4) and
on etcd 3.6, which has no v2 at all.

What etcd3gw does not do, this module adds: token authentication that renews
itself, compare-and-swap on a key's revision, watches that start after a
revision (no missed change), and errors that name the endpoint and the fix.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

# session first: it names the missing extra when etcd3gw is not installed.
from hpclaunch.rendezvous.etcd import session  # isort: skip
import requests
from etcd3gw import exceptions as gw_errors

from hpclaunch.errors import EtcdError
from hpclaunch.rendezvous.etcd.access import Access
from hpclaunch.rendezvous.etcd.outage import EtcdUnavailable, Outage, unavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

# Connecting reads this key: every rendezvous key is under /hpclaunch/.
PROBE_KEY = "/hpclaunch/probe"
_HINTS = {
    "user name is empty": "; etcd has authentication on: give --etcd-user and a password",
    "permission denied": "; give the user read-write on the key prefix /hpclaunch/ "
    "(etcdctl role grant-permission ROLE --prefix=true readwrite /hpclaunch/)",
    "invalid auth token": "; log in again: check --etcd-user and the password",
}


class LeaseNotFound(EtcdError):
    """etcd does not know the lease a write named: it expired, or etcd lost its data
    (wiped, or a new etcd on the same address). A new lease makes the write good."""


class KeyValue(NamedTuple):
    value: bytes
    mod_revision: int


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


def _kv(kvs: list[dict[str, Any]] | None) -> KeyValue | None:
    if not kvs:
        return None
    first = kvs[0]
    return KeyValue(base64.b64decode(first.get("value", "")), int(first["mod_revision"]))


class Etcd:
    """A connection to the first of ``access.endpoints`` that answers.

    Every method raises EtcdError naming the endpoint. Keys and values are bytes
    or str; values come back as bytes. Once connected, a request waits out an
    outage of etcd (``outage``: up to ``access.outage_timeout_s``).
    """

    def __init__(self, access: Access, endpoint: str, client: Any) -> None:
        self.access = access
        self.endpoint = endpoint
        self._client = client
        self.outage: Outage | None = None  # None: a failed request raises at once

    @classmethod
    def connect(cls, access: Access) -> Etcd:
        """Try each endpoint in turn; raise EtcdError listing why each failed."""
        problems = []
        for endpoint in access.endpoints:
            etcd = cls(access, endpoint, session.client_for(access, endpoint))
            try:  # a read under the rendezvous prefix: checks user and permissions too
                etcd.get(PROBE_KEY)
            except EtcdError as exc:
                problems.append(str(exc))
                continue
            etcd.outage = Outage(endpoint, access.outage_timeout_s)
            return etcd
        raise EtcdError("; ".join(problems))

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        outage = self.outage
        if outage is None:
            return self._post_once(path, body)
        return outage.call(lambda: self._post_once(path, body))

    def _post_once(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One request. EtcdUnavailable where etcd may answer a retry, else EtcdError."""
        try:
            result = self._client.post(self._client.get_url(path), json=body)
        except EtcdError:
            raise
        except gw_errors.ConnectionFailedError as exc:
            raise self._failed_connection(exc.detail_text or str(exc)) from None
        except (gw_errors.ConnectionTimeoutError, gw_errors.InternalServerError) as exc:
            if isinstance(exc, gw_errors.InternalServerError):  # etcd's 500: e.g. no leader
                detail = session.message(exc.detail_text or str(exc))
                raise EtcdUnavailable(f"etcd at {self.endpoint} failed {path}: {detail}") from None
            raise EtcdUnavailable(
                f"etcd at {self.endpoint} did not answer within {self.access.timeout_s:g} s; "
                "check that etcd runs there and that this node can reach it (--etcd-endpoint)"
            ) from None
        except gw_errors.Etcd3Exception as exc:
            detail = session.message(exc.detail_text or str(exc))
            if unavailable(detail):
                raise EtcdUnavailable(f"etcd at {self.endpoint}: {detail}") from None
            if "requested lease not found" in detail:
                raise LeaseNotFound(f"etcd at {self.endpoint} refused {path}: {detail}") from None
            hint = next((h for k, h in _HINTS.items() if k in detail), "")
            raise EtcdError(f"etcd at {self.endpoint} refused {path}: {detail}{hint}") from None
        if not isinstance(result, dict):
            raise EtcdError(f"etcd at {self.endpoint} answered {path} with {result!r}")
        return result

    def _failed_connection(self, detail: str) -> EtcdError:
        """A refused, reset or closed connection (or etcd's 503) is an outage; a TLS
        failure is a setting to fix."""
        text = self._unreachable(detail)
        tls = "CERTIFICATE_VERIFY_FAILED" in detail or "SSL" in detail
        return EtcdError(text) if tls else EtcdUnavailable(text)

    def _unreachable(self, detail: str) -> str:
        if "CERTIFICATE_VERIFY_FAILED" in detail or "SSL" in detail:
            return (
                f"etcd at {self.endpoint}: TLS failed ({session.ssl_reason(detail)}); check "
                "--etcd-cacert (the CA that signed the server's certificate), --etcd-cert "
                "and --etcd-key"
            )
        reason = "connection refused" if "refused" in detail else "unreachable"
        if "Connection aborted" in detail or "RemoteDisconnected" in detail:
            reason = "connection closed by the server (does it want TLS? give --etcd-cacert)"
        return (
            f"etcd at {self.endpoint}: {reason}; check that etcd runs there and that "
            "this node can reach it (--etcd-endpoint)"
        )

    # -- keys ---------------------------------------------------------------

    def get(self, key: str | bytes) -> tuple[KeyValue | None, int]:
        """The key's value and revision (None if absent), and the store's revision."""
        out = self._post("/kv/range", {"key": _b64(key)})
        return _kv(out.get("kvs")), int(out["header"]["revision"])

    def get_many(self, keys: list[str]) -> list[KeyValue | None]:
        """Several keys read at one revision (one transaction)."""
        out = self._post(
            "/kv/txn", {"success": [{"request_range": {"key": _b64(k)}} for k in keys]}
        )
        return [_kv(r["response_range"].get("kvs")) for r in out.get("responses", [])]

    def put(self, key: str | bytes, value: str | bytes, lease: int = 0) -> int:
        """Set the key; return its new mod revision."""
        out = self._post("/kv/put", {"key": _b64(key), "value": _b64(value), "lease": lease})
        return int(out["header"]["revision"])

    def put_many(self, items: list[tuple[str, bytes]], lease: int = 0) -> None:
        puts = [
            {"request_put": {"key": _b64(k), "value": _b64(v), "lease": lease}} for k, v in items
        ]
        self._post("/kv/txn", {"success": puts})

    def swap(
        self, key: str | bytes, value: bytes, expected: int | None, lease: int = 0
    ) -> tuple[bool, KeyValue | None]:
        """Set the key only if its mod revision is ``expected`` (None: only if it does
        not exist). Returns (set, the key as it is now)."""
        compare: dict[str, Any] = {"key": _b64(key), "result": "EQUAL"}
        if expected is None:
            compare.update(target="CREATE", create_revision=0)
        else:
            compare.update(target="MOD", mod_revision=expected)
        out = self._post(
            "/kv/txn",
            {
                "compare": [compare],
                "success": [
                    {"request_put": {"key": _b64(key), "value": _b64(value), "lease": lease}}
                ],
                "failure": [{"request_range": {"key": _b64(key)}}],
            },
        )
        if out.get("succeeded"):
            return True, KeyValue(value, int(out["header"]["revision"]))
        return False, _kv(out["responses"][0]["response_range"].get("kvs"))

    def delete(self, key: str | bytes) -> int:
        """Delete the key; return how many keys went (0 or 1)."""
        return int(self._post("/kv/deleterange", {"key": _b64(key)}).get("deleted", 0))

    def delete_prefix(self, prefix: str) -> None:
        self._post("/kv/deleterange", {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix))})

    def wait_change(self, key: str | bytes, after_revision: int, timeout_s: float) -> bool:
        """Block until ``key`` changes after ``after_revision`` or ``timeout_s`` passes;
        True if it changed. Starting the watch at that revision misses no change.
        While etcd is unreachable (an outage being waited out), True after a pause of
        at most a second: the caller reads the key again, which waits the outage out."""
        if timeout_s <= 0:
            return False
        start = time.monotonic()
        try:
            self._client.watch_once(key, timeout=timeout_s, start_revision=after_revision + 1)
        except gw_errors.WatchTimedOut:
            return False
        except (gw_errors.Etcd3Exception, requests.RequestException) as exc:
            error = self._failed_connection(str(exc))
            if self.outage is None or not isinstance(error, EtcdUnavailable):
                raise error from None
            time.sleep(max(0.0, min(timeout_s, 1.0) - (time.monotonic() - start)))
        return True

    # -- leases -------------------------------------------------------------

    def grant(self, ttl_s: int) -> int:
        out = self._post("/lease/grant", {"TTL": ttl_s})
        return int(out["ID"])

    def keep_alive(self, lease: int) -> bool:
        """Renew the lease; False if it has expired already."""
        out = self._post("/lease/keepalive", {"ID": lease})
        return int(out.get("result", {}).get("TTL", 0)) > 0

    def revoke(self, lease: int) -> None:
        self._post("/lease/revoke", {"ID": lease})


class KeyWatch:
    """The latest values of one key, or of every key under a prefix, kept current by
    one watch stream in a daemon thread (re-opened after errors, from where it was).

    A rendezvous key changes with every node's heartbeat, and every node waits on
    it: reading it over HTTP at each change costs N requests per write, N² per
    heartbeat round. A stream per node costs etcd one message per write and node,
    and the node no request at all."""

    RETRY_S = 0.5

    def __init__(self, etcd: Etcd, key: str, *, prefix: bool = False) -> None:
        self._etcd = etcd
        self._key = key
        self._range_end = _prefix_end(key) if prefix else None
        self._cond = threading.Condition()
        self._kvs: dict[str, KeyValue] = {}
        self._changed: dict[str, int] = {}  # key -> revision of its last change seen
        self._current = 0  # the store revision up to which the values are known current
        self._healthy = False
        self._stopped = False
        self._response: Any = None
        threading.Thread(target=self._run, name="etcd-watch", daemon=True).start()

    def current(self, key: str) -> tuple[KeyValue | None, int, int] | None:
        """(value, the revision it is current at, the revision of its last change
        seen or 0), or None while the stream is down."""
        with self._cond:
            if not self._healthy:
                return None
            return self._kvs.get(key), self._current, self._changed.get(key, 0)

    def wait_changed(self, key: str, after: int, timeout_s: float) -> bool | None:
        """Wait until ``key`` changes after revision ``after``: True if it did, False
        on timeout, None if the stream is down (the caller then reads by itself)."""
        with self._cond:
            self._cond.wait_for(
                lambda: not self._healthy or self._changed.get(key, 0) > after,
                timeout=max(timeout_s, 0),
            )
            if not self._healthy:
                return None
            return self._changed.get(key, 0) > after

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._healthy = False
            self._cond.notify_all()
        response = self._response
        if response is not None:
            response.close()

    def _run(self) -> None:
        while not self._stopped:
            try:
                self._stream(self._load() + 1)
            except (EtcdError, requests.RequestException, ValueError, KeyError) as exc:
                log.debug("watch of %s broke: %s", self._key, exc)
            with self._cond:
                self._healthy = False
                self._cond.notify_all()
            if not self._stopped:
                time.sleep(self.RETRY_S)

    def _load(self) -> int:
        """Read the values afresh; return the revision they are current at."""
        body = {"key": _b64(self._key)}
        if self._range_end is not None:
            body["range_end"] = _b64(self._range_end)
        out = self._etcd._post_once("/kv/range", body)  # _run retries, stream and all
        revision = int(out["header"]["revision"])
        with self._cond:
            if revision < self._current:
                # etcd's history went back: it lost its data and counts revisions
                # from 1 again, so the old revisions say nothing of the new keys.
                self._changed = {}
                self._current = revision
            self._kvs = {
                base64.b64decode(kv["key"]).decode(): KeyValue(
                    base64.b64decode(kv.get("value", "")), int(kv["mod_revision"])
                )
                for kv in out.get("kvs", [])
            }
            for key, kv in self._kvs.items():
                self._changed[key] = max(self._changed.get(key, 0), kv.mod_revision)
            self._current = max(self._current, revision)
            self._healthy = True
            self._cond.notify_all()
        return revision

    def _stream(self, start: int) -> None:
        client = self._etcd._client
        create: dict[str, Any] = {
            "key": _b64(self._key),
            "start_revision": start,
            "progress_notify": True,
        }
        if self._range_end is not None:
            create["range_end"] = _b64(self._range_end)
        response = client.session.post(
            client.get_url("/watch"),
            json={"create_request": create},
            stream=True,
            timeout=(self._etcd.access.timeout_s, None),
        )
        self._response = response
        with response:
            if response.status_code != 200:
                raise EtcdError(f"watch refused: {session.message(response.text)}")
            for line in response.iter_lines(chunk_size=None):  # each event as it comes
                if self._stopped:
                    return
                if line:
                    self._apply(json.loads(line).get("result", {}))

    def _apply(self, result: dict[str, Any]) -> None:
        events = result.get("events", [])
        with self._cond:
            for event in events:
                kv = event["kv"]
                key = base64.b64decode(kv["key"]).decode()
                revision = int(kv["mod_revision"])
                if event.get("type") == "DELETE":
                    self._kvs.pop(key, None)
                else:
                    self._kvs[key] = KeyValue(base64.b64decode(kv.get("value", "")), revision)
                self._changed[key] = revision
                self._current = max(self._current, revision)
            if not events and not result.get("created") and "header" in result:
                # A progress notification: every event up to its revision was sent. (Not
                # the creation message: the events since the read come after it.)
                self._current = max(self._current, int(result["header"]["revision"]))
            self._cond.notify_all()


def _prefix_end(prefix: str) -> str:
    """The end of etcd's key range that holds every key starting with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class LeaseKeeper:
    """Keeps one lease alive from a daemon thread, every third of its TTL.

    Keys written with the lease vanish TTL seconds after the process that
    held it stops (crash included): etcd is left clean without a janitor."""

    def __init__(self, etcd: Etcd, ttl_s: int) -> None:
        self.lease = etcd.grant(ttl_s)
        self._etcd = etcd
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="etcd-lease", daemon=True)
        self._thread.start()

    def replace(self, lost: int) -> int:
        """A new lease for ``lost``, which etcd no longer knows (expired, or etcd lost
        its data); the current one if another thread replaced it already."""
        with self._lock:
            if self.lease == lost:
                self.lease = self._etcd.grant(self._ttl_s)
                log.warning("etcd no longer knows this node's lease; took a new one")
            return self.lease

    def write(self, request: Callable[[int], T]) -> T:
        """``request(lease)``, once more with a new lease if etcd lost the one it named."""
        lease = self.lease
        try:
            return request(lease)
        except LeaseNotFound:
            return request(self.replace(lease))

    def _run(self) -> None:
        while not self._stopped.wait(self._ttl_s / 3):
            lease = self.lease
            try:
                try:
                    alive = self._etcd.keep_alive(lease)
                except LeaseNotFound:
                    alive = False
                if not alive:
                    self.replace(lease)
            except EtcdError as exc:
                log.warning("could not renew the etcd lease: %s", exc)

    def stop(self) -> None:
        self._stopped.set()
