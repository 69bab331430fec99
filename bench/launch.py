"""Launch, recovery and memory on the SLURM sandbox: `hpclaunch agent` against `torchrun`.

A benchmark, not a test. It starts its own sandbox and, alternating between the
launchers on the same nodes with the same probe script, runs srun steps of:

- **launch**: from just before srun starts to the moment the last rank is past
  `init_process_group` (each rank writes its wall clock to a file). While the ranks
  then wait, the benchmark reads the proportional set size (PSS, from
  /proc/PID/smaps_rollup) of every launcher process of each node: the agent, and for
  hpclaunch its zygote; and of the workers.
- **recovery**: all ranks initialise, then the last rank dies (`os._exit(1)`) after
  writing its clock; measured from that clock to the moment every rank of the restarted
  group is past `init_process_group` again.

Launchers: `hpclaunch agent` (warm workers, the default), `hpclaunch agent
--worker-start fresh` (a new interpreter per worker, as torchrun) and `torchrun` with
c10d rendezvous on the first node. torchrun gets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
for its restart: with the shared store its restarted workers sometimes hang (see
docs/benchmarks.md). One uncounted round warms the caches. Prints medians and ratios.

    .venv/bin/python bench/launch.py [--runs 7] [--nodes 2] [--nproc-per-node 2]
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

from hpclaunch import procs
from hpclaunch.sandbox.cluster import Sandbox
from hpclaunch.sandbox.conf import Mode, SandboxSpec
from hpclaunch.sandbox.daemons import SBIN_PATH

PROBE = """
import os, sys, time, pathlib
out, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
import torch.distributed as dist
dist.init_process_group("gloo")
# torchrun's restart count is per node; the crash file says job-wide that this is a restart.
attempt = 1 if (out / "crash").exists() else 0
rank, world = dist.get_rank(), dist.get_world_size()
(out / f"init-{attempt}-{rank}").write_text(repr(time.time()))
dist.barrier()
if mode == "crash" and attempt == 0:
    if rank == world - 1:
        (out / "crash").write_text(repr(time.time()))
        os._exit(1)
    time.sleep(600)  # until the agent stops it for the restart
if mode == "hold":
    (out / f"ready-{rank}").write_text("")
    while not (out / "release").exists():
        time.sleep(0.02)
dist.destroy_process_group()
"""


def pss_kib(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def launchers() -> list[int]:
    """The pids of the running launchers (one per node)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        names = [Path(a.decode(errors="replace")).name for a in argv[:2]]
        if "torchrun" in names or ("hpclaunch" in names and b"agent" in argv[1:3]):
            found.append(int(entry.name))
    return found


def memory(world: int, out: Path) -> tuple[float, float]:
    """(launcher side, workers) PSS in MiB per node, once every rank is ready."""
    deadline = time.monotonic() + 60
    while len(list(out.glob("ready-*"))) < world:
        if time.monotonic() > deadline:
            raise RuntimeError(f"ranks not ready in {out}")
        time.sleep(0.02)
    table = procs.parents()
    agents = [pid for pid in launchers() if table.get(pid) not in launchers()]
    side = workers = 0
    for agent in agents:
        below = procs.descendants(agent, table)
        parents_below = {table[p] for p in below}
        # hpclaunch's zygote: a child of the agent with children of its own.
        zygotes = [p for p in below if table[p] == agent and p in parents_below]
        side += pss_kib(agent) + sum(pss_kib(z) for z in zygotes)
        workers += sum(pss_kib(p) for p in below if p not in zygotes)
    (out / "release").write_text("")
    return side / len(agents) / 1024, workers / len(agents) / 1024


def one_run(
    command: list[str], env: dict[str, str], out: Path, world: int, mode: str
) -> tuple[float, float, float]:
    """(seconds, launcher MiB, workers MiB): launch time in "hold" mode, recovery in "crash"."""
    out.mkdir()
    start = time.time()
    proc = subprocess.Popen(
        [*command, str(out), mode],
        env=env,
        cwd=out,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    side = workers = 0.0
    try:
        if mode == "hold":
            side, workers = memory(world, out)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"{command[:6]} exited {proc.returncode}: {err.decode()[-2000:]}")
    attempt = 1 if mode == "crash" else 0
    stamps = [float(p.read_text()) for p in out.glob(f"init-{attempt}-*")]
    if len(stamps) != world:
        raise RuntimeError(f"{len(stamps)} of {world} ranks reported in {out}")
    since = float((out / "crash").read_text()) if mode == "crash" else start
    return max(stamps) - since, side, workers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
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
        agent = [*srun, "hpclaunch", "agent", "--nproc-per-node", nproc, "--max-restarts", "1"]
        commands = {
            "hpclaunch agent": [*agent, str(probe)],
            "hpclaunch agent --worker-start fresh": [*agent, "--worker-start", "fresh", str(probe)],
            "torchrun (c10d)": [
                *srun,
                "env",
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
                "torchrun",
                "--nnodes",
                str(args.nodes),
                "--nproc-per-node",
                nproc,
                "--max-restarts",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"{first}:29400",
                "--rdzv-id",
                "bench",
                str(probe),
            ],
        }
        world = args.nodes * args.nproc_per_node
        samples: dict[tuple[str, str], list[float]] = {}
        try:
            for run in range(-1, args.runs):  # run -1 warms caches and is not counted
                for index, (name, command) in enumerate(commands.items()):
                    for mode in ("hold", "crash"):
                        out = work / f"{index}-{mode}-{run}"
                        seconds, side, workers = one_run(command, env, out, world, mode)
                        if run < 0:
                            continue
                        samples.setdefault((name, mode), []).append(seconds)
                        if mode == "hold":
                            samples.setdefault((name, "side"), []).append(side)
                            samples.setdefault((name, "workers"), []).append(workers)
        finally:
            left = box.down()
            if left:
                print(f"sandbox down left {left}", file=sys.stderr)
    report(args, lay.mode.value, samples)
    return 0


def report(
    args: argparse.Namespace, mode: str, samples: dict[tuple[str, str], list[float]]
) -> None:
    print(
        f"{args.nodes} nodes x {args.nproc_per_node} workers, gloo, {mode} sandbox, "
        f"{args.runs} runs each, alternating; {os.cpu_count()} CPUs\n"
    )
    names = list(dict.fromkeys(name for name, _ in samples))
    rows = [
        ("hold", "launch → all ranks initialised (s)", "{:.2f}"),
        ("crash", "worker crash → all ranks initialised again (s)", "{:.2f}"),
        ("side", "launcher PSS per node (MiB)", "{:.0f}"),
        ("workers", "workers PSS per node (MiB)", "{:.0f}"),
    ]
    print("| measure | launcher | median | min | max | ratio to torchrun |")
    print("|---|---|---:|---:|---:|---:|")
    base = "torchrun (c10d)"
    for key, label, fmt in rows:
        for name in names:
            values = samples[(name, key)]
            median = statistics.median(values)
            ratio = median / statistics.median(samples[(base, key)])
            cells = [fmt.format(v) for v in (median, min(values), max(values))]
            print(f"| {label} | {name} | {' | '.join(cells)} | {ratio:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
