"""Workers that died of a stop signal itself are named (plain exit codes in)."""

from __future__ import annotations

import logging
import signal

import pytest

from hpclaunch.node import stop_notes


def test_workers_killed_by_the_stop_signal_are_named_and_others_are_not(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stop_notes, "_killers", [])
    with caplog.at_level(logging.WARNING, logger=stop_notes.__name__):
        # Exited 0 (caught it and stopped) or killed by another signal: not this one.
        stop_notes.killed_by(signal.SIGUSR1, {0: 0, 1: -signal.SIGKILL})
        assert stop_notes.uncaught() is None and not caplog.records
        stop_notes.killed_by(signal.SIGUSR1, {0: -signal.SIGUSR1, 1: 0, 3: -signal.SIGUSR1})
    assert stop_notes.uncaught() is signal.SIGUSR1
    [record] = caplog.records
    assert record.getMessage().startswith(
        "local ranks 0,3 were killed by SIGUSR1: they do not catch it, so they saved nothing"
    )
