"""Loading never moves the model: on a fresh start, the documented patterns (FSDP2 and
DDP, docs/fault-tolerance.md) train bit for bit as the same script without hpclaunch's
lines, for SGD (momentum, dampening, weight decay), Adam and AdamW; and torch's
initialisation of a fresh optimizer's state (``get_state_dict`` steps it at lr 0) is not
counted as a step. Ranks started by torchrun on this machine (gloo, CPU); a worker's
progress read as the agent reads it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpclaunch import progress
from hpclaunch.node import boot_env
from tests.integration.helpers import VENV_BIN, base_env

pytestmark = pytest.mark.integration

OPTIMIZERS = ("SGD", "Adam", "AdamW")

# Trains MODEL (fsdp: fully_shard over every rank; ddp) for 6 steps with each optimizer in
# turn, in FORM:
#   bare      : no hpclaunch at all
#   hpclaunch : the documented pattern: Preemption.install, load_latest (for FSDP2 with
#               into= a function that builds the state), a save every 2 steps
#               (asynchronous for FSDP2, as documented), should_stop, wait
#   eager     : FSDP2's state built with get_state_dict before load_latest (into= the
#               dict), as the docs showed it before
# Rank 0 prints DIGESTS {optimizer: SHA-256 of the full parameters}.
DRIVER = """
import hashlib, json, os, struct, sys, torch, torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

kind, form, folder = sys.argv[1], sys.argv[2], sys.argv[3]
if form != "bare":
    from hpclaunch import checkpoint
    stop = checkpoint.Preemption.install()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
STEPS, EVERY = 6, 2
OPTIONS = {"SGD": dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
           "Adam": dict(lr=0.01), "AdamW": dict(lr=0.01, weight_decay=0.1)}

def build(name):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 13), torch.nn.Tanh(), torch.nn.Linear(13, 1))
    if kind == "fsdp":
        mesh = init_device_mesh("cpu", (world,))
        for layer in (model[0], model[2], model):
            fully_shard(layer, mesh=mesh)
    else:
        model = DDP(model)
    return model, getattr(torch.optim, name)(model.parameters(), **OPTIONS[name])

def digest(model):
    sha = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        full = value.full_tensor() if isinstance(value, DTensor) else value
        flat = full.detach().to(torch.float64).flatten().tolist()
        sha.update(key.encode() + struct.pack(f"<{len(flat)}d", *flat))
    return sha.hexdigest()

digests = {}
for name in sys.argv[4:]:
    model, optimizer = build(name)
    where = os.path.join(folder, name)

    def sharded_state():
        model_state, optim_state = get_state_dict(model, optimizer)
        return {"model": model_state, "optimizer": optim_state}

    if form == "hpclaunch" and kind == "fsdp":
        resumed = checkpoint.load_latest(where, into=sharded_state)
        assert resumed is None, resumed
    elif form == "eager":
        resumed = checkpoint.load_latest(where, into=sharded_state())
        assert resumed is None, resumed
    elif form == "hpclaunch":
        assert checkpoint.load_latest(where) is None
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(4, 8, generator=gen)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), torch.sin(x.sum(1, keepdim=True))).backward()
        optimizer.step()
        if form == "bare":
            continue
        stopping = stop.should_stop()
        if stopping or (step + 1) % EVERY == 0:
            if kind == "fsdp":
                checkpoint.save(sharded_state(), step, folder=where, asynchronous=not stopping)
            else:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                checkpoint.save(state, step, folder=where)
    if form != "bare":
        checkpoint.wait()
    digests[name] = digest(model)
if rank == 0:
    print("DIGESTS " + json.dumps(digests), flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # as examples/train.py's end(): gloo's teardown at exit sometimes aborts
"""


def digests(tmp_path: Path, kind: str, form: str) -> dict[str, str]:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    folder = tmp_path / f"{kind}-{form}"
    done = subprocess.run(
        [
            str(VENV_BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node=2",
            str(driver),
            kind,
            form,
            str(folder),
            *OPTIMIZERS,
        ],
        env=base_env(PYTHONWARNINGS="ignore::UserWarning", OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [line] = [x for x in done.stdout.splitlines() if x.startswith("DIGESTS ")]
    if form != "bare":  # the saves were made: the runs compared did checkpoint
        for name in OPTIMIZERS:
            newest = sorted(p.name for p in (folder / name).iterdir())[-1]
            assert newest.startswith("step-000000000005"), newest
    return dict(json.loads(line.removeprefix("DIGESTS ")))


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
def test_a_fresh_start_trains_as_the_script_without_hpclaunch(tmp_path: Path, kind: str) -> None:
    bare = digests(tmp_path, kind, "bare")
    assert len(set(bare.values())) == 3  # three optimizers, three trainings
    assert digests(tmp_path, kind, "hpclaunch") == bare


def test_the_state_built_before_a_fresh_start_would_have_moved_adam(tmp_path: Path) -> None:
    """Why into= takes a function: get_state_dict on a fresh optimizer steps it (at lr 0),
    which starts Adam's step count at 1, so that the run differs (this test fails when
    that changes, and the docs' reason with it)."""
    bare = digests(tmp_path, "fsdp", "bare")
    eager = digests(tmp_path, "fsdp", "eager")
    assert eager["Adam"] != bare["Adam"] and eager["AdamW"] != bare["AdamW"]


# One process with the progress hooks the agent gives a worker: a fresh optimizer's
# state made by get_state_dict (a step at lr 0), then (argv[2] "loaded") a state of 5
# steps restored into it with set_state_dict, then 3 training steps.
COUNTED = """
import sys, torch, torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0,
                        world_size=1)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)  # wraps optimizer.step
_, fresh = get_state_dict(model, optimizer)
if sys.argv[2] == "loaded":  # as a checkpoint of step 5 would restore it
    saved = {"state": {name: {**entry, "step": torch.tensor(5.0)}
                       for name, entry in fresh["state"].items()},
             "param_groups": fresh["param_groups"]}
    set_state_dict(model, optimizer, model_state_dict=model.state_dict(),
                   optim_state_dict=saved)
for _ in range(3):
    model(torch.ones(4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()
print("DONE", flush=True)
"""


@pytest.mark.parametrize("case", ["fresh", "loaded"])
def test_the_initialisation_of_a_fresh_optimizer_is_not_counted_as_a_step(
    tmp_path: Path, case: str
) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    board = tmp_path / "rank.progress"
    env = base_env(PYTHONWARNINGS="ignore::UserWarning", **{progress.PROGRESS_FILE: str(board)})
    env.update(boot_env.boot_env(env))
    script = tmp_path / "train.py"  # a file, as the agent runs a script
    script.write_text(COUNTED)
    done = subprocess.run(
        [sys.executable, str(script), str(port), case],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and "DONE" in done.stdout, done.stderr
    seen = progress.read(str(board))
    assert seen is not None and seen.count == 3
    if case == "fresh":  # its count of 1 is the initialisation's: no evidence
        assert seen.resumed_by is None and seen.step == 3
    else:  # the restored state's count is evidence, as without the initialisation
        assert (seen.resumed_by, seen.resumed, seen.step) == ("optimizer", 5, 8)
