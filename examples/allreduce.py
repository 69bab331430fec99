"""Every rank reports its rank, world size and node, and checks an all_reduce.

Run it through hpclaunch (or torchrun); it reads torchrun's environment. Exits
non-zero when the sum is wrong. ``--backend nccl`` reduces on the GPU of the
rank's LOCAL_RANK (gloo, on the CPU, by default). ``--fail-rank R`` makes rank R
raise, to see a failing job's root-cause report.
"""

import argparse
import json
import os
import socket
import sys

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fail-rank", type=int, default=None, help="this rank raises")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    args = parser.parse_args()
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == args.fail_rank:
        raise RuntimeError(f"rank {rank} fails on purpose (--fail-rank)")
    value = torch.tensor([float(rank)], device=device)
    dist.all_reduce(value)
    expected = world * (world - 1) / 2
    report = {
        "rank": rank,
        "world_size": world,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "group_rank": int(os.environ["GROUP_RANK"]),
        "node": socket.gethostname(),
        "sum": value.item(),
        "backend": dist.get_backend(),
        "device": str(value.device),
        "expected": expected,
        "job_id": os.environ.get("HPCLAUNCH_JOB_ID"),
        "requeue_count": os.environ.get("HPCLAUNCH_REQUEUE_COUNT"),
    }
    # One write per line: workers run unbuffered (python -u) and share the node's output.
    sys.stdout.write("ALLREDUCE " + json.dumps(report, sort_keys=True) + "\n")
    dist.destroy_process_group()
    if value.item() != expected:
        raise SystemExit(f"rank {rank}: sum {value.item()} != {expected}")


if __name__ == "__main__":
    main()
