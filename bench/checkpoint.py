"""Sharded checkpoints: how long a save blocks training (blocking against asynchronous),
the write throughput against `dd`, and restart-to-training with and without the
node-local tier.

A benchmark, not a test. 2 ranks started by `torchrun --standalone` (gloo, CPU) train an
FSDP2 model (`fully_shard` over a CPU mesh, square Linear layers) with Adam: parameters
and moments are DTensors sharded over the ranks, --size-mib in all (default 1 GiB). One
uncounted round warms the caches; then each of --runs rounds (default 3) times:

- dd: `dd if=/dev/zero bs=1M conv=fsync` of the checkpoint's size into --dir (buffered
  writes and an fsync, as torch's writer with sync_files=True), by one writer, then by
  two at once (one per rank, half each: the save's pattern);
- a blocking `checkpoint.save(state, step)`, from the call to its return (its manifest
  included);
- the manifest's part of it: each rank's CRC-32 of the files it wrote, the page cache
  still warm as the save leaves it; and its check at load: each rank its share of the
  files, the cache dropped, as `load_latest` reads them before it trusts them (its
  restart figures below include that check);
- `save(..., asynchronous=True)`: until it returns (staging), and until `wait()`,
  called at once, returns (committed);
- restart from the shared folder: the state zeroed in place (as a fresh process's),
  then `load_latest(into=state)`, `set_state_dict` and one training step, each timed;
  the loaded state is checked against a digest taken before the save;
- a blocking save with local_copy=True, then the same restart from the node-local
  copies (HPCLAUNCH_LOCAL_CHECKPOINT_DIR: a folder under /dev/shm).

Each figure is the slowest rank's. Before every timed write and load, rank 0 runs
`sync` and `echo 3 > /proc/sys/vm/drop_caches` (root only), so that loads read the
disk. Everything written is removed at the end. Prints medians and the targets' ratios.

    PYTHONPATH=$PWD .venv/bin/python bench/checkpoint.py [--size-mib 1024] [--runs 3]
        [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

LAYERS = 4
COPIES = 3  # Adam: the parameter and its two moments, all float32
LOCAL_READ = "read from the node-local copies"  # load_latest says so on rank 0's stderr
PARTS = ("load_latest", "set_state_dict", "training step", "to training (all three)")


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_leaves

    from hpclaunch import checkpoint
    from hpclaunch.checkpoint import local, manifest, store
    from hpclaunch.checkpoint.group import Ranks

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    width = math.ceil(math.sqrt(args.size_mib * 2**20 / (COPIES * 4 * LAYERS)) / 64) * 64
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(LAYERS)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = torch.randn(8, width, generator=torch.Generator().manual_seed(1))
    out = Path(args.out)
    folder, dropped = out / "checkpoints", True

    def train_step() -> None:
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    def state() -> dict[str, dict[str, object]]:
        model_state, optim_state = get_state_dict(model, optimizer)
        return {"model": model_state, "optimizer": optim_state}

    def tensors(tree: object) -> list[torch.Tensor]:
        leaves = [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]
        return [t.to_local() if isinstance(t, DTensor) else t for t in leaves]

    def reduce(value: float, op: dist.ReduceOp.RedOpType = dist.ReduceOp.MAX) -> float:
        box = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(box, op=op)
        return box.item()

    def digest() -> float:
        return reduce(sum(t.double().sum().item() for t in tensors(state())), dist.ReduceOp.SUM)

    def settle() -> None:
        nonlocal dropped
        dist.barrier()
        if rank == 0:
            os.sync()
            try:
                Path("/proc/sys/vm/drop_caches").write_text("3\n")
            except OSError:
                dropped = False
        dist.barrier()

    def clock(action: Callable[[], object]) -> float:
        settle()
        start = time.monotonic()
        action()
        return reduce(time.monotonic() - start)

    def manifest_costs(step: int) -> tuple[float, float]:
        """(sums at save, warm cache; check at load, cold cache), the slowest rank's."""
        path = store.path_for(folder, step, sharded=True)
        written = manifest.read(manifest.location(path))
        if written is None:
            raise RuntimeError(f"{path} has no manifest")
        mine = [f for f in written.files if f.startswith(f"__{rank}_")]
        mine += [".metadata"] if rank == 0 else []  # rank 0 sums DCP's metadata
        dist.barrier()
        start = time.monotonic()
        manifest.sums(path, mine)
        at_save = reduce(time.monotonic() - start)
        share = manifest.share_of(written, rank, world)
        return at_save, clock(lambda: manifest.check_sums(written, path, share))

    def dd(writers: int) -> float:
        target = out / f"dd-{rank}.bin"
        count = math.ceil(size / 2**20 / writers)
        command = ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={count}", "conv=fsync"]
        seconds = clock(
            lambda: rank < writers and subprocess.run(command, capture_output=True, check=True)
        )
        target.unlink(missing_ok=True)
        return seconds

    def restart(step: int, expected: float, from_local: bool) -> list[float]:
        """[load_latest, set_state_dict, training step, all three], into a zeroed state."""
        into = state()
        with torch.no_grad():
            for tensor in tensors(into):
                tensor.zero_()
        settle()
        if local.available(step, Ranks.now()) != from_local:
            raise RuntimeError(f"node-local copies of step {step}: expected {from_local}")
        dist.barrier()
        start = time.monotonic()
        loaded = checkpoint.load_latest(folder, into=into)
        loading = time.monotonic() - start
        set_state_dict(
            model, optimizer, model_state_dict=into["model"], optim_state_dict=into["optimizer"]
        )
        setting = time.monotonic() - start - loading
        if loaded is None or loaded.step != step or digest() != expected:
            raise RuntimeError(f"step {step} did not load as saved (got {loaded})")
        dist.barrier()
        start = time.monotonic()
        train_step()
        first = reduce(time.monotonic() - start)
        return [reduce(loading), reduce(setting), first, reduce(loading + setting) + first]

    train_step()  # Adam's moments exist from the first step on
    size = sum(t.numel() * t.element_size() for t in tensors(state())) * world
    samples: dict[str, list[float]] = {}
    cold_blocked = 0.0
    for run in range(-1, args.runs):
        step = 3 * (run + 1)
        found = {"dd conv=fsync, 1 writer": dd(1), "dd conv=fsync, 2 writers at once": dd(2)}
        found["blocking save"] = clock(lambda s=step: checkpoint.save(state(), s, folder=folder))
        at_save, at_load = manifest_costs(step)
        found["manifest: sums at save (of the blocking save)"] = at_save
        found["manifest: check at load (cache dropped)"] = at_load
        train_step()
        expected = digest()
        settle()
        start = time.monotonic()
        checkpoint.save(state(), step + 1, folder=folder, asynchronous=True)
        found["async save: blocked"] = reduce(time.monotonic() - start)
        checkpoint.wait()
        found["async save: committed"] = reduce(time.monotonic() - start)
        cold_blocked = cold_blocked or found["async save: blocked"]
        shared = restart(step + 1, expected, from_local=False)
        expected = digest()
        found["blocking save + local copy"] = clock(
            lambda s=step: checkpoint.save(state(), s + 2, folder=folder, local_copy=True)
        )
        node = restart(step + 2, expected, from_local=True)
        for where, times in (("shared folder", shared), ("node-local", node)):
            for part, value in zip(PARTS, times, strict=True):
                found[f"restart, {where}: {part}"] = value
        for key, value in found.items():
            if run >= 0:
                samples.setdefault(key, []).append(value)
    rss_mib = reduce(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if rank == 0:
        results = {
            "samples": samples,
            "state_bytes": size,
            "width": width,
            "dropped": dropped,
            "checkpoint_bytes": store.size_of(store.path_for(folder, step + 2, sharded=True)),
            "local_bytes": store.size_of(Path(os.environ[local.ENV_VAR])),
            "cold_blocked": cold_blocked,
            "rss_mib": rss_mib,
        }
        (out / "results.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="the state, all ranks")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="a folder on disk")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    find = ["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", str(args.dir)]
    mount = subprocess.check_output(find, text=True).split()
    if mount[0] in ("tmpfs", "ramfs"):
        parser.error(f"--dir {args.dir} is on {mount[0]}, in memory: give a folder on a disk")
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="hpclaunch-bench-checkpoint-", dir=args.dir))
    shm = Path(tempfile.mkdtemp(prefix="hpclaunch-bench-checkpoint-", dir="/dev/shm"))
    path = [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    env = dict(
        os.environ,
        HPCLAUNCH_LOCAL_CHECKPOINT_DIR=str(shm),
        HPCLAUNCH_JOB_DIR=str(work),
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, path)),
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        __file__,
        "--worker",
        "--out",
        str(work),
        "--size-mib",
        str(args.size_mib),
        "--runs",
        str(args.runs),
    ]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            print(stdout[-3000:], stderr[-6000:], sep="\n", file=sys.stderr)
            return 1
        results = json.loads((work / "results.json").read_text())
        records = [json.loads(line) for line in (work / "checkpoint-saves.jsonl").open()]
    finally:
        if proc.poll() is None:  # SIGTERM: torchrun passes it on to its workers
            proc.terminate()
            proc.communicate(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    print(
        f"2 ranks (torchrun --standalone, gloo, CPU), {os.cpu_count()} CPUs; {args.dir} on "
        f"{' '.join(mount)}; {args.runs} runs after 1 warm-up"
    )
    report(args, results, records, stderr.count(LOCAL_READ))
    print(f"load average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    return 0


def report(args: argparse.Namespace, results: dict, records: list[dict], local_reads: int) -> None:
    samples: dict[str, list[float]] = results["samples"]
    mb, width = results["checkpoint_bytes"] / 1e6, results["width"]
    print(
        f"FSDP2 {LAYERS} x Linear({width}, {width}) + Adam: state "
        f"{results['state_bytes'] / 2**30:.2f} GiB, checkpoint {mb:.0f} MB\n"
    )
    print("| measure | median (s) | min (s) | max (s) |\n|---|---:|---:|---:|")
    for key, values in samples.items():
        cells = [f"{v:.3f}" for v in (statistics.median(values), min(values), max(values))]
        print(f"| {key} | {' | '.join(cells)} |")
    med = {key: statistics.median(values) for key, values in samples.items()}
    blocked = med["async save: blocked"] / med["blocking save"]
    print(
        f"\nasync save blocks {blocked:.1%} of the blocking save (target <= 10 %: "
        f"{'met' if blocked <= 0.10 else 'missed'}); the job's first async save (warm-up "
        f"round: staging buffers allocated) blocked {results['cold_blocked']:.3f} s"
    )
    sums = med["manifest: sums at save (of the blocking save)"]
    print(
        f"manifest (CRC-32 of every file): {sums:.3f} s of the blocking save's "
        f"{med['blocking save']:.3f} s ({sums / med['blocking save']:.1%}), "
        f"{mb / sums:.0f} MB/s, the ranks summing at once; its check at load "
        f"{med['manifest: check at load (cache dropped)']:.3f} s"
    )
    save = mb / med["blocking save"]
    for writers in ("1 writer", "2 writers at once"):
        dd = mb / med[f"dd conv=fsync, {writers}"]
        print(
            f"blocking save writes {save:.0f} MB/s; dd conv=fsync, {writers}: {dd:.0f} MB/s; "
            f"{save / dd:.0%} (target >= 70 %: {'met' if save >= 0.7 * dd else 'missed'})"
        )
    for part in PARTS[::3]:
        node, shared = med[f"restart, node-local: {part}"], med[f"restart, shared folder: {part}"]
        print(
            f"restart, {part}: node-local {node:.2f} s, shared {shared:.2f} s, {node / shared:.2f}x"
        )
    blocking = [r for r in records if not r["asynchronous"]]

    def median(key: str, rest: int) -> float:  # rest 0: plain saves, 2: with local copy
        return statistics.median(r[key] for r in blocking if r["step"] % 3 == rest)

    print(
        f"page cache dropped before each write and load: {'yes' if results['dropped'] else 'NO'}"
        f"; loads from the node-local copies: {local_reads} of {args.runs + 1} expected\n"
        "hpclaunch's record (checkpoint-saves.jsonl), medians of the blocking saves: blocked_s "
        f"{median('blocked_s', 0):.3f}, total_s {median('total_s', 0):.3f}; with local copy "
        f"blocked_s {median('blocked_s', 2):.3f}, total_s {median('total_s', 2):.3f}\n"
        f"peak RSS per rank {results['rss_mib']:.0f} "
        f"MiB; node-local tier at the end {results['local_bytes'] / 2**20:.0f} MiB in /dev/shm"
    )


if __name__ == "__main__":
    sys.exit(main())
