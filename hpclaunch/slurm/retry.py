"""SLURM commands that act on a running job, tried again while the controller is away.

slurmctld restarts for upgrades, reconfiguration and failover are ordinary on a cluster,
and while it is away every command fails: ``scontrol`` tries for about MessageTimeout and
then gives up. SLURM 22.05 says so in two ways: ``scontrol show job`` and ``sinfo`` print
"Unable to contact slurm controller (connect failure)", while ``scontrol requeue`` and
``scontrol update`` print "Unexpected message received for job N". A controller that
answers and refuses ("Invalid job id specified", "Requested operation is presently
disabled", "Job is pending execution") will refuse again: that is not retried.

``persist`` runs one command through ``Slurm`` until it works, it is refused, or its
``Window`` closes; the clock is injected so that unit tests run it without waiting.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from hpclaunch.errors import SlurmError, SlurmNotFound
from hpclaunch.slurm.commands import Slurm

log = logging.getLogger(__name__)

T = TypeVar("T")

# What SLURM's clients print when the controller could not be reached or did not answer
# in time (slurm_errno.c); a refusal never says these.
UNREACHABLE = (
    "unable to contact slurm controller",
    "unexpected message received",
    "socket timed out on send/recv operation",
    "zero bytes were transmitted or received",
    "slurm backup controller in standby mode",
    "try again later",
)
FIRST_WAIT_S = 1.0
MAX_WAIT_S = 10.0
# An attempt gets at least this long, even at the end of its window: scontrol needs
# about MessageTimeout to say that the controller is away.
MIN_ATTEMPT_S = 5.0


class Clock(Protocol):
    """Monotonic seconds, and a way to let them pass."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK = SystemClock()


@dataclass(frozen=True)
class Window:
    """Until when (a reading of ``clock``) a command is tried again, what set that
    time, in words for the messages ("until the job's time limit"), and when the
    waiting began (None: at the command's first attempt)."""

    deadline: float
    why: str
    opened: float | None = None
    clock: Clock = field(default=SYSTEM_CLOCK, compare=False)


class SlurmUnreachable(SlurmError):
    """SLURM's controller did not answer before the command's window closed."""


def first_line(exc: SlurmError) -> str:
    """The first line of what the command printed, else of the error's message."""
    for text in (exc.stderr, str(exc)):
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        if lines:
            return lines[0]
    return "no answer"


def describe(exc: SlurmError) -> str:
    """One line for a failed command: the whole message of a SlurmUnreachable, else
    the command and the first line of what SLURM said."""
    if isinstance(exc, SlurmUnreachable) or not exc.argv:
        return " ".join(str(exc).split())
    return f"{' '.join(exc.argv)} failed: {first_line(exc)}"


def unreachable(exc: SlurmError, slurm: Slurm) -> bool:
    """Whether ``exc`` means that the controller could not be reached (worth another
    try) rather than that it answered and refused. An answer not known either way is
    settled by ``scontrol ping``: a controller that is up has refused."""
    if isinstance(exc, SlurmNotFound):
        return False
    if exc.returncode is None:  # the command timed out
        return True
    text = f"{exc.stderr}\n{exc}".lower()
    if any(marker in text for marker in UNREACHABLE):
        return True
    return not slurm.ping()


def backoff_s(attempt: int) -> float:
    """The wait after failed attempt ``attempt`` (1, 2, ...): 1 s, doubling, at most 10 s."""
    return min(MAX_WAIT_S, FIRST_WAIT_S * 2.0 ** (attempt - 1))


def persist(
    act: Callable[[Slurm], T],
    slurm: Slurm,
    window: Window,
    *,
    who: str = "",
) -> T:
    """``act(slurm)``, tried again with backoff while SLURM's controller cannot be
    reached and ``window`` is open; each retry is logged (``who`` prefixes the lines).
    Each attempt's timeout ends with the window (but is MIN_ATTEMPT_S at least).
    Raises the SlurmError of a refusal at once, and SlurmUnreachable once the window
    has closed."""
    clock = window.clock
    started = clock.now()
    attempt, command = 1, ""
    while True:
        left = window.deadline - clock.now()
        timeout_s = min(slurm.timeout_s, float(math.ceil(max(left, MIN_ATTEMPT_S))))
        timed = replace(slurm, timeout_s=timeout_s)
        try:
            result = act(timed)
        except SlurmError as exc:
            if not unreachable(exc, timed):
                raise
            command, said = " ".join(exc.argv), first_line(exc)
            left = window.deadline - clock.now()
            if left <= 0:
                since = started if window.opened is None else window.opened
                raise SlurmUnreachable(
                    exc.argv,
                    exc.returncode,
                    exc.stderr,
                    f"{command}: gave up waiting for SLURM's controller after "
                    f"{clock.now() - since:.0f} s ({window.why}; {attempt} "
                    f"attempt{'s' * (attempt > 1)} of this command); SLURM said: {said}",
                ) from exc
            wait = min(backoff_s(attempt), left)
            log.warning(
                "%s%s failed, SLURM's controller did not answer (%s); attempt %d, next try "
                "in %.0f s, %.0f s left (%s)",
                who,
                command,
                said,
                attempt,
                wait,
                left,
                window.why,
            )
            clock.sleep(wait)
            attempt += 1
            continue
        if attempt > 1:
            log.info(
                "%s%s: SLURM's controller answered at attempt %d, %.0f s after the first",
                who,
                command,
                attempt,
                clock.now() - started,
            )
        return result


@dataclass
class Patience:
    """How long the supervisor keeps trying SLURM's controller for a run.

    After a signal (SLURM's time-limit warning, or its SIGTERM), until the signal's lead
    is spent: the time limit, after which SLURM ends the job anyway. After a step that
    ended without a signal (a failure), for ``after_failure_s`` from the first command.
    """

    signal_lead_s: float
    after_failure_s: float
    clock: Clock = SYSTEM_CLOCK
    _window: Window | None = None

    def signalled(self) -> None:
        """The first signal came now (later calls change nothing)."""
        if self._window is None:
            now = self.clock.now()
            self._window = Window(
                now + self.signal_lead_s,
                f"until the job's time limit, --signal-lead {self.signal_lead_s:g} s "
                "after the signal",
                now,
                self.clock,
            )

    def window(self) -> Window:
        """The window of this run's commands; opened at the first call when no signal
        came."""
        if self._window is None:
            now = self.clock.now()
            self._window = Window(
                now + self.after_failure_s,
                f"--slurm-patience {self.after_failure_s:g} s",
                now,
                self.clock,
            )
        return self._window
