"""The Python stacks of a node's workers, read by its agent: through py-spy where it is
installed (it reads a stopped process too), else through the handler each worker
installs at start (hpclaunch.progress: faulthandler on a real-time signal). Then parsed
into threads and frames (``parse``), each rank judged waiting in a collective or not
(``waiting``), and identical stacks grouped with their ranks (``grouped``). No torch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpclaunch import procs

# How long one stack read may take (py-spy, or the signal handler's file to settle).
READ_TIMEOUT_S = 5.0
_SETTLE_S = 0.2
NO_PY_SPY = (
    "stopped: a stopped process runs no signal handler, so its stack needs py-spy "
    "(pip install py-spy on the nodes)"
)

# An innermost frame in one of these waits for other ranks (a collective; autograd's
# engine, which waits for DDP's all-reduce) or is hpclaunch's checkpointing.
_WAITING = re.compile(r"(^|/)torch/(distributed|autograd|nn/parallel)/|(^|/)hpclaunch/checkpoint/")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


@dataclass(frozen=True)
class Thread:
    name: str  # "MainThread" where the reader knows it, else ""
    frames: tuple[Frame, ...]  # innermost first


def py_spy() -> str | None:
    """py-spy's executable: next to this python (its environment's bin), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def read(
    pids: Mapping[int, int],
    stopped: Iterable[int],
    signal_files: Mapping[int, str],
    timeout_s: float = READ_TIMEOUT_S,
    spy: str | None = "",
) -> dict[int, str]:
    """rank -> its raw stack text, for the ranks ``pids`` names (rank -> pid). Through
    py-spy (``spy``; "": found by ``py_spy``, None: not used); else each rank in
    ``signal_files`` (rank -> the file its handler writes to) is sent ``stack_signal()``,
    and a rank in ``stopped`` gets a note instead. A rank whose stack cannot be read gets
    a line that says why."""
    # The worker API's signal: imported here, so that the login node's `hpclaunch status`
    # (which shares this module's parsers) does not load the worker's progress code.
    from hpclaunch.progress import stack_signal

    spy = py_spy() if spy == "" else spy
    out = _by_py_spy(spy, pids, timeout_s) if spy is not None else {}
    # Where py-spy could not read a rank (no permission, a torn read): its own handler.
    failed = [rank for rank in pids if out.get(rank, "no stack").startswith("no stack")]
    if spy is not None and (not failed or all(r in stopped for r in failed)):
        return out
    asked: dict[int, tuple[str, int]] = {}
    for rank, pid in {r: pids[r] for r in failed}.items():
        path = signal_files.get(rank)
        if rank in stopped:
            out[rank] = out.get(rank) or NO_PY_SPY
        elif path is None:
            out[rank] = out.get(rank) or "no stack: the worker has no stack handler"
        else:
            asked[rank] = (path, _size(path))
            try:
                os.kill(pid, stack_signal())
            except OSError as exc:
                out[rank] = f"no stack: {exc.strerror}"
                del asked[rank]
    out.update(_written(asked, {r: pids[r] for r in asked}, timeout_s))
    return out


