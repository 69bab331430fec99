"""An accelerate training loop that stops at a step boundary when the job is being
stopped, saves with ``hpclaunch.checkpoint``, and resumes exactly where it stopped.

Launch it with ``hpclaunch sbatch`` instead of ``accelerate launch``; on CPU nodes the
agent sets ``ACCELERATE_USE_CPU=1``, so it is one world over gloo. What hpclaunch adds
to a plain accelerate loop is marked ``# hpclaunch``. Every batch is made from its
step, so a resumed run trains exactly the batches an uninterrupted one does; the model
has one weight tensor, so DDP's gradient buckets have one layout on every run and the
digest rank 0 prints at the end (``RESULT {...}``) is the uninterrupted run's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import torch
from accelerate import Accelerator

from hpclaunch import checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds to sleep per step")
    args = parser.parse_args()

    stop = checkpoint.Preemption.install()  # hpclaunch: SIGTERM/SIGUSR1/SIGUSR2 set a flag
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    start = 0
    resumed = checkpoint.load_latest()  # hpclaunch: None on a fresh start
    if resumed is not None:
        accelerator.unwrap_model(model).load_state_dict(resumed.state["model"])
        optimizer.load_state_dict(resumed.state["optimizer"])
        start = resumed.step + 1
    if accelerator.is_main_process:
        requeue = os.environ.get("HPCLAUNCH_REQUEUE_COUNT")
        print("START " + json.dumps({"step": start, "requeue": requeue}))
    for step in range(start, args.steps):
        data = torch.Generator().manual_seed(1000 * step + accelerator.process_index)
        x = torch.randn(16, 8, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), torch.sin(x.sum(1, keepdim=True)))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(args.step_time)
        stopping = stop.should_stop()  # hpclaunch: every rank, every step, the same answer
        if stopping or (step + 1) % args.checkpoint_every == 0:
            state = {
                "model": accelerator.unwrap_model(model).state_dict(),
                "optimizer": optimizer.state_dict(),
            }
            checkpoint.save(state, step)  # hpclaunch: committed atomically, rank 0 writes
        if stopping:
            break  # the job is requeued; the next run resumes after this step
    else:
        if accelerator.is_main_process:
            weight = accelerator.unwrap_model(model).weight.detach().double().numpy()
            print(
                "RESULT "
                + json.dumps(
                    {
                        "digest": hashlib.sha256(weight.tobytes()).hexdigest(),
                        "world_size": accelerator.num_processes,
                    }
                )
            )
    accelerator.wait_for_everyone()
    sys.stdout.flush()
    os._exit(0)  # gloo's teardown at interpreter exit can abort; everything is written


if __name__ == "__main__":
    main()
