"""A smallest distributed job: every rank joins, sums its rank, and reports.

Run it through hpclaunch (or torchrun); it reads torchrun's environment.
"""

import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1, help="all_reduce rounds to run")
    steps = parser.parse_args().steps
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else None
    total = torch.zeros(1, device=device)
    for _ in range(steps):
        value = torch.tensor([float(rank)], device=device)
        dist.all_reduce(value)
        total += value
    expected = steps * world * (world - 1) / 2
    print(
        f"rank {rank}/{world} on {os.uname().nodename}: sum {total.item():g}, expected {expected:g}"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
