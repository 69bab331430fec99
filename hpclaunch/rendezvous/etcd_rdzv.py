"""``hpclaunch-etcd``: torch's dynamic rendezvous with its state in etcd, over the v3 API.

torch ships only etcd backends that speak etcd's v2 API, which etcd 3.6 removed.
This is a ``RendezvousBackend`` (the state, with a compare-and-swap on the
key's revision) plus a c10d ``Store`` (what the agents exchange), both on
etcd v3, under one handler:

* node ranks follow SLURM's order, as with ``hpclaunch-c10d``;
* while a node waits for the others it watches the state key instead of
  polling it once a second, so a rendezvous completes as soon as the last node
  joins;
* a node whose heartbeats stop (a dead node when the allocation is kept, with
  ``--no-kill``) makes the others restart their workers and rendezvous again
  without it, down to the job's minimum node count;
* every key lives under ``/hpclaunch/rdzv/RUN_ID/`` and on a lease of the agent
  that wrote it, so etcd is clean a lease TTL after the job's agents are gone.

torchrun can use it too (``--rdzv-backend hpclaunch-etcd``) through the
``torchrun.handlers`` entry point. Written against torch 2.13.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousHandler,
    RendezvousParameters,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic

from hpclaunch.errors import EtcdError
from hpclaunch.rendezvous.delays import Pacing
from hpclaunch.rendezvous.etcd.access import Access, read_password
from hpclaunch.rendezvous.etcd.outage import (
    DEFAULT_OUTAGE_TIMEOUT_S,
    forgive_heartbeats,
    history_restarted,
    rebuilt_line,
)
from hpclaunch.rendezvous.ranked_c10d import RankedHandler, RankedNodeDesc, node_multiple

if TYPE_CHECKING:  # the client needs the etcd extra: imported where it is used
    from hpclaunch.rendezvous.etcd.client import LeaseKeeper

log = logging.getLogger(__name__)

NAME = "hpclaunch-etcd"
KEY_ROOT = "/hpclaunch/rdzv/"
LEASE_TTL_S = 30
# How long the store's blocking get/wait is allowed when torch sets no timeout.
DEFAULT_STORE_TIMEOUT = timedelta(seconds=300)
# For this long after etcd came back, heartbeats the outage kept from etcd are forgiven.
FORGIVE_S = 60.0


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class EtcdBackend(dynamic.RendezvousBackend):
    """The rendezvous state in one etcd key; the fencing token is its mod revision.

    Reads come from a watch stream of the key where it is current (no request),
    else from etcd; a write goes to etcd as a compare-and-swap.

    A state that vanishes once this node held one (etcd wiped, or a new etcd on its
    address) is written back as this node last held it, by the first node to see it
    gone: torch would otherwise start from an empty state, see every node gone
    from the round, and stop the healthy workers of every node."""

    def __init__(self, etcd: Any, key: str, keeper: LeaseKeeper, watch: Any = None) -> None:
        self._etcd = etcd
        self._key = key
        self._keeper = keeper  # the lease every write is made on
        self._watch = watch
        self._known = 0  # the newest store revision this node has read or written
        self._held = 0  # the mod revision of the state last handed to torch (0: none)
        self._last: bytes | None = None  # the state last handed to torch

    @property
    def name(self) -> str:
        return NAME

    def get_state(self) -> tuple[bytes, Any] | None:
        watched = self._watch.current(self._key) if self._watch is not None else None
        if watched is not None and watched[1] >= self._known:
            kv, revision, _ = watched
        else:
            kv, revision = self._call(lambda: self._etcd.get(self._key))
            # etcd counts revisions from 1 again after it lost its data.
            self._known = revision if history_restarted(revision, self._known) else self._known
        self._known = max(self._known, revision)
        if kv is None and self._last is not None:
            kv = self._rebuild(self._last)[1]
        elif kv is not None:
            self._note_rebuilt_elsewhere(kv)
        self._held = kv.mod_revision if kv is not None else 0
        if kv is None:
            return None
        self._last = kv.value
        return self._forgiven(kv.value), kv.mod_revision

    def set_state(self, state: bytes, token: Any | None = None) -> tuple[bytes, Any, bool] | None:
        expected = token if isinstance(token, int) else None
        done, kv = self._write(state, expected)
        if kv is None and expected is not None:
            # The key is gone (etcd lost its data): torch would take that for an
            # empty rendezvous. This node's state, the newest it knows, goes back.
            done, kv = self._rebuild(state)
        elif kv is not None and not done:
            self._note_rebuilt_elsewhere(kv)
        if kv is None:  # the key went away between the compare and the read
            return None
        self._known = max(self._known, kv.mod_revision)
        self._held = kv.mod_revision
        self._last = kv.value
        return self._forgiven(kv.value), kv.mod_revision, done

    def _write(self, state: bytes, expected: int | None) -> tuple[bool, Any]:
        result: tuple[bool, Any] = self._call(
            lambda: self._keeper.write(
                lambda lease: self._etcd.swap(self._key, state, expected, lease)
            )
        )
        return result

    def _note_rebuilt_elsewhere(self, kv: Any) -> None:
        """A state older in revisions than the one this node held: etcd lost its data
        and counts from 1 again, and another node wrote its state back before this
        one saw the key gone. Said once, as the node that wrote it back says it."""
        if history_restarted(kv.mod_revision, self._held):
            log.warning(rebuilt_line(kv.value, wrote=False))

    def _rebuild(self, state: bytes) -> tuple[bool, Any]:
        """Write ``state`` back where the key vanished, unless another node did first;
        (whether this node wrote it, the key as it is now). Logged once per loss."""
        done, kv = self._write(state, None)
        if kv is not None:
            log.warning(rebuilt_line(kv.value, wrote=done))
        return done, kv

    def _forgiven(self, state: bytes) -> bytes:
        """The state, its heartbeats forgiven for an outage etcd came back from lately."""
        outage = getattr(self._etcd, "outage", None)
        recovered_at = outage.recovered_at if outage is not None else None
        if recovered_at is None or time.time() - recovered_at > FORGIVE_S:
            return state
        return forgive_heartbeats(state, recovered_at)

    def wait_for_change(self, timeout_s: float) -> None:
        """Return when the state changes after the one last handed to torch, or after
        ``timeout_s``: what torch's one-second poll is for, without the wait."""
        watch = self._watch
        if watch is not None and watch.wait_changed(self._key, self._held, timeout_s) is not None:
            return
        self._call(lambda: self._etcd.wait_change(self._key, self._known, timeout_s))

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except EtcdError as exc:
            raise RendezvousConnectionError(str(exc)) from None


