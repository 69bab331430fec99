"""What hpclaunch owns of torch's launch (imports torch): nothing of torch's is patched,
the rendezvous delays scale with the job, the attempt and the store setting pass
between the agent's own objects."""

from __future__ import annotations

import signal
import sys
import warnings
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.integration

with warnings.catch_warnings():  # torch's import warns that numpy is missing
    warnings.simplefilter("ignore")
    from torch.distributed.elastic.agent.server import local_elastic_agent
    from torch.distributed.elastic.multiprocessing import start_processes
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic
    from torch.distributed.elastic.rendezvous import utils as rdzv_utils
    from torch.distributed.launcher import api as launcher_api

    from hpclaunch.node import launcher
    from hpclaunch.node.rank_logs import attempt_of
    from hpclaunch.node.warmstart import warm  # noqa: F401 (imported: it must patch nothing)
    from hpclaunch.rendezvous import delays, etcd_rdzv, ranked_c10d


def test_no_torch_module_is_patched() -> None:
    ranked_c10d.register()
    etcd_rdzv.register()
    assert launcher_api.LocalElasticAgent is local_elastic_agent.LocalElasticAgent
    assert local_elastic_agent.start_processes is start_processes  # type: ignore[attr-defined]
    assert dynamic._delay is rdzv_utils._delay


def test_delays_scale_with_the_job() -> None:
    assert delays.delay_factor(2) == delays.MIN_DELAY_FACTOR
    assert delays.delay_factor(50) == pytest.approx(0.5)
    assert delays.delay_factor(400) == 1.0
    slept: list[float] = []
    small = delays.Pacing(delays.delay_factor(2), sleep=slept.append)
    small.poll()
    small.jitter()
    assert slept[0] == pytest.approx(0.05)  # torch: one second
    assert 0 <= slept[1] <= 0.3 * 0.05


def test_a_watching_backend_waits_for_the_change_instead_of_sleeping() -> None:
    waited: list[float] = []
    pacing = delays.Pacing.for_job(2, waited.append)
    pacing.poll()
    assert waited == [delays.TORCH_POLL_S]


class _Holder:
    """A state holder that counts its reads."""

    def __init__(self) -> None:
        self.syncs = 0
        self.state = dynamic._RendezvousState()

    def sync(self) -> bool | None:
        self.syncs += 1
        return None

    def mark_dirty(self) -> None:
        pass


def test_the_paced_executor_never_hands_a_poll_to_torchs_sleep() -> None:
    polls: list[float] = []
    settings = SimpleNamespace(run_id="r", keep_alive_interval=None)
    node = dynamic._NodeDesc("a", 1, 0)
    holder = _Holder()
    executor = delays.PacedExecutor(node, holder, settings, delays.Pacing(0.05, polls.append))
    answers = iter([dynamic._Action.SYNC, dynamic._Action.SYNC, dynamic._Action.FINISH])
    seen: list[Any] = []

    def handler(ctx: Any, deadline: float) -> Any:
        seen.append(ctx.state)
        return next(answers)

    executor.run(handler, deadline=float("inf"))
    assert len(polls) == 2  # through the pacing, not torch's one-second _delay
    assert holder.syncs == 3  # torch's own read, and one after each wait
    assert len(seen) == 3


def test_the_attempt_reaches_the_log_folder_from_the_workers_env() -> None:
    assert attempt_of({0: {"HPCLAUNCH_ATTEMPT": "3", "TORCHELASTIC_RESTART_COUNT": "1"}}) == 3
    assert attempt_of({0: {"TORCHELASTIC_RESTART_COUNT": "1"}}) == 1  # static rendezvous
    assert attempt_of({}) == 0


def test_the_ranked_handler_gives_later_rounds_their_own_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ranked_c10d.SEPARATE_STORE, raising=False)
    handler: Any = object.__new__(ranked_c10d.RankedHandler)
    handler._rounds_joined, handler._attempt = 1, 4
    assert handler.use_agent_store and handler.attempt == 4
    handler._rounds_joined = 2
    assert not handler.use_agent_store
    handler._rounds_joined = 1
    monkeypatch.setenv(ranked_c10d.SEPARATE_STORE, "1")  # the user's own opt-out
    assert not handler.use_agent_store


def test_the_launch_helpers() -> None:
    assert launcher.signals_of("SIGTERM, SIGUSR1") == [signal.SIGTERM, signal.SIGUSR1]
    assert launcher.entrypoint_name(sys.executable, ["-u", "train.py", "-x"]) == "train.py"
    assert launcher.entrypoint_name("/bin/app", ["a"]) == "/bin/app"
    params = SimpleNamespace(backend="static", endpoint=" n1:29500 ")
    assert launcher.static_master(params) == ("n1", 29500)  # type: ignore[arg-type]
    assert launcher.static_master(SimpleNamespace(backend="x")) == (None, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="port is missing"):
        launcher.static_master(SimpleNamespace(backend="static", endpoint="n1"))  # type: ignore[arg-type]
