"""How fast the sandbox starts, runs a 4-node job and stops, in each mode.

A benchmark, not a test. Each round, in a fresh state folder under a temporary
directory, times through the library API (what ``hpclaunch sandbox`` calls):

1. ``Sandbox(dir).up(SandboxSpec(nodes=4, mode=MODE))``: it returns only once
   all four nodes are idle and responding, so this is "up to four idle nodes";
2. ``srun -N4 true`` against it: one 4-node job, submitted to completion;
3. ``down()``, which must leave nothing behind;
4. the three together.

Rounds alternate between the modes, so a drift in the machine's load touches
both alike. Prints a markdown table (median, min and max per phase and mode)
and the machine. Results and the targets are kept in docs/benchmarks.md.
Needs root and Debian's slurm-wlm and munge, like the sandbox itself.

    .venv/bin/python bench/sandbox.py [--rounds 5] [--modes netns,loopback] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.errors import HpclaunchError
from hpclaunch.sandbox.cluster import Sandbox, check_prerequisites
from hpclaunch.sandbox.conf import Mode, SandboxSpec
from hpclaunch.sandbox.daemons import SBIN_PATH

NODES = 4
JOB_TIMEOUT_S = 60.0
# The targets of issue 3.
TARGET_UP_S = 5.0
TARGET_TOTAL_S = 10.0
PHASES = ("up (4 nodes idle)", f"srun -N{NODES} true", "down", "total")


@dataclass(frozen=True)
class Round:
    """Wall times of one round, in seconds."""

    mode: Mode
    up_s: float
    job_s: float
    down_s: float

    @property
    def total_s(self) -> float:
        return self.up_s + self.job_s + self.down_s

    def phases(self) -> tuple[float, float, float, float]:
        return (self.up_s, self.job_s, self.down_s, self.total_s)


def sbin_env() -> dict[str, str]:
    """This process's environment, with the daemons' folders on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{env.get('PATH', '')}:{SBIN_PATH}"
    return env


def client_env(box: Sandbox) -> dict[str, str]:
    """This process's environment, with SLURM's commands pointed at ``box``."""
    return {**sbin_env(), **box.env()}


def run_job(env: Mapping[str, str]) -> float:
    """Run ``srun -N4 true`` to completion and return its wall time; raise if it fails."""
    argv = ["srun", f"-N{NODES}", "true"]
    start = time.perf_counter()
    proc = subprocess.run(
        argv,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return elapsed


def one_round(state_dir: Path, mode: Mode) -> Round:
    """Up, a 4-node job and down in ``state_dir``. Raises if anything fails or is left."""
    box = Sandbox(state_dir)
    try:
        start = time.perf_counter()
        lay = box.up(SandboxSpec(nodes=NODES, mode=mode))
        up_s = time.perf_counter() - start
        if lay.mode is not mode:
            raise RuntimeError(f"asked for {mode.value} mode, got {lay.mode.value}")
        job_s = run_job(client_env(box))
    finally:
        start = time.perf_counter()
        left = box.down()
        down_s = time.perf_counter() - start
    if left:
        raise RuntimeError(f"sandbox down in {state_dir} left {', '.join(left)}")
    return Round(mode, up_s, job_s, down_s)


def table(rounds: Sequence[Round], modes: Sequence[Mode]) -> str:
    """Median, min and max per phase and mode, in seconds."""
    rows = [
        "| mode | phase | median (s) | min (s) | max (s) |",
        "|---|---|---:|---:|---:|",
    ]
    for mode in modes:
        mine = [r for r in rounds if r.mode is mode]
        for i, phase in enumerate(PHASES):
            samples = [r.phases()[i] for r in mine]
            rows.append(
                f"| {mode.value} | {phase} | {statistics.median(samples):.2f} "
                f"| {min(samples):.2f} | {max(samples):.2f} |"
            )
    return "\n".join(rows)


def verdicts(rounds: Sequence[Round], modes: Sequence[Mode]) -> list[str]:
    """One line per mode and target: the median against it."""
    lines = []
    for mode in modes:
        mine = [r for r in rounds if r.mode is mode]
        up = statistics.median(r.up_s for r in mine)
        total = statistics.median(r.total_s for r in mine)
        for what, median, target in (
            (f"{mode.value}: {NODES} idle nodes", up, TARGET_UP_S),
            (f"{mode.value}: up + {NODES}-node job + down", total, TARGET_TOTAL_S),
        ):
            verdict = "meets" if median < target else "MISSES"
            lines.append(f"{what} median {median:.2f} s {verdict} the target of < {target:g} s")
    return lines


def command_version(argv: Sequence[str]) -> str:
    """The first line ``argv`` prints, or "unknown"."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=10, check=False, env=sbin_env()
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return lines[0] if lines else "unknown"


def machine() -> str:
    """CPUs, memory, OS, Python and the SLURM and munge versions."""
    try:
        system = platform.freedesktop_os_release()["PRETTY_NAME"]
    except (OSError, KeyError):
        system = f"{platform.system()} {platform.release()}"
    try:
        debian = Path("/etc/debian_version").read_text().strip()
        system = f"{system}, Debian {debian}"
    except OSError:
        pass
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    slurm = command_version(["slurmd", "-V"])
    munge = command_version(["munged", "--version"])
    return (
        f"{os.cpu_count()} CPUs, {pages / 2**30:.0f} GiB, {system}, kernel {platform.release()}, "
        f"Python {platform.python_version()}; {slurm}, {munge}"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per mode (5)")
    parser.add_argument(
        "--modes",
        default="netns,loopback",
        help="comma-separated modes to time, in order (netns,loopback)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the rounds' state folders go (a new temporary folder in it)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        args.modes = [Mode(name.strip()) for name in args.modes.split(",")]
    except ValueError:
        parser.error(f"--modes takes netns and loopback, not {args.modes!r}")
    if Mode.AUTO in args.modes:
        parser.error("--modes takes netns and loopback (auto picks one of them)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    modes: list[Mode] = args.modes
    try:
        check_prerequisites()
    except HpclaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="hpclaunch-bench-sandbox-", dir=args.dir) as tmp:
        for i in range(args.rounds):
            for mode in modes:
                result = one_round(Path(tmp) / f"{mode.value}-{i + 1}", mode)
                rounds.append(result)
                print(
                    f"round {i + 1} {mode.value}: up {result.up_s:.2f} s, "
                    f"job {result.job_s:.2f} s, down {result.down_s:.2f} s",
                    file=sys.stderr,
                )
    print(f"{machine()}; {args.rounds} rounds per mode, alternating\n")
    print(table(rounds, modes))
    print()
    for line in verdicts(rounds, modes):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
