"""Drives a real zygote outside any agent, one scenario per run, for test_zygote_lifecycle.

    python zygote_driver.py SCENARIO FOLDER

Forks the zygote from this single-threaded process, runs the scenario and prints what
it saw as one line of JSON. Workers are plain scripts written into FOLDER.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpclaunch.node.warmstart.forked_worker import ForkRequest
from hpclaunch.node.warmstart.zygote import Zygote, ZygoteError, kill_group

SLEEPER = "import time\ntime.sleep(60)\n"


def start(folder: Path, name: str, body: str) -> ForkRequest:
    script = folder / f"{name}.py"
    script.write_text(body)
    return ForkRequest(
        python_args=("-u", str(script)),
        env=dict(os.environ),
        cwd=str(folder),
        stdout=str(folder / f"{name}.out"),
        stderr=str(folder / f"{name}.err"),
    )


def until(condition: Callable[[], bool], zygote: Zygote, timeout_s: float = 20.0) -> bool:
    """Wait on the zygote's reports until ``condition`` holds (False after the timeout)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        zygote.wait(0.1)
    return True


def state(pid: int) -> str:
    """The process's state letter from /proc, or "gone"."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rpartition(")")[2].split()[0]


def group_at_once(zygote: Zygote, folder: Path) -> dict[str, Any]:
    """Each worker leads its own process group by the time spawn returns."""
    pids = [zygote.spawn(start(folder, f"sleeper{i}", SLEEPER)) for i in range(20)]
    leaders = [os.getpgid(pid) == pid for pid in pids]
    for pid in pids:
        kill_group(pid, signal.SIGKILL)
    ended = until(lambda: set(pids) <= set(zygote.returncodes()), zygote)
    return {"leaders": leaders, "ended": ended, "codes": [zygote.returncodes()[p] for p in pids]}


def stopped_at_once(zygote: Zygote, folder: Path) -> dict[str, Any]:
    """A SIGTERM sent as soon as spawn returns reaches a worker that takes it as python
    would (the zygote ignores it; the worker must not any more)."""
    pids = []
    for i in range(20):
        pids.append(zygote.spawn(start(folder, f"sleeper{i}", SLEEPER)))
        kill_group(pids[-1], signal.SIGTERM)
    ended = until(lambda: set(pids) <= set(zygote.returncodes()), zygote, timeout_s=10)
    for pid in pids:  # whatever ignored it
        kill_group(pid, signal.SIGKILL)
    until(lambda: set(pids) <= set(zygote.returncodes()), zygote)
    return {"ended": ended, "codes": [zygote.returncodes()[p] for p in pids]}


def missing_script(zygote: Zygote, folder: Path) -> dict[str, Any]:
    """A script that is not there: python's message and status 2."""
    request = start(folder, "placeholder", "")
    missing = str(folder / "missing.py")
    pid = zygote.spawn(dataclasses.replace(request, python_args=("-u", missing)))
    until(lambda: pid in zygote.returncodes(), zygote)
    return {
        "code": zygote.returncodes().get(pid),
        "missing": missing,
        "stderr": (folder / "placeholder.err").read_text(),
    }


def kept_until_released(zygote: Zygote, folder: Path) -> dict[str, Any]:
    """An ended worker's pid stays taken (a zombie) until the agent releases it."""
    pid = zygote.spawn(start(folder, "quick", "import sys\nsys.exit(7)\n"))
    until(lambda: pid in zygote.returncodes(), zygote)
    code = zygote.returncodes().get(pid)
    before = state(pid)
    zygote.release([pid])
    deadline = time.monotonic() + 20
    while state(pid) != "gone" and time.monotonic() < deadline:
        time.sleep(0.01)
    return {
        "code": code,
        "before": before,
        "after": state(pid),
        "forgotten": pid not in zygote.returncodes(),
    }


def zygote_killed(zygote: Zygote, folder: Path) -> dict[str, Any]:
    """A zygote that dies takes its workers along, and the handle says so."""
    pids = [zygote.spawn(start(folder, f"sleeper{i}", SLEEPER)) for i in range(2)]
    os.kill(zygote.pid, signal.SIGKILL)
    os.waitpid(zygote.pid, 0)
    woke = zygote.wait(5.0)
    codes = zygote.returncodes()
    try:
        zygote.spawn(start(folder, "late", SLEEPER))
        refused = ""
    except ZygoteError as exc:
        refused = str(exc)
    deadline = time.monotonic() + 20
    while any(state(p) not in ("gone", "Z") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    return {
        "woke": woke,
        "gone": zygote.gone,
        "codes": [codes.get(p) for p in pids],
        "refused": refused,
        "workers": [state(p) for p in pids],
    }


FINISHING = """
import logging, logging.handlers, multiprocessing, os, sys, time
import helper

def late(path):
    time.sleep(0.5)
    with open(path, "w") as f:
        f.write("child done")

kept = open("main.txt", "w")
kept.write("written by the script, never closed")
helper.LOG.write("written by a module, never closed")
memory = logging.handlers.MemoryHandler(100, target=logging.FileHandler("records.log"))
logging.getLogger("finish").addHandler(memory)
logging.getLogger("finish").warning("buffered until logging shuts down")
multiprocessing.get_context("fork").Process(target=late, args=("child.txt",)).start()
"""


def finishing(zygote: Zygote, folder: Path) -> dict[str, Any]:
    """What python does at exit still happens: exit handlers of the modules the zygote
    had imported (logging, multiprocessing), and unclosed files are flushed."""
    (folder / "helper.py").write_text("LOG = open('helper.txt', 'w')\n")
    pid = zygote.spawn(start(folder, "finishing", FINISHING))
    until(lambda: pid in zygote.returncodes(), zygote)
    read = {}
    for name in ("main.txt", "helper.txt", "records.log", "child.txt"):
        path = folder / name
        read[name] = path.read_text() if path.exists() else None
    return {
        "code": zygote.returncodes().get(pid),
        "files": read,
        "stderr": (folder / "finishing.err").read_text(),
    }


SCENARIOS = {
    f.__name__: f
    for f in (
        group_at_once,
        stopped_at_once,
        missing_script,
        kept_until_released,
        zygote_killed,
        finishing,
    )
}


def main() -> None:
    scenario, folder = SCENARIOS[sys.argv[1]], Path(sys.argv[2])
    zygote = Zygote.fork()
    try:
        print(json.dumps(scenario(zygote, folder)), flush=True)
    finally:
        zygote.close()


if __name__ == "__main__":
    main()
