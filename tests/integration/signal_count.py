"""A worker that notes every stop signal it gets, one line per delivery, in
FOLDER/requeue-Q-rank-R.txt, and ends with status 0 a second after the first one (as
Lightning's workers do). Its first run waits for a signal; a requeued run ends at once.
With a second argument ``uncaught`` it catches nothing (a stop signal kills it), as a
Lightning worker under torch's elastic environment does not catch SIGUSR1."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

folder = Path(sys.argv[1])
requeue, rank = os.environ.get("HPCLAUNCH_REQUEUE_COUNT", "0"), os.environ["RANK"]
notes = folder / f"requeue-{requeue}-rank-{rank}.txt"
got: list[int] = []


def note(signum: int, _frame: object) -> None:
    got.append(signum)
    with notes.open("a") as out:
        out.write(f"{signal.Signals(signum).name}\n")


catch = sys.argv[2:] != ["uncaught"]
for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2) if catch else ():
    signal.signal(sig, note)
notes.touch()
if requeue == "0" and not catch:
    while True:
        time.sleep(1)
if requeue == "0":
    while not got:
        time.sleep(0.05)
    time.sleep(1.0)  # a checkpoint, during which a second delivery would show
sys.exit(0)
