"""The batch step itself, for the supervisor: ``srun`` run with the signals the batch
shell gets passed on to it (installed first thing, so that none is lost during
start-up), and what srun said about how the step ended. No policy here: the supervisor
(hpclaunch.recovery.supervisor) decides what follows. No torch.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from hpclaunch.contract.supervisor import DEFAULT_SUPERVISOR_GRACE_S
from hpclaunch.errors import ExitCode, HpclaunchError
from hpclaunch.recovery import stepdeath
from hpclaunch.recovery.watch import Stall, StepWatch

log = logging.getLogger("hpclaunch.recovery.supervisor")  # the supervisor's lines

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
_POLL_S = 0.2


class StepNotFound(HpclaunchError):
    """The step's command (srun) is not on PATH."""

    exit_code = ExitCode.SLURM


def exit_status(returncode: int) -> int:
    """A shell-style exit status: death by signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(frozen=True)
class StepResult:
    status: int
    signals: tuple[int, ...]  # the signals received (and forwarded), in order
    died: tuple[stepdeath.Death, ...] = ()  # the agents srun reports killed by a signal
    srun_signal: int | None = None  # the signal that ended srun itself
    stall: Stall | None = None  # why the supervisor's watch ended the step (srun killed)

    @property
    def first_signal(self) -> int | None:
        return self.signals[0] if self.signals else None


@dataclass
class Forwarder:
    """Records the signals the supervisor gets and passes them to the step, once it
    runs. Installed first thing, so that a signal during start-up is not lost."""

    child: subprocess.Popen[bytes] | None = None
    received: list[int] = field(default_factory=list)

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        # Only bookkeeping and a kill(2) here: no I/O, no policy, inside a signal handler.
        self.received.append(signum)
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def attach(self, child: subprocess.Popen[bytes]) -> None:
        """Start forwarding to ``child``, passing on what arrived before it ran."""
        self.child = child
        for signum in self.received:
            child.send_signal(signum)


@contextmanager
def forwarding() -> Iterator[Forwarder]:
    forwarder = Forwarder()
    previous = {sig: signal.signal(sig, forwarder.handle) for sig in FORWARDED_SIGNALS}
    try:
        yield forwarder
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_step(
    argv: Sequence[str],
    forwarder: Forwarder,
    grace_s: float = DEFAULT_SUPERVISOR_GRACE_S,
    on_signal: Callable[[int], None] | None = None,
    noise_log: Path | None = None,
    watch: StepWatch | None = None,
) -> StepResult:
    """Run ``argv`` (the srun step) with ``forwarder`` passing signals to it. After the
    first signal the step gets ``grace_s`` seconds to end; then srun is killed (SLURM
    cleans up the tasks). ``on_signal(first signal)`` runs once, outside the signal
    handler, while the step is still ending. With ``noise_log``, torch's known-harmless
    lines go there and are summarised once at the end (hpclaunch.recovery.noise).
    With ``watch``, the supervisor beats and watches srun and the agents while it
    waits (hpclaunch.recovery.watch): a stalled step has srun killed and says why;
    after the step, its beat says the supervisor decides (``StepWatch.deciding``).
    Raises StepNotFound."""
    if watch is not None:
        watch.beat()  # before the agents can look for it
    try:
        child = subprocess.Popen(list(argv), stderr=subprocess.PIPE)
    except FileNotFoundError:
        raise StepNotFound(
            f"{argv[0]!r} is not on PATH in the batch step; this must run inside a SLURM "
            "job (the rendered script calls it)"
        ) from None
    tee = stepdeath.Tee(child.stderr, noise_log).start() if child.stderr is not None else None
    forwarder.attach(child)
    log.info("supervisor: step %s started (pid %d)", argv[0], child.pid)
    stall: list[Stall] = []
    try:
        returncode = _wait(child, forwarder.received, grace_s, on_signal, watch, stall)
    finally:
        if watch is not None:
            watch.deciding()  # the caller beats once more when it has decided
    log.info("supervisor: step ended with status %d", exit_status(returncode))
    died = tee.deaths() if tee is not None else ()
    for line in tee.summary() if tee is not None else ():
        log.info("supervisor: %s", line)
    srun_signal = -returncode if returncode < 0 else None
    status = exit_status(returncode)
    if stall:
        return StepResult(status, tuple(forwarder.received), died, srun_signal, stall[0])
    return StepResult(status, tuple(forwarder.received), died, srun_signal)


def _wait(
    child: subprocess.Popen[bytes],
    received: list[int],
    grace_s: float,
    on_signal: Callable[[int], None] | None,
    watch: StepWatch | None = None,
    stall: list[Stall] | None = None,
) -> int:
    deadline: float | None = None
    while True:
        try:
            return child.wait(timeout=_POLL_S)
        except subprocess.TimeoutExpired:
            pass
        # Beats and looks come from this loop, not a thread of their own: a supervisor
        # that stops here stops beating, which is what the agents watch for.
        found = watch.tick(child.pid) if watch is not None else None
        if found is not None:
            log.error("supervisor: %s", found.message)
            child.kill()  # a stopped srun dies of SIGKILL too; SLURM ends the tasks
            if stall is not None:
                stall.append(found)
            return child.wait()
        if received and deadline is None:
            deadline = time.monotonic() + grace_s
            if on_signal is not None:
                on_signal(received[0])
        if deadline is not None and time.monotonic() > deadline:
            log.warning(
                "supervisor: step still running %.0f s after the signal; killing srun", grace_s
            )
            child.kill()
            return child.wait()