class EtcdStore(dist.Store):  # type: ignore[misc,name-defined]
    """A c10d Store on etcd v3 for the agents (the workers get a TCPStore, as with c10d)."""

    def __init__(self, etcd: Any, prefix: str, keeper: LeaseKeeper, watch: Any = None) -> None:
        super().__init__()
        self._etcd = etcd
        self._prefix = prefix
        self._keeper = keeper  # the lease every write is made on
        self._watch = watch  # a KeyWatch of the whole prefix, for the blocking reads
        self.set_timeout(DEFAULT_STORE_TIMEOUT)

    def _key(self, key: str) -> str:
        return self._prefix + key

    def set(self, key: str, value: str | bytes) -> None:
        self._keeper.write(lambda lease: self._etcd.put(self._key(key), _bytes(value), lease))

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        items = [(self._key(k), _bytes(v)) for k, v in zip(keys, values, strict=True)]
        self._keeper.write(lambda lease: self._etcd.put_many(items, lease))

    def get(self, key: str) -> bytes:
        return self._wait_values([key], None)[0]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._wait_values(keys, None)

    def wait(self, keys: list[str], override_timeout: timedelta | None = None) -> None:
        self._wait_values(keys, override_timeout)

    def check(self, keys: list[str]) -> bool:
        return all(kv is not None for kv in self._etcd.get_many([self._key(k) for k in keys]))

    def add(self, key: str, num: int) -> int:
        name = self._key(key)
        while True:
            kv, _ = self._etcd.get(name)
            value = (int(kv.value) if kv is not None else 0) + num
            done, _ = self._swap(name, str(value).encode(), None if kv is None else kv.mod_revision)
            if done:
                return value

    def compare_set(
        self, key: str, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        name = self._key(key)
        kv, _ = self._etcd.get(name)
        expected = _bytes(expected_value)
        if (kv is None and expected == b"") or (kv is not None and kv.value == expected):
            revision = None if kv is None else kv.mod_revision
            done, now = self._swap(name, _bytes(desired_value), revision)
            if done or now is None:
                return _bytes(desired_value) if done else expected
            return bytes(now.value)
        return expected if kv is None else kv.value

    def _swap(self, name: str, value: bytes, expected: int | None) -> tuple[bool, Any]:
        result: tuple[bool, Any] = self._keeper.write(
            lambda lease: self._etcd.swap(name, value, expected, lease)
        )
        return result

    def delete_key(self, key: str) -> bool:
        return bool(self._etcd.delete(self._key(key)))

    def num_keys(self) -> int:
        raise NotImplementedError("EtcdStore does not count keys")

    def _wait_values(self, keys: list[str], timeout: timedelta | None) -> list[bytes]:
        limit = (timeout or self.timeout or DEFAULT_STORE_TIMEOUT).total_seconds()
        deadline = time.monotonic() + limit
        return [self._wait_value(self._key(k), deadline, limit) for k in keys]

    def _wait_value(self, name: str, deadline: float, limit: float) -> bytes:
        """The key's value once it is set: from the prefix's watch stream while it is
        up, else read and watched over HTTP. LookupError after ``deadline``."""
        while True:
            left = deadline - time.monotonic()
            watch = self._watch
            watched = watch.current(name) if watch is not None else None
            if watched is not None:
                if watched[0] is not None:
                    return bytes(watched[0].value)
                if left <= 0:
                    break
                if watch.wait_changed(name, watched[2], left) is not None:
                    continue  # changed, or timed out: look again
            kv, revision = self._etcd.get(name)
            if kv is not None:
                return bytes(kv.value)
            if left <= 0:
                break
            self._etcd.wait_change(name, revision, left)
        raise LookupError(f"etcd store: {name!r} was not set within {limit:g} s")


class EtcdHandler(RankedHandler):
    """The ranked handler of hpclaunch-c10d, plus: a peer whose heartbeats stopped
    counts as a membership change, which torch's agent answers by restarting its
    workers and joining the next round (without the dead node)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._round: int | None = None
        self._world = 0
        self._lost_peer = False

    def take_lost_peer(self) -> bool:
        """Whether the last restart was for a lost node (asked once per restart)."""
        lost, self._lost_peer = self._lost_peer, False
        return lost

    def next_rendezvous(self) -> Any:
        info = super().next_rendezvous()
        self._round = self._state_holder.state.round
        self._world = info.world_size
        return info

    def num_nodes_waiting(self) -> int:
        waiting: int = super().num_nodes_waiting()
        state = self._state_holder.state
        if self._round is None or waiting:
            return waiting
        lost = state.round != self._round or len(state.participants) < self._world
        if lost:
            # A node leaves a round by restarting its workers, or by dying: then its
            # heartbeats stop, and the first sync after they expire drops it.
            log.warning(
                "round %d is down to %d of %d nodes; starting a new round without the missing ones",
                self._round,
                len(state.participants),
                self._world,
            )
            self._round = None  # report it once
            self._lost_peer = True
            return 1
        return 0


def access_from(params: RendezvousParameters) -> Access:
    """Endpoints from ``rdzv_endpoint``; TLS files, user and password file from the
    rendezvous configs (``cacert``, ``cert``, ``key``, ``user``, ``password_file``);
    the password may also come from $HPCLAUNCH_ETCD_PASSWORD."""
    endpoints = tuple(e.strip() for e in params.endpoint.split(",") if e.strip())
    return Access(
        endpoints=endpoints,
        cacert=_path(params.get("cacert")),
        cert=_path(params.get("cert")),
        key=_path(params.get("key")),
        user=params.get("user"),
        password=read_password(os.environ, params.get("password_file")),
        timeout_s=float(params.get("etcd_timeout", 5.0)),
        outage_timeout_s=float(params.get("outage_timeout", DEFAULT_OUTAGE_TIMEOUT_S)),
    )


def _path(value: str | None) -> str | None:
    """A file named in the configs, ``~`` expanded (the script quotes it)."""
    return None if value is None else os.path.expanduser(value)


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's dynamic handler on etcd v3, ranked by config ``node_rank`` (default:
    host name order, as torch does)."""
    from hpclaunch.rendezvous.etcd.client import Etcd, KeyWatch, LeaseKeeper

    access = access_from(params)
    try:
        etcd = Etcd.connect(access)
    except EtcdError as exc:
        raise RendezvousConnectionError(str(exc)) from None
    keeper = LeaseKeeper(etcd, LEASE_TTL_S)
    root = f"{KEY_ROOT}{params.run_id}/"
    backend = EtcdBackend(etcd, root + "state", keeper, KeyWatch(etcd, root + "state"))
    store_prefix = root + "store/"
    store = EtcdStore(etcd, store_prefix, keeper, KeyWatch(etcd, store_prefix, prefix=True))
    stock = dynamic.create_handler(store, backend, params)
    node = stock._this_node
    node_rank = params.get_as_int("node_rank")
    if node_rank is not None:  # hpclaunch agent: ranks in SLURM's order
        node = RankedNodeDesc(node.addr, node.pid, node.local_id, node_rank)
    # The first-join jitter is scaled as for hpclaunch-c10d; the one-second poll
    # becomes a watch of the state key.
    pacing = Pacing.for_job(params.max_nodes, backend.wait_for_change)
    return EtcdHandler(
        node, stock._settings, NAME, store, stock._state_holder, pacing, node_multiple(params)
    )


def register() -> None:
    """Make ``hpclaunch-etcd`` known to torch's registry (idempotent)."""
    rendezvous_handler_registry.register(NAME, create_handler)
