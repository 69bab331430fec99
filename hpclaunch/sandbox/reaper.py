"""``python -m hpclaunch.sandbox.reaper CMD...``: run CMD as a child subreaper.

Each sandbox node's slurmd runs under one of these. Processes of the node
that lose their parent (slurmstepd, job tasks, workers that start their own
sessions) are re-parented here instead of to PID 1, so killing this process's
tree kills everything of the node, as a machine crash would.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"reaper: prctl failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 1
    child = subprocess.Popen(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    status = 0
    while True:  # reap the node's orphans until none is left
        try:
            pid, code = os.wait()
        except ChildProcessError:
            return status
        if pid == child.pid:
            status = os.waitstatus_to_exitcode(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
