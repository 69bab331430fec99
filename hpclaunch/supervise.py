"""The batch-step supervisor: runs the ``srun`` step and passes SLURM's signals on.

SLURM sends the time-limit warning (``--signal=B:USR1@LEAD``) to the batch
shell only, and preemption's SIGTERM to the batch shell and the tasks. The
rendered script ``exec``s this supervisor, so it *is* the batch shell: it
forwards each of these signals to the step (srun passes them to every task)
and ends with the step's exit status.
"""

from __future__ import annotations

import logging
import signal
import subprocess
from collections.abc import Sequence
from types import FrameType

log = logging.getLogger(__name__)

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def exit_status(returncode: int) -> int:
    """A shell-style exit status: death by signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def run_step(argv: Sequence[str]) -> int:
    """Run ``argv`` (the srun step), forwarding signals to it; return its exit status."""
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        # Only a kill(2) here: no I/O, no policy, inside a signal handler.
        if child is None:
            pending.append(signum)
        elif child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        child = subprocess.Popen(list(argv))
        for signum in pending:
            child.send_signal(signum)
        log.info("supervisor: step %s started (pid %d)", argv[0], child.pid)
        returncode = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("supervisor: step ended with status %d", exit_status(returncode))
    return exit_status(returncode)
