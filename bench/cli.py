"""Start-up time of ``hpclaunch sbatch --dry-run``, measured as a fresh process, side by
side with the anchor ``python -c "import click, jinja2"`` (the CLI's two dependencies).

A benchmark, not a test: it times what a user waits for on a login node, the
commands taking turns run by run so that a change in the machine's load touches
each alike, and prints a markdown table and the ratio of the medians. It runs the
command once more as ``python -m hpclaunch`` to list the modules it has loaded when
it exits: torch must not be among them; the hpclaunch modules are printed. Results
and the targets are kept in docs/benchmarks.md.

    .venv/bin/python bench/cli.py [--runs 20] [--venv .venv]
"""

from __future__ import annotations

import argparse
import math
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

WARMUP_RUNS = 2
TARGET_S = 0.25
# sbatch --dry-run's median against the anchor's: what hpclaunch adds to the imports it
# cannot avoid (the interpreter, click and Jinja2).
TARGET_RATIO = 1.3
SBATCH_ARGS = (
    "sbatch",
    "--dry-run",
    "--nodes",
    "32",
    "--gpus-per-node",
    "8",
    "train.py",
    "--lr",
    "3e-4",
)
HEAVY_MODULES = ("torch",)
ANCHOR = 'python -c "import click, jinja2"'


@dataclass(frozen=True)
class Timing:
    """Wall times of one command, in seconds."""

    label: str
    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def minimum(self) -> float:
        return min(self.samples)

    @property
    def p90(self) -> float:
        """The nearest-rank 90th percentile."""
        ordered = sorted(self.samples)
        return ordered[math.ceil(0.9 * len(ordered)) - 1]


def run_once(argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> float:
    """Run ``argv`` to completion and return its wall time; raise if it fails."""
    start = time.perf_counter()
    proc = subprocess.run(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode(errors='replace')}"
        )
    return elapsed


def measure(
    commands: Mapping[str, Sequence[str]], runs: int, cwd: Path, env: Mapping[str, str]
) -> list[Timing]:
    """Time ``runs`` fresh processes of each command (label -> argv) after the warm-up
    runs, the commands taking turns: round r runs each command once."""
    for _ in range(WARMUP_RUNS):
        for argv in commands.values():
            run_once(argv, cwd, env)
    samples: dict[str, list[float]] = {label: [] for label in commands}
    for _ in range(runs):
        for label, argv in commands.items():
            samples[label].append(run_once(argv, cwd, env))
    return [Timing(label, tuple(times)) for label, times in samples.items()]


# python -m hpclaunch ARGS, then the names in sys.modules as the process exits, one a
# line, into the file named by the first argument. (-X importtime would miss what is
# imported through importlib, as the CLI loads its commands.)
_RUN_AND_LIST = """
import atexit, pathlib, runpy, sys
out = pathlib.Path(sys.argv.pop(1))
atexit.register(lambda: out.write_text("\\n".join(sorted(sys.modules))))
sys.argv[0] = "hpclaunch"
runpy.run_module("hpclaunch", run_name="__main__", alter_sys=True)
"""


def imported_modules(python: Path, cwd: Path, env: Mapping[str, str]) -> list[str]:
    """The modules ``python -m hpclaunch sbatch ...`` has loaded when it exits."""
    listed = cwd / "modules.txt"
    proc = subprocess.run(
        [str(python), "-c", _RUN_AND_LIST, str(listed), *SBATCH_ARGS],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"python -m hpclaunch exited {proc.returncode}: {proc.stderr}")
    if "#SBATCH --nodes=32" not in proc.stdout:
        raise RuntimeError("python -m hpclaunch did not print the expected script")
    modules = listed.read_text().split()
    if "hpclaunch.cli.sbatch" not in modules:  # the check below would pass for the wrong reason
        raise RuntimeError("hpclaunch.cli.sbatch is not among the modules; cannot check imports")
    return modules


def heavy_imports(modules: Sequence[str]) -> list[str]:
    """The modules among ``modules`` that belong to a heavy package."""
    return [
        name
        for name in modules
        if any(name == heavy or name.startswith(heavy + ".") for heavy in HEAVY_MODULES)
    ]


def table(timings: Sequence[Timing]) -> str:
    """A markdown table of the timings, in milliseconds."""
    rows = [
        "| command | median (ms) | min (ms) | p90 (ms) |",
        "|---|---:|---:|---:|",
    ]
    rows += [
        f"| {t.label} | {t.median * 1000:.0f} | {t.minimum * 1000:.0f} | {t.p90 * 1000:.0f} |"
        for t in timings
    ]
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    default_venv = Path(__file__).resolve().parent.parent / ".venv"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=20, help="timed runs per command (20)")
    parser.add_argument(
        "--venv", type=Path, default=default_venv, help="the virtual environment to time"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bindir = args.venv.resolve() / "bin"
    python, console = bindir / "python", bindir / "hpclaunch"
    for path in (python, console):
        if not path.exists():
            print(f"error: {path} does not exist; create the venv first", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="hpclaunch-bench-") as tmp:
        work = Path(tmp)
        (work / "train.py").write_text("print('training')\n", encoding="utf-8")
        # An empty config home: no user profile changes what is measured.
        (work / "config").mkdir()
        env = {**os.environ, "XDG_CONFIG_HOME": str(work / "config")}
        # Users' installs keep compiled bytecode; without it every run would
        # compile hpclaunch again and the figures would say nothing about them.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        command = "hpclaunch " + " ".join(SBATCH_ARGS)
        commands = {
            command: [str(console), *SBATCH_ARGS],
            ANCHOR: [str(python), "-c", "import click, jinja2"],
            "python -c pass": [str(python), "-c", "pass"],
        }
        load_before = os.getloadavg()[0]
        timings = measure(commands, args.runs, work, env)
        load_after = os.getloadavg()[0]
        modules = imported_modules(python, work, env)
    heavy = heavy_imports(modules)
    version = subprocess.run(
        [str(python), "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        system = platform.freedesktop_os_release()["PRETTY_NAME"]
    except (OSError, KeyError):
        system = f"{platform.system()} {platform.release()}"
    print(
        f"Python {version}, {system}, {os.cpu_count()} CPUs; {args.runs} runs per command "
        f"after {WARMUP_RUNS} warm-up runs, taking turns; load average (1 min) "
        f"{load_before:.2f} before, {load_after:.2f} after\n"
    )
    print(table(timings))
    print()
    median, anchor = timings[0].median, timings[1].median
    verdict = "meets" if median < TARGET_S else "MISSES"
    print(f"hpclaunch sbatch median {median:.3f} s {verdict} the target of < {TARGET_S} s")
    ratio = median / anchor
    verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
    print(
        f"hpclaunch sbatch / {ANCHOR}: {median * 1000:.0f} / {anchor * 1000:.0f} ms = "
        f"{ratio:.2f}x, {verdict} the target of <= {TARGET_RATIO}x"
    )
    own = [name for name in modules if name == "hpclaunch" or name.startswith("hpclaunch.")]
    print(
        f"python -m hpclaunch sbatch ...: {len(modules)} modules loaded, "
        + (f"heavy ones: {', '.join(heavy[:5])}" if heavy else "torch not among them")
    )
    print(f"hpclaunch's own ({len(own)}): {' '.join(own)}")
    return 1 if heavy else 0


if __name__ == "__main__":
    sys.exit(main())
