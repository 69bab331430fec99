"""The warm start's pure parts: which command lines start warm, how python's exit
status follows from SystemExit, the signal dispositions an exec would leave, and
signals held off while the agent talks to its zygote."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

from hpclaunch.contract.agent import AgentSettings, EntryKind, WorkerStart
from hpclaunch.node.launch_plan import launched_as, starts_warm
from hpclaunch.node.warmstart.forked_worker import _exit_status, parse_python_args
from hpclaunch.node.warmstart.zygote import _dispositions, signals_deferred


@pytest.mark.parametrize(
    ("args", "parsed"),
    [
        (["-u", "train.py", "--lr", "3e-4"], ("script", "train.py", ["--lr", "3e-4"])),
        (["train.py"], ("script", "train.py", [])),
        (["-u", "-m", "pkg.main", "-m", "x"], ("module", "pkg.main", ["-m", "x"])),
    ],
)
def test_python_command_lines_that_start_warm(args: list[str], parsed: tuple[object]) -> None:
    assert parse_python_args(args) == parsed


@pytest.mark.parametrize("args", [[], ["-u"], ["-u", "-m"], ["-c", "print(1)"], ["-X", "dev"]])
def test_other_command_lines_start_fresh(args: list[str]) -> None:
    with pytest.raises(ValueError, match="not a script or -m module"):
        parse_python_args(args)


def test_which_workers_start_warm() -> None:
    script = AgentSettings("t.py", ("--x",))
    assert starts_warm(script)
    assert launched_as(script, 4321, "/usr/bin/setpriv") == (sys.executable, ("-u", "t.py", "--x"))
    module = AgentSettings("pkg.m", (), entry_kind=EntryKind.MODULE)
    assert starts_warm(module)
    binary = AgentSettings("/bin/app", ("a",), entry_kind=EntryKind.EXECUTABLE)
    assert not starts_warm(binary)
    assert launched_as(binary, 4321, "/usr/bin/setpriv")[0] == "/usr/bin/setpriv"
    fresh = AgentSettings("t.py", (), worker_start=WorkerStart.FRESH)
    assert not starts_warm(fresh)
    assert launched_as(fresh, 4321, None)[1][1].endswith("worker_guard.py")


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (3, 3), (256 + 7, 7), (True, 1)])
def test_exit_status_of_sys_exit(code: object, status: int) -> None:
    assert _exit_status(code) == status


def test_exit_status_of_a_message_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_status("the reason") == 1
    assert capsys.readouterr().err == "the reason\n"


def test_dispositions_are_those_an_exec_into_python_leaves() -> None:
    before = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    handler = signal.signal(signal.SIGHUP, lambda *_: None)
    try:
        kept = _dispositions()
    finally:
        signal.signal(signal.SIGUSR2, before)
        signal.signal(signal.SIGHUP, handler)
    assert kept[signal.SIGUSR2] is signal.SIG_IGN  # ignored stays ignored across exec
    assert kept[signal.SIGHUP] is signal.SIG_DFL  # a handler does not
    assert kept[signal.SIGINT] is signal.default_int_handler
    assert kept[signal.SIGPIPE] is signal.SIG_IGN
    assert kept[signal.SIGTERM] is signal.SIG_DFL
    assert signal.SIGKILL not in kept


class Handled(Exception):
    pass


def raise_handled(signum: int, frame: object) -> None:
    raise Handled(signum)


def test_a_signal_during_talk_with_the_zygote_is_handled_after_it() -> None:
    # torch's handlers raise; inside a message to the zygote that would cut the stream.
    # The signal comes from another thread, as it does in the agent (a mask would not
    # keep Python from running the handler in the main thread).
    before = signal.signal(signal.SIGUSR1, raise_handled)
    steps: list[int] = []
    try:
        with pytest.raises(Handled), signals_deferred():
            with signals_deferred():  # nested: spawn inside WarmContext._start
                sender = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGUSR1))
                sender.start()
                sender.join()
                for step in range(1000):  # bytecodes: the handler's turn comes
                    steps.append(step)
            steps.append(-1)
        assert len(steps) == 1001  # nothing was cut short
        assert signal.getsignal(signal.SIGUSR1) is raise_handled
        with pytest.raises(Handled):  # and the handler works as before, outside
            signal.raise_signal(signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_signals_without_a_python_handler_are_left_alone() -> None:
    before = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        with signals_deferred():
            assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
            signal.raise_signal(signal.SIGUSR2)
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR2, before)