def _by_py_spy(spy: str, pids: Mapping[int, int], timeout_s: float) -> dict[int, str]:
    """``py-spy dump --nonblocking`` of every pid at once (a hung process does not move,
    so reading it without pausing it is safe)."""
    running = {
        rank: subprocess.Popen(
            [spy, "dump", "--nonblocking", "--pid", str(pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank, pid in pids.items()
    }
    deadline = time.monotonic() + timeout_s
    out = {}
    for rank, proc in running.items():
        try:
            text, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            text = f"no stack: py-spy did not answer in {timeout_s:g} s"
        out[rank] = text if proc.returncode == 0 else f"no stack: py-spy: {text.strip()}"
    return out


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _written(
    asked: Mapping[int, tuple[str, int]], pids: Mapping[int, int], timeout_s: float
) -> dict[int, str]:
    """What each handler appended to its file, once the file has grown and then not
    changed for _SETTLE_S (faulthandler writes the stacks in pieces); a rank whose
    process has ended or stopped is not waited for."""
    deadline = time.monotonic() + timeout_s
    seen = {rank: (before, time.monotonic()) for rank, (_, before) in asked.items()}
    while time.monotonic() < deadline:
        now = time.monotonic()
        for rank, (path, _) in asked.items():
            size = _size(path)
            if size != seen[rank][0]:
                seen[rank] = (size, now)
        if all(
            (seen[r][0] > before and now - seen[r][1] >= _SETTLE_S)
            or procs.state(pids[r]) in ("", "Z", "T")
            for r, (_, before) in asked.items()
        ):
            break
        time.sleep(0.05)
    out = {}
    for rank, (path, before) in asked.items():
        try:
            with open(path, errors="replace") as file:
                file.seek(before)
                text = file.read()
        except OSError as exc:
            text = f"no stack: {exc.strerror}"
        out[rank] = text or f"no stack: the worker did not answer in {timeout_s:g} s"
    return out


# A warm worker's stack goes on below the script, into the zygote and the agent.
_LAUNCH_FRAMES = re.compile(r"(^|/)hpclaunch/node/(warmstart|progress_boot)/")
_SPY_THREAD = re.compile(r'^Thread (?:0x)?[0-9a-fA-F]+ \([^)]*\)(?:: "(?P<name>[^"]*)")?')
_SPY_FRAME = re.compile(r"^\s+(?P<function>.+?) \((?P<file>.+):(?P<line>\d+)\)\s*$")
_FH_THREAD = re.compile(r"^(?P<current>Current thread|Thread) 0x[0-9a-fA-F]+ ")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>.+?)\s*$')


def parse(text: str) -> list[Thread]:
    """The threads of one process's stack text, from py-spy's dump or faulthandler's;
    [] when it holds none (a note). The main thread comes first. Pure."""
    threads: list[tuple[str, list[Frame]]] = []
    faulthandler = cut = False
    for line in text.splitlines():
        spy, fh = _SPY_THREAD.match(line), _FH_THREAD.match(line)
        if spy is not None or fh is not None:
            faulthandler, cut = fh is not None, False
            threads.append(((spy and spy["name"]) or "", []))
            continue
        frame = _SPY_FRAME.match(line) or _FH_FRAME.match(line)
        if frame is None or not threads or cut:
            continue
        cut = bool(_LAUNCH_FRAMES.search(frame["file"]))  # the rest is the launch's
        if not cut:
            threads[-1][1].append(Frame(frame["function"], frame["file"], int(frame["line"])))
    if faulthandler and threads:  # the main thread is the oldest: listed last
        threads.insert(0, threads.pop())
        threads[0] = ("MainThread", threads[0][1])
    parsed = [Thread(name, tuple(frames)) for name, frames in threads]
    mains = [t for t in parsed if t.name == "MainThread"]
    return mains + [t for t in parsed if t.name != "MainThread"]


def waiting(threads: Sequence[Thread]) -> bool | None:
    """Whether the main thread waits for other ranks: its innermost frame is torch's
    collectives or autograd's engine (where DDP's reduction is waited for), or hpclaunch's
    checkpointing; None when there is no stack to tell. Only the innermost frame counts:
    a rank stuck in its own code inside a forward or backward has torch frames below it.
    Pure."""
    if not threads or not threads[0].frames:
        return None
    return bool(_WAITING.search(threads[0].frames[0].file))


def in_script(threads: Sequence[Thread]) -> bool:
    """Whether the main thread still runs the script (its top level, ``<module>``, is on
    the stack), not the interpreter's exit (exit handlers, finalizers). Pure."""
    return bool(threads) and any(f.function == "<module>" for f in threads[0].frames)


def where(threads: Sequence[Thread]) -> str:
    """The main thread's innermost frame outside torch, else its innermost; "" without."""
    if not threads or not threads[0].frames:
        return ""
    frames = threads[0].frames
    own = [f for f in frames if not re.search(r"(^|/)(torch|threading)/?", f.file)]
    return str((own or list(frames))[0])


def render(threads: Sequence[Thread]) -> str:
    """One process's stacks as ``hpclaunch stacks`` prints them (ids left out, so that
    identical stacks read identical). Pure."""
    lines = []
    for thread in threads:
        lines.append(f"Thread {thread.name or '(unnamed)'}:")
        lines.extend(f"    {frame}" for frame in thread.frames)
    return "\n".join(lines)


def grouped(stacks: Mapping[int, str]) -> list[tuple[list[int], str]]:
    """(ranks, text) for each distinct stack of ``stacks`` (rank -> raw text): parsed and
    rendered where it parses, else the text itself; most ranks first. Pure."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(stacks):
        threads = parse(stacks[rank])
        text = render(threads) if threads else stacks[rank].strip()
        groups.setdefault(text, []).append(rank)
    return sorted(
        ((ranks, text) for text, ranks in groups.items()), key=lambda g: (-len(g[0]), g[0])
    )


def ranks_text(ranks: Sequence[int]) -> str:
    """1,2,3,5 -> "1-3,5". Pure."""
    spans: list[list[int]] = []
    for rank in sorted(ranks):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
