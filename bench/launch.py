"""Launch latency on the SLURM sandbox: `hpclaunch agent` against `torchrun`.

A benchmark, not a test. For each run it starts one srun step on the same
sandbox nodes with the same script, either through `hpclaunch agent` or through
`torchrun` (c10d rendezvous on the first node), and measures the time from just
before srun starts to the moment the last rank is past `init_process_group`
(each rank writes its wall clock to a file). The two launchers alternate so
that the machine's load touches both alike; one uncounted round warms the
caches first. Prints medians and the ratio.

    .venv/bin/python bench/launch.py [--runs 5] [--nodes 2] [--nproc-per-node 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpclaunch.sandbox.cluster import Sandbox
from hpclaunch.sandbox.conf import Mode, SandboxSpec
from hpclaunch.sandbox.daemons import SBIN_PATH

PROBE = """
import os, sys, time, pathlib
import torch.distributed as dist
dist.init_process_group("gloo")
pathlib.Path(sys.argv[1], f"rank-{dist.get_rank()}").write_text(repr(time.time()))
dist.barrier()
dist.destroy_process_group()
"""


def one_run(command: list[str], env: dict[str, str], out: Path, world: int) -> float:
    out.mkdir()
    start = time.time()
    subprocess.run([*command, str(out)], env=env, cwd=out, check=True, capture_output=True)
    stamps = [float(p.read_text()) for p in out.glob("rank-*")]
    if len(stamps) != world:
        raise RuntimeError(f"{len(stamps)} of {world} ranks reported in {out}")
    return max(stamps) - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="hpclaunch-bench-") as tmp:
        work = Path(tmp)
        probe = work / "probe.py"
        probe.write_text(PROBE)
        box = Sandbox(work / "sandbox")
        lay = box.up(SandboxSpec(nodes=args.nodes, mode=Mode.AUTO))
        env = dict(os.environ)
        # As installed by pip, both launchers' modules have bytecode; an editable
        # checkout under PYTHONDONTWRITEBYTECODE would recompile hpclaunch every run.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}:{SBIN_PATH}"
        env.update(box.env())
        first = lay.nodes[0].name
        nproc = str(args.nproc_per_node)
        srun = ["srun", f"-N{args.nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
        commands = {
            "hpclaunch agent": [*srun, "hpclaunch", "agent", "--nproc-per-node", nproc, str(probe)],
            "torchrun (c10d)": [
                *srun, "torchrun", "--nnodes", str(args.nodes), "--nproc-per-node", nproc,
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{first}:29400",
                "--rdzv-id", "bench", str(probe),
            ],
        }  # fmt: skip
        world = args.nodes * args.nproc_per_node
        times: dict[str, list[float]] = {name: [] for name in commands}
        try:
            for run in range(-1, args.runs):  # run -1 warms caches and is not counted
                for name, command in commands.items():
                    out = work / f"{list(commands).index(name)}-{run}"
                    elapsed = one_run(command, env, out, world)
                    if run >= 0:
                        times[name].append(elapsed)
        finally:
            left = box.down()
            if left:
                print(f"sandbox down left {left}", file=sys.stderr)
    print(
        f"{args.nodes} nodes x {args.nproc_per_node} workers, gloo, {lay.mode.value} sandbox, "
        f"{args.runs} runs each, alternating; {os.cpu_count()} CPUs\n"
    )
    print("| launcher | median (s) | min (s) | max (s) |\n|---|---:|---:|---:|")
    for name, samples in times.items():
        median, low, high = statistics.median(samples), min(samples), max(samples)
        print(f"| {name} | {median:.2f} | {low:.2f} | {high:.2f} |")
    ratio = statistics.median(times["hpclaunch agent"]) / statistics.median(
        times["torchrun (c10d)"]
    )
    print(f"\nratio hpclaunch / torchrun (medians): {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
