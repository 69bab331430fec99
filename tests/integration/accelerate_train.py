"""A plain accelerate loop as its documentation writes one (Accelerator(), prepare,
backward, step), on CPU nodes. Each rank trains on data of its own; in one world the
gradients are averaged, so every rank ends with the same weights. Each rank writes what
accelerate made of the job, and a digest of its weights, to FOLDER/rank-R.json."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

accelerator = Accelerator()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = accelerator.prepare(model, optimizer)
data = torch.Generator().manual_seed(100 + int(os.environ["RANK"]))
for _ in range(5):
    x = torch.randn(16, 8, generator=data)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
sha = hashlib.sha256()
for _name, value in sorted(accelerator.unwrap_model(model).state_dict().items()):
    sha.update(value.detach().double().numpy().tobytes())
seen = {
    "num_processes": accelerator.num_processes,
    "process_index": accelerator.process_index,
    "distributed_type": str(accelerator.distributed_type),
    "digest": sha.hexdigest(),
}
Path(sys.argv[1], f"rank-{os.environ['RANK']}.json").write_text(json.dumps(seen))
accelerator.wait_for_everyone()
sys.stdout.flush()
os._exit(0)  # gloo's teardown at interpreter exit can abort; everything is written
