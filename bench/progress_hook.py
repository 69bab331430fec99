"""The per-step cost of progress reporting (hpclaunch.progress): ``beat()`` alone, and an
SGD step with the optimizer-step hook installed against plain torch.

A benchmark, not a test. Each figure comes from child processes (the install is
process-global), ``--rounds`` of each kind, the kinds alternating:

- **hooked**: ``hpclaunch.progress.install(env)`` with ``HPCLAUNCH_PROGRESS_FILE`` in
  ``env`` pointing into node memory (/dev/shm, where the agent puts it), as in a worker.
  Then ``torch.nn.Linear(16, 16)`` with SGD, and ``--cycles`` cycles of three blocks of
  steps, in an order that rotates through all six: hpclaunch's hook attached (A),
  detached (B), and a hook that does nothing in its place (N, what torch's hook call
  costs by itself). ``install`` keeps no handle, so the benchmark takes its hook out of
  torch 2.13's table of global optimizer hooks and puts it back between blocks (the
  pre-hook that looks at the optimizer's state once is gone after the warm-up's first
  step: the benchmark checks that the pre-hook table is empty). Every
  load change on this shared machine then touches the three alike; the hook's cost is
  the median over the cycles of (A - B). Two kinds of block, interleaved: ``opt.step()``
  alone on fixed gradients, and a whole training step (zero_grad, forward, loss,
  backward, step). Times are the thread's CPU time, so that the time other processes
  hold the CPU is not counted. At the end it times ``beat()``, ``report(loss=x)`` and
  ``beat(loss=x)`` per call against a call of an empty function, and checks that the
  progress file counted every attached step and beat and holds the loss reported.
- **plain** (the anchor): torch alone, hpclaunch not imported while it steps, the same
  schedule of blocks with no hook in any: its (A - B) is what the method reads where
  there is nothing to find (the noise floor). Then ``beat()`` outside a job (no
  progress file: a no-op).

    .venv/bin/python bench/progress_hook.py [--rounds 3] [--cycles 48] [--block 2000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

TARGET_US = 5.0  # the bound on the hook's cost per step
KINDS = ("step", "train")


def _timed(loop: Callable[[int], None], count: int) -> float:
    """µs per iteration of ``loop(count)``, in this thread's CPU time: the time other
    processes of this shared machine hold the CPU is not counted (torch runs these
    small steps in the calling thread)."""
    start = time.thread_time_ns()
    loop(count)
    return (time.thread_time_ns() - start) / count / 1000


def child(kind: str, cycles: int, block: int, progress_file: str) -> dict[str, object]:
    """One process's block times and beat() figures (see the module)."""
    env = {"HPCLAUNCH_PROGRESS_FILE": progress_file}
    if kind == "hooked":
        from hpclaunch import progress

        progress.install(env)  # before torch, as the worker's boot does
    import torch
    from torch.optim import optimizer as torch_optimizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x, y = torch.randn(32, 16), torch.randn(32, 16)
    torch.nn.functional.mse_loss(model(x), y).backward()  # fixed grads for step-only blocks

    def step_loop(count: int) -> None:
        for _ in range(count):
            opt.step()

    def train_loop(count: int) -> None:
        for _ in range(count):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    loops = {"step": (step_loop, block), "train": (train_loop, block // 8)}
    table = torch_optimizer._global_optimizer_post_hooks  # torch 2.13's table
    hooks = dict(table)
    if kind == "hooked" and len(hooks) != 1:
        raise RuntimeError(f"expected hpclaunch's hook alone in torch's table, found {hooks}")

    def nothing(optimizer: object, args: object, kwargs: object) -> None:
        pass

    def attach(half: str) -> None:
        table.clear()
        if kind == "hooked" and half == "A":
            table.update(hooks)
        elif kind == "hooked" and half == "N":
            table.update({key: nothing for key in hooks})

    counted = 0
    for loop, count in loops.values():  # warm-up, attached
        loop(count)
        counted += count
    # The one look at the optimizer's state (a pre-hook) is gone after the first step.
    if torch_optimizer._global_optimizer_pre_hooks:
        raise RuntimeError("a global optimizer pre-hook is left after the first step")
    times: dict[str, dict[str, list[float]]] = {k: {h: [] for h in "ABN"} for k in KINDS}
    orders = list(itertools.permutations("ABN"))
    for cycle in range(cycles):
        for half in orders[cycle % len(orders)]:
            attach(half)
            for name, (loop, count) in loops.items():
                times[name][half].append(_timed(loop, count))
                counted += count if half == "A" and kind == "hooked" else 0
    attach("A")
    from hpclaunch import progress

    def noop() -> None:
        pass

    def beat_loop(count: int) -> None:
        for _ in range(count):
            progress.beat()

    def noop_loop(count: int) -> None:
        for _ in range(count):
            noop()

    def report_loop(count: int) -> None:
        for index in range(count):
            progress.report(loss=index * 1e-3)

    def beat_metric_loop(count: int) -> None:
        for index in range(count):
            progress.beat(loss=index * 1e-3)

    calls = block * 10
    beats, noops, reports, beat_metrics = [], [], [], []
    for _ in range(5):
        beats.append(_timed(beat_loop, calls))
        noops.append(_timed(noop_loop, calls))
        reports.append(_timed(report_loop, calls))
        beat_metrics.append(_timed(beat_metric_loop, calls))
    out: dict[str, object] = {
        "times": times,
        "beat": statistics.median(beats),
        "noop": statistics.median(noops),
        "report": statistics.median(reports),
        "beat_metric": statistics.median(beat_metrics),
    }
    if kind == "hooked":
        counted += 10 * calls
        metrics = progress.read_metrics(progress_file)
        if set(metrics) != {"loss"}:
            raise RuntimeError(f"the metrics file says {metrics}, not the loss reported")
        seen = progress.read(progress_file)
        if seen is None or seen.count != counted:
            raise RuntimeError(f"the progress file says {seen}, not {counted} steps")
        out["counted"] = counted
    return out


def run_child(kind: str, args: argparse.Namespace, folder: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCLAUNCH_")}
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            kind,
            "--cycles",
            str(args.cycles),
            "--block",
            str(args.block),
            "--progress-file",
            str(folder / f"{kind}.progress"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{kind} child exited {done.returncode}: {done.stderr[-2000:]}")
    result: dict[str, object] = json.loads(done.stdout)
    return result


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=48)
    parser.add_argument("--block", type=int, default=2000)
    parser.add_argument("--child", choices=["plain", "hooked"], help=argparse.SUPPRESS)
    parser.add_argument("--progress-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.cycles, args.block, args.progress_file)))
        return 0
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    results: dict[str, list[dict[str, object]]] = {"plain": [], "hooked": []}
    before = load()
    with tempfile.TemporaryDirectory(prefix="hpclaunch-bench-", dir=base) as tmp:
        for index in range(args.rounds):
            for kind in ("plain", "hooked") if index % 2 == 0 else ("hooked", "plain"):
                results[kind].append(run_child(kind, args, Path(tmp)))
    report(args, results, f"load average (1 min): {before} before, {load()} after")
    return 0


def report(
    args: argparse.Namespace, results: dict[str, list[dict[str, object]]], load_line: str
) -> None:
    def blocks(kind: str, name: str, half: str) -> list[float]:
        """Every block time of ``kind``'s processes, pooled."""
        return [t for r in results[kind] for t in r["times"][name][half]]  # type: ignore[index]

    def diffs(kind: str, name: str, half: str = "A") -> list[float]:
        """(``half`` - B) of every cycle, pooled over ``kind``'s processes."""
        return [
            a - b
            for r in results[kind]
            for a, b in zip(r["times"][name][half], r["times"][name]["B"], strict=True)  # type: ignore[index]
        ]

    def scalar(kind: str, what: str) -> list[float]:
        return [float(r[what]) for r in results[kind]]  # type: ignore[arg-type]

    print(
        f"torch.nn.Linear(16, 16) + SGD, torch.set_num_threads(1), thread CPU time; "
        f"{args.rounds} hooked and {args.rounds} plain processes, alternating; in each, "
        f"{args.cycles} cycles of 3 blocks (A B N, in rotating order) of {args.block} "
        f"opt.step() and of {args.block // 8} training steps; {os.cpu_count()} CPUs\n"
    )
    print("| measure (µs per step or call) | median | p25 | p75 |")
    print("|---|---:|---:|---:|")

    def row(label: str, data: list[float]) -> None:
        q1, _, q3 = statistics.quantiles(data, n=4) if len(data) > 1 else data * 3
        print(f"| {label} | {statistics.median(data):.2f} | {q1:.2f} | {q3:.2f} |")

    verdicts = []
    for name, label in (("step", "opt.step()"), ("train", "training step")):
        row(
            f"{label}, plain torch (anchor)",
            blocks("plain", name, "A") + blocks("plain", name, "B"),
        )
        row(f"{label}, hook detached", blocks("hooked", name, "B"))
        row(f"{label}, hook attached", blocks("hooked", name, "A"))
        cost = diffs("hooked", name)
        row(f"{label}: hook's cost (attached - detached, per cycle)", cost)
        row(f"{label}: a hook doing nothing (N - detached)", diffs("hooked", name, "N"))
        row(f"{label}: A - B in plain torch (noise floor)", diffs("plain", name))
        median = statistics.median(cost)
        verdicts.append(
            f"{label}: the hook costs {median:.2f} µs per step, median of "
            f"{len(cost)} cycles ({'meets' if median < TARGET_US else 'misses'} "
            f"the target of < {TARGET_US:g} µs)"
        )
    beat, noop = scalar("hooked", "beat"), scalar("hooked", "noop")
    row("beat(), progress file open", beat)
    row(
        "beat(), progress file open, less an empty call",
        [b - n for b, n in zip(beat, noop, strict=True)],
    )
    row(
        "report(loss=x), progress file open (metrics written at most 1/s)",
        scalar("hooked", "report"),
    )
    row("beat(loss=x), progress file open", scalar("hooked", "beat_metric"))
    row("beat(), outside a job (no progress file)", scalar("plain", "beat"))
    row("report(loss=x), outside a job", scalar("plain", "report"))
    row("a call of an empty function (reference)", noop)
    print()
    for line in verdicts:
        print(line)
    counted = scalar("hooked", "counted")
    print(
        f"each hooked process's progress file counted every attached step and beat "
        f"({min(counted):.0f} to {max(counted):.0f})"
    )
    print(load_line)


if __name__ == "__main__":
    sys.exit(main())
