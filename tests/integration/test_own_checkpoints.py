"""A job that checkpoints its own way, as PyTorch's multi-node DDP example does
(``torch.save`` of a ``snapshot.pt`` by global rank 0, loaded again at start; no
hpclaunch.checkpoint), submitted on the sandbox with ``--checkpoint-pattern``:
``hpclaunch status`` names its snapshot as the last checkpoint, and ``--follow`` tells
each new one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.helpers import VENV_BIN
from tests.integration.sandbox_fixture import Running

pytestmark = pytest.mark.integration

# After pytorch/examples distributed/ddp-tutorial-series/multinode.py, on CPU (gloo) and
# with a toy data set; the launcher's RANK, LOCAL_RANK and WORLD_SIZE as torchrun's.
DDP_EXAMPLE = """
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, data, optimizer, save_every, snapshot_path):
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.data = data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}", flush=True)

    def _run_epoch(self, epoch):
        for source, targets in self.data:
            self.optimizer.zero_grad()
            loss = F.mse_loss(self.model(source), targets)
            loss.backward()
            self.optimizer.step()
        time.sleep(0.5)

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def main(save_every, total_epochs, snapshot_path="snapshot.pt"):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = [(torch.rand(8, 20), torch.rand(8, 1)) for _ in range(4)]
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    Trainer(model, data, optimizer, save_every, snapshot_path).train(total_epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
"""


def test_status_names_the_snapshot_a_ddp_example_saved(sandbox: Running, tmp_path: Path) -> None:
    env = dict(sandbox.env)
    env["PATH"] = f"{VENV_BIN}:{env['PATH']}"
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "multinode.py").write_text(DDP_EXAMPLE)

    def hpclaunch(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(VENV_BIN / "hpclaunch"), *args],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )

    submitted = hpclaunch(
        "sbatch",
        "--follow",
        "--log-dir",
        "logs",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--checkpoint-pattern",
        "snapshot.pt",
        "--checkpoint-pattern",
        "no-such-folder/*.ckpt",
        "multinode.py",
        "1",
        "12",
    )
    job = int(submitted.stdout)
    assert submitted.returncode == 0, (
        submitted.stderr + (folder / "logs").joinpath(f"multinode-{job}.out").read_text()
    )
    snapshot = folder / "snapshot.pt"
    assert snapshot.is_file()
    followed = [
        line.split(": ", 1)[1] for line in submitted.stderr.splitlines() if line.startswith("[")
    ]
    assert f"checkpoint: {snapshot}" in followed, followed

    human = hpclaunch("status", str(job))
    assert human.returncode == 0, human.stderr
    print(human.stdout)  # for the docs: the real output
    lines = human.stdout.splitlines()
    assert lines[0] == f"job {job} (multinode): COMPLETED"
    last = next(line for line in lines if line.startswith("  last checkpoint: "))
    assert last.startswith(f"  last checkpoint: {snapshot} (written 20"), lines
    data = json.loads(hpclaunch("status", "--json", str(job)).stdout)
    assert data["last_checkpoint"] == str(snapshot) and data["checkpoint_step"] is None
    assert data["found_checkpoint_written"] == snapshot.stat().st_mtime
    assert data["checkpoint_patterns"] == [str(snapshot), str(folder / "no-such-folder/*.ckpt")]
    assert data["notes"] == []
