"""Waiting out an etcd outage: which failures are retried, for how long, what is logged,
and the heartbeats an outage kept from etcd. A fake clock; the real etcd is in
tests/integration/test_etcd_outage.py."""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pytest
from etcd3gw import exceptions as gw_errors

from hpclaunch.contract.rendezvous import EtcdRdzv
from hpclaunch.errors import EtcdError, SpecError
from hpclaunch.rendezvous.etcd.access import Access
from hpclaunch.rendezvous.etcd.client import Etcd
from hpclaunch.rendezvous.etcd.outage import (
    EtcdUnavailable,
    Outage,
    forgive_heartbeats,
    unavailable,
)

ENDPOINT = "etcd1:2379"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def outage(clock: FakeClock, timeout_s: float = 60.0) -> Outage:
    return Outage(ENDPOINT, timeout_s, clock=clock, wall=lambda: 5000.0, sleep=clock.sleep)


def failing(times: int, error: EtcdError) -> Any:
    calls = {"n": 0}

    def request() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise error
        return "answer"

    return request, calls


def test_an_outage_is_retried_with_growing_delays_and_logged_once_each_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    waits = outage(clock)
    request, calls = failing(8, EtcdUnavailable("etcd at etcd1:2379: connection refused"))
    with caplog.at_level(logging.WARNING):
        assert waits.call(request) == "answer"
    assert calls["n"] == 9
    assert clock.sleeps == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("etcd at etcd1:2379 is unreachable (connection refused); ")
    assert "waiting up to 60 s" in lines[0]
    assert lines[1] == "etcd at etcd1:2379 is back after 9.1 s"
    assert waits.recovered_at == 5000.0


def test_an_outage_longer_than_the_timeout_is_an_error_naming_etcd_and_the_time() -> None:
    clock = FakeClock()
    waits = outage(clock, timeout_s=10)
    request, _ = failing(1000, EtcdUnavailable("etcd at etcd1:2379: connection refused"))
    with pytest.raises(EtcdError) as caught:
        waits.call(request)
    assert not isinstance(caught.value, EtcdUnavailable)
    assert str(caught.value) == (
        "etcd at etcd1:2379 was unreachable for 10 s, longer than --etcd-outage-timeout 10 "
        "(connection refused); check etcd there, or give a longer --etcd-outage-timeout"
    )
    assert clock.now == pytest.approx(110.0)  # the last sleep stops at the timeout
    assert waits.recovered_at is None


def test_a_refusal_is_raised_at_once() -> None:
    clock = FakeClock()
    request, calls = failing(1, EtcdError("etcd at etcd1:2379 refused /kv/put: permission denied"))
    with pytest.raises(EtcdError, match="permission denied"):
        outage(clock).call(request)
    assert calls["n"] == 1 and clock.sleeps == []


def test_the_outage_is_timed_from_its_first_failure_whichever_request_saw_it() -> None:
    clock = FakeClock()
    waits = outage(clock, timeout_s=10)
    request, _ = failing(1, EtcdUnavailable("down"))
    waits.call(request)  # one failure, then an answer: the outage is over
    clock.now += 100
    second, _ = failing(3, EtcdUnavailable("down"))
    assert waits.call(second) == "answer"  # a new outage, timed afresh
    assert clock.sleeps[-3:] == [0.1, 0.2, 0.4]


@pytest.mark.parametrize(
    ("detail", "expected"),
    [
        ('{"error":"etcdserver: leader changed","code":14}', True),
        ("etcdserver: no leader", True),
        ("etcdserver: request timed out", True),
        ("etcdserver: permission denied", False),
        ("etcdserver: user name is empty", False),
        ("etcdserver: invalid auth token", False),
    ],
)
def test_which_messages_of_etcd_mean_unavailable(detail: str, expected: bool) -> None:
    assert unavailable(detail) is expected


class RaisingClient:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def get_url(self, path: str) -> str:
        return "http://etcd1:2379/v3" + path

    def post(self, url: str, json: Any) -> Any:
        raise self.error


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (gw_errors.ConnectionFailedError("[Errno 111] Connection refused"), True),
        (gw_errors.ConnectionFailedError("('Connection aborted.', RemoteDisconnected())"), True),
        (gw_errors.ConnectionTimeoutError("read timed out"), True),
        (gw_errors.InternalServerError('{"error":"etcdserver: leader changed"}'), True),
        (gw_errors.Etcd3Exception('{"error":"etcdserver: no leader"}'), True),
        (gw_errors.ConnectionFailedError("[SSL: CERTIFICATE_VERIFY_FAILED] verify failed"), False),
        (gw_errors.Etcd3Exception('{"error":"etcdserver: permission denied"}'), False),
        (gw_errors.Etcd3Exception('{"error":"etcdserver: user name is empty"}'), False),
        (gw_errors.PreconditionFailedError('{"error":"bad request"}'), False),
    ],
)
def test_the_client_marks_what_is_worth_a_retry(error: Exception, retried: bool) -> None:
    etcd = Etcd(Access((ENDPOINT,)), ENDPOINT, RaisingClient(error))
    with pytest.raises(EtcdError) as caught:
        etcd.get("/hpclaunch/x")
    assert isinstance(caught.value, EtcdUnavailable) is retried
    assert str(caught.value).startswith("etcd at etcd1:2379")


def test_a_connected_client_waits_the_outage_out_and_then_names_it() -> None:
    clock = FakeClock()
    client = RaisingClient(gw_errors.ConnectionFailedError("[Errno 111] Connection refused"))
    etcd = Etcd(Access((ENDPOINT,)), ENDPOINT, client)
    etcd.outage = outage(clock, timeout_s=30)
    with pytest.raises(EtcdError, match=r"unreachable for 30 s, longer than --etcd-outage-time"):
        etcd.put("/hpclaunch/x", b"1")
    assert len(clock.sleeps) > 10


@dataclass
class State:  # what forgive_heartbeats reads of torch's _RendezvousState
    round: int = 3
    last_heartbeats: dict[str, datetime] = field(default_factory=dict)


def at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc)


def test_heartbeats_the_outage_kept_from_etcd_count_from_its_end() -> None:
    state = State(last_heartbeats={"a": at(900.0), "b": at(1010.0)})
    out = pickle.loads(forgive_heartbeats(pickle.dumps(state), 1000.0))
    assert out.last_heartbeats == {"a": at(1000.0), "b": at(1010.0)}
    assert out.round == 3


def test_a_state_with_no_stale_heartbeat_is_handed_on_unchanged() -> None:
    raw = pickle.dumps(State(last_heartbeats={"a": at(1001.0)}))
    assert forgive_heartbeats(raw, 1000.0) is raw


def test_the_outage_timeout_setting_is_checked_and_reaches_the_agent() -> None:
    etcd = EtcdRdzv(endpoints=("h:1",), outage_timeout=90.0)
    assert etcd.rdzv_configs() == {"outage_timeout": "90"}
    assert etcd.argv() == ["--etcd-endpoint", "h:1", "--etcd-outage-timeout", "90"]
    for bad in (0, -5.0, "soon"):
        with pytest.raises(SpecError) as caught:
            EtcdRdzv(endpoints=("h:1",), outage_timeout=bad)  # type: ignore[arg-type]
        assert caught.value.field == "etcd_outage_timeout"
    with pytest.raises(EtcdError, match="--etcd-outage-timeout 0 is not a positive"):
        Access((ENDPOINT,), outage_timeout_s=0)
