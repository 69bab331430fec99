"""An etcd that lost its data (wiped, or a new etcd at its address): a write on a lease
it no longer knows gets a new lease, its revisions counting from 1 again are seen as
such, and the line an agent logs when the rendezvous state is written back. A scripted
HTTP client; the real etcd is in tests/integration/test_etcd_wipe.py."""

from __future__ import annotations

import logging
import pickle
from datetime import datetime, timezone
from typing import Any

import pytest
from etcd3gw import exceptions as gw_errors
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from hpclaunch.rendezvous.etcd.access import Access
from hpclaunch.rendezvous.etcd.client import Etcd, LeaseKeeper, LeaseNotFound
from hpclaunch.rendezvous.etcd.outage import EtcdUnavailable, history_restarted, rebuilt_line

ENDPOINT = "etcd1:2379"
LOST = '{"error":"etcdserver: requested lease not found","code":5}'


class WipedEtcdClient:
    """Answers as an etcd that knows only the leases it granted since it came back."""

    def __init__(self, known: set[int]) -> None:
        self.known = known
        self.granted = 0
        self.puts: list[int] = []

    def get_url(self, path: str) -> str:
        return "http://etcd1:2379/v3" + path

    def post(self, url: str, json: Any) -> Any:
        if url.endswith("/lease/grant"):
            self.granted += 1
            self.known.add(100 + self.granted)
            return {"ID": str(100 + self.granted), "TTL": json["TTL"]}
        if url.endswith("/kv/put"):
            if json["lease"] not in self.known:
                raise gw_errors.Etcd3Exception(LOST)
            self.puts.append(json["lease"])
            return {"header": {"revision": "2"}}
        raise AssertionError(f"unexpected request {url}")


def test_a_write_on_a_lease_etcd_lost_is_refused_as_such_not_retried() -> None:
    etcd = Etcd(Access((ENDPOINT,)), ENDPOINT, WipedEtcdClient(known=set()))
    with pytest.raises(LeaseNotFound, match="requested lease not found") as caught:
        etcd.put("/hpclaunch/x", b"1", lease=7)
    assert not isinstance(caught.value, EtcdUnavailable)
    assert str(caught.value).startswith("etcd at etcd1:2379")


def test_a_write_on_a_lost_lease_is_made_again_on_a_new_one_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = WipedEtcdClient(known=set())
    etcd = Etcd(Access((ENDPOINT,)), ENDPOINT, client)
    keeper = LeaseKeeper(etcd, ttl_s=3600)  # its renewals never come in this test
    try:
        client.known.clear()  # etcd wiped: the lease granted at start is gone
        with caplog.at_level(logging.WARNING):
            keeper.write(lambda lease: etcd.put("/hpclaunch/x", b"1", lease))
            keeper.write(lambda lease: etcd.put("/hpclaunch/y", b"2", lease))
            assert keeper.replace(101) == 102  # another thread's loss, replaced already
    finally:
        keeper.stop()
    assert client.puts == [102, 102]
    assert client.granted == 2
    assert caplog.messages == ["etcd no longer knows this node's lease; took a new one"]


@pytest.mark.parametrize(
    ("revision", "known", "restarted"),
    [(3, 4000, True), (4000, 4000, False), (4001, 4000, False), (1, 0, False)],
)
def test_a_revision_below_the_newest_seen_means_etcd_lost_its_history(
    revision: int, known: int, restarted: bool
) -> None:
    assert history_restarted(revision, known) is restarted


def _state(round_: int, nodes: int) -> bytes:
    state = _RendezvousState()
    state.round = round_
    state.complete = True
    now = datetime.now(timezone.utc)
    for rank in range(nodes):
        node = _NodeDesc(f"n{rank}", 1000 + rank, 0)
        state.participants[node] = rank
        state.last_heartbeats[node] = now
    return pickle.dumps(state)


def test_the_rebuilt_line_names_the_round_the_nodes_and_who_wrote_it() -> None:
    assert rebuilt_line(_state(4, 2), wrote=True) == (
        "etcd lost the rendezvous state (its data wiped, or a new etcd at its address); "
        "this node wrote back the state it held: round 4, 2 nodes; running workers go on"
    )
    assert "another node wrote back its state: round 0, 3 nodes" in rebuilt_line(
        _state(0, 3), wrote=False
    )
