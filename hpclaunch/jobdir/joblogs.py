"""What the per-rank logs say when workers fail: the traceback of a failed rank and
the root-cause block of a failed node. Pure: no torch, no SLURM calls, so the
login-node commands can read what the agents wrote. Where the logs are is
``hpclaunch.jobdir.layout``'s business.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from hpclaunch.jobdir.errortext import known_fix

TRACEBACK_START = "Traceback (most recent call last):"
MAX_TRACEBACK_LINES = 60
TAIL_LINES = 20
# torch.distributed prefixes a worker's uncaught traceback with its rank.
_TORCH_PREFIX = re.compile(r"^\[rank\d+\]:\s*")


@dataclass(frozen=True)
class Failure:
    """One worker that ended badly, as torch's agent reported it."""

    rank: int
    local_rank: int
    exitcode: int  # negative: killed by that signal
    pid: int
    timestamp: float  # seconds since the epoch
    error_file: str = ""  # torch's error file, written by @record
    stderr_file: str = ""  # the rank's stderr log, when there is one


def describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name} (exit code {exitcode})"
    return f"exit code {exitcode}"


def traceback_of(failure: Failure) -> tuple[str, str]:
    """(traceback text, where it came from), or ("", "") when there is none.

    torch's error file holds the exception of a script that uses @record; else the
    last Python traceback in the rank's stderr log; else that log's last lines."""
    recorded = _recorded_traceback(failure.error_file)
    if recorded:
        return recorded, failure.error_file
    if not failure.stderr_file:
        return "", ""
    try:
        lines = Path(failure.stderr_file).read_text(errors="replace").splitlines()
    except OSError:
        return "", ""
    starts = [i for i, line in enumerate(lines) if _TORCH_PREFIX.sub("", line) == TRACEBACK_START]
    chosen = lines[starts[-1] :] if starts else lines[-TAIL_LINES:]
    if not chosen:
        return "", ""
    if len(chosen) > MAX_TRACEBACK_LINES:
        chosen = ["...", *chosen[-MAX_TRACEBACK_LINES:]]
    return "\n".join(chosen), failure.stderr_file


def _recorded_traceback(path: str) -> str:
    if not path:
        return ""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return ""
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        if isinstance(stack, str) and stack.strip():
            return stack.rstrip()
        text = message.get("message")
        return text.rstrip() if isinstance(text, str) else ""
    return message.rstrip() if isinstance(message, str) else ""


def root_cause_block(
    failures: Sequence[Failure], *, job_id: int, host: str, node_rank: int, command: Sequence[str]
) -> str:
    """The block a failed node prints: the first failing rank with its traceback,
    then one line for each other worker that ended with it."""
    if not failures:
        raise ValueError("root_cause_block needs at least one failure")
    ordered = sorted(failures, key=_blame_order)
    first = ordered[0]
    rule = "=" * 72
    lines = [
        rule,
        f"hpclaunch: job {job_id} failed on node {node_rank} ({host})",
        f"  command   : {' '.join(command)}",
        f"  root cause: rank {first.rank} (local rank {first.local_rank}, pid {first.pid}), "
        f"{describe_exit(first.exitcode)}, at {_when(first.timestamp)}",
    ]
    if first.stderr_file:
        lines.append(f"  stderr    : {first.stderr_file}")
    text, source = traceback_of(first)
    if text:
        lines.append(f"  traceback (from {source}):")
        lines.extend("    " + line for line in text.splitlines())
    else:
        lines.append(
            "  traceback : none recorded (decorate the entry function with torch's @record, "
            "or see the rank's stderr)"
        )
    fix = known_fix(text) if text else None
    if fix is not None:
        lines.append(f"  fix       : {fix}")
    for other in ordered[1:]:
        lines.append(
            f"  then      : rank {other.rank} (local rank {other.local_rank}), "
            f"{describe_exit(other.exitcode)}"
        )
    lines.append(rule)
    return "\n".join(lines)


def _blame_order(failure: Failure) -> tuple[bool, float, int]:
    """Workers that died of the SIGTERM the agent sends the others after the first
    failure come last; then the one that ended first, then rank.

    torch's times are whole seconds, and a rank that raises because its peer died
    (gloo: "connection closed by peer") usually ends in the same second as that peer.
    What a worker writes last before it exits is its stderr, so that file's change time
    orders them: the peer's error can only come after the failure that caused it."""
    return (failure.exitcode == -signal.SIGTERM, _ended_at(failure), failure.rank)


def _ended_at(failure: Failure) -> float:
    for path in (failure.stderr_file, failure.error_file):
        if path:
            try:
                return Path(path).stat().st_mtime
            except OSError:
                continue
    return failure.timestamp


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
