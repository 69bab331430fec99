"""``python .../worker_guard.py PARENT_PID CMD ARGS...``: exec CMD so that it dies
with its parent.

The agent starts every worker through this: the kernel then sends SIGKILL to
the worker when the agent dies, even by SIGKILL (torch's workers run in their
own sessions and would otherwise live on as orphans). The agent runs it by its
file path, so that it imports nothing of hpclaunch: it costs an interpreter start.
What the worker starts in turn does not inherit the death signal: the agent ends
it while it lives (hpclaunch.node.sweep).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    parent, command = int(argv[0]), argv[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        print(f"worker_guard: prctl failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 1
    if os.getppid() != parent:  # the agent died before prctl took effect
        return 1
    os.execvp(command[0], command)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
