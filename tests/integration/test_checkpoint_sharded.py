"""hpclaunch.checkpoint's sharded form with real torch: FSDP2 on gloo, ranks started
by torchrun on this machine. Saved by 4 ranks, loaded by 3 and 2 with every tensor
equal; node-local copies used only when every rank has one; damaged checkpoints set
aside; what cannot be saved or restored exactly refused by name. The SLURM side
(requeues, lost nodes, a kill in the middle of a save) is test_sharded_checkpoint.py's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import VENV_BIN, base_env, flip_a_tensor_byte

pytestmark = pytest.mark.integration

# Trains an FSDP2 model with uneven shards (37 rows over 2, 3 or 4 ranks) for MODE:
#   save N   : N steps, an asynchronous save after each (local copies too), then the
#              full tensors of the last state into expected.pt
#   load     : load_latest(into=a function that builds the state) and the full tensors
#              into loaded.pt
DRIVER = """
import json, os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from hpclaunch import checkpoint

mode, folder, out = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 37), torch.nn.Tanh(), torch.nn.Linear(37, 5))
for layer in (model[0], model[2], model):
    fully_shard(layer, mesh=mesh)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

def full(state):
    out = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in full(value).items()})
        elif isinstance(value, torch.Tensor):
            out[key] = (value.full_tensor() if hasattr(value, "full_tensor") else value).clone()
    return out

def everything():
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optim_state}

if mode == "save":
    for step in range(int(sys.argv[4])):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 10 + rank))
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        state = everything()
        state["meta"] = {"step": step, "world": world}
        checkpoint.save(state, step, folder=folder, asynchronous=True, local_copy=True)
    checkpoint.wait()
    expected = full(everything())
    if rank == 0:
        torch.save(expected, os.path.join(out, "expected.pt"))
else:
    def to_load():  # as documented: built only when there is a checkpoint to load
        return {**everything(), "meta": {"step": -1, "world": -1}}

    loaded = checkpoint.load_latest(folder, into=to_load)
    state = loaded.state
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    got = full(everything())
    if rank == 0:
        torch.save(got, os.path.join(out, "loaded.pt"))
        print("LOADED " + json.dumps({"step": loaded.step, "meta": state["meta"]}))
dist.barrier()
dist.destroy_process_group()
# As examples/train.py's end(): gloo's C++ teardown at exit sometimes aborts (SIGABRT,
# "terminate called without an active exception") after the work is done.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


def torchrun(
    tmp_path: Path, nproc: int, *args: str, job_dir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = base_env(
        PYTHONWARNINGS="ignore::UserWarning",
        OMP_NUM_THREADS="1",
        HPCLAUNCH_LOCAL_CHECKPOINT_DIR=str(tmp_path / "node-local"),
        **({"HPCLAUNCH_JOB_DIR": str(job_dir)} if job_dir else {}),
    )
    done = subprocess.run(
        [
            str(VENV_BIN / "torchrun"),
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(driver),
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def loaded_line(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    [line] = [x for x in done.stdout.splitlines() if x.startswith("LOADED ")]
    return dict(json.loads(line.removeprefix("LOADED ")))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three asynchronous saves by 4 ranks: steps 1 and 2 kept (keep_last=2)."""
    root = tmp_path_factory.mktemp("saved")
    torchrun(root, 4, "save", str(root / "ckpt"), str(root), "3")
    return root


def _equal(root: Path, out: Path) -> None:
    import torch

    expected = torch.load(root / "expected.pt")
    loaded = torch.load(out / "loaded.pt")
    assert sorted(expected) == sorted(loaded) and len(expected) > 6  # model and Adam's state
    for key, tensor in expected.items():
        assert torch.equal(tensor, loaded[key]), key


def test_four_ranks_save_committed_folders_only(saved: Path) -> None:
    names = sorted(p.name for p in (saved / "ckpt").iterdir())
    assert names == ["step-000000000001", "step-000000000002"]
    latest = saved / "ckpt" / "step-000000000002"
    files = sorted(p.name for p in latest.iterdir())
    data = [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]
    assert files == [*data, "hpclaunch-manifest.json"]  # the ranks' parts merged into it
    # Each rank summed the shards it wrote, rank 0 the metadata: every file is covered.
    written = json.loads((latest / "hpclaunch-manifest.json").read_text())
    assert (written["step"], written["world"], written["layout"]) == (2, 4, 1)
    assert sorted(written["files"]) == data
    assert all(written["files"][f]["bytes"] == (latest / f).stat().st_size for f in data)


@pytest.mark.parametrize("ranks", [4, 3, 2])
def test_saved_on_four_loads_on_any_number_of_ranks_exactly(
    saved: Path, tmp_path: Path, ranks: int
) -> None:
    done = torchrun(tmp_path, ranks, "load", str(saved / "ckpt"), str(tmp_path))
    assert loaded_line(done) == {"step": 2, "meta": {"step": 2, "world": 4}}
    _equal(saved, tmp_path)


def test_node_local_copies_serve_the_same_ranks_only(saved: Path, tmp_path: Path) -> None:
    local = tmp_path / "node-local"  # a copy: the fixture's stay whole for other tests
    shutil.copytree(saved / "node-local", local)
    assert sorted(p.name for p in local.iterdir()) == [f"rank-{r}-of-4" for r in range(4)]
    # The shared copy's shards truncated: only the node-local copies can give the state.
    shared = tmp_path / "ckpt"
    shutil.copytree(saved / "ckpt", shared)
    for shard in (shared / "step-000000000002").glob("__*.distcp"):
        os.truncate(shard, 10)
    same = torchrun(tmp_path, 4, "load", str(shared), str(tmp_path))
    assert "hpclaunch checkpoint: step 2 read from the node-local copies" in same.stderr
    _equal(saved, tmp_path)
    fewer = torchrun(tmp_path, 2, "load", str(saved / "ckpt"), str(tmp_path))
    assert "node-local" not in fewer.stderr  # 2 ranks: no copies of theirs; the shared one
    _equal(saved, tmp_path)
    # One rank without its copy: every rank reads the shared one.
    shutil.rmtree(local / "rank-3-of-4" / "step-000000000002")
    partial = torchrun(tmp_path, 4, "load", str(saved / "ckpt"), str(tmp_path))
    assert "node-local" not in partial.stderr
    _equal(saved, tmp_path)


def _flip_a_byte(path: Path) -> None:
    flip_a_tensor_byte(path)


def test_a_damaged_shared_copy_is_summed_when_a_node_local_copy_fails(
    saved: Path, tmp_path: Path
) -> None:
    """Every rank has a node-local copy, so the shared files are not summed up front; one
    rank's copy is truncated, so the shared one is read instead: it is summed first, and
    a bit flipped in a tensor there (which torch would load without a word) is found:
    step 2 is set aside, step 1 loaded."""
    shutil.copytree(saved / "node-local", tmp_path / "node-local")
    folder = tmp_path / "ckpt"
    shutil.copytree(saved / "ckpt", folder)
    _flip_a_byte(folder / "step-000000000002" / "__2_0.distcp")
    copy = tmp_path / "node-local" / "rank-1-of-4" / "step-000000000002"
    assert all((tmp_path / "node-local" / f"rank-{r}-of-4" / copy.name).is_dir() for r in range(4))
    os.truncate(copy / "__0_0.distcp", 10)
    done = torchrun(tmp_path, 4, "load", str(folder), str(tmp_path))
    assert "hpclaunch checkpoint: node-local copy of step 2 unusable on rank 1: " in done.stderr
    assert loaded_line(done) == {"step": 1, "meta": {"step": 1, "world": 4}}
    bad = folder / "step-000000000002"
    assert (
        f"hpclaunch checkpoint: {bad} failed to load (step 2: checksum mismatch in __2_0.distcp"
        in done.stderr
    ), done.stderr
    assert sorted(p.name for p in folder.iterdir()) == [
        "step-000000000001",
        "step-000000000002.damaged",
    ]


def _rename_older_over(folder: Path) -> None:
    newest = folder / "step-000000000002"
    shutil.rmtree(newest)
    shutil.copytree(folder / "step-000000000001", newest)


def _newer_layout(folder: Path) -> None:
    where = folder / "step-000000000002" / "hpclaunch-manifest.json"
    where.write_text(where.read_text().replace('"layout": 1', '"layout": 2'))


# Loaded by 2 ranks, the files are summed: rank 0 .metadata, __1_0 and __3_0, rank 1
# __0_0 and __2_0 (every second file, by name): __2_0's flip is found by rank 1 only.
DAMAGE = {
    "byte flipped": (
        lambda f: _flip_a_byte(f / "step-000000000002" / "__2_0.distcp"),
        "checksum mismatch in __2_0.distcp: found by rank 1 (its log says more)",
    ),
    "step 1 under step 2's name": (
        _rename_older_over,
        "step mismatch: its manifest says step 1, its name step 2: another step's "
        "checkpoint under this name",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_checkpoint_that_fails_its_manifest_is_set_aside_and_the_previous_one_used(
    saved: Path, tmp_path: Path, damage: str
) -> None:
    """Every rank agrees on the verdict (rank 1 found the flip; rank 0 names it), step 1
    is loaded with every tensor as saved, step 2 is set aside with a note for status."""
    folder, job = tmp_path / "ckpt", tmp_path / "job"
    shutil.copytree(saved / "ckpt", folder)
    job.mkdir()
    change, problem = DAMAGE[damage]
    change(folder)
    done = torchrun(tmp_path, 2, "load", str(folder), str(tmp_path), job_dir=job)
    assert loaded_line(done) == {"step": 1, "meta": {"step": 1, "world": 4}}
    bad = folder / "step-000000000002"
    line = f"hpclaunch checkpoint: {bad} failed to load (step 2: {problem}"
    assert line in done.stderr, done.stderr
    assert "set aside as step-000000000002.damaged; resumed from step-000000000001\n" in (
        done.stderr
    )
    # One line names it; where rank 1 found the damage, rank 1 says what it found.
    said = sorted(x for x in done.stderr.splitlines() if "step-000000000002" in x)
    assert said[0].startswith(line)
    if damage == "byte flipped":
        assert len(said) == 2
        assert said[1].startswith(
            f"hpclaunch checkpoint: {bad} fails its manifest on rank 1: {bad / '__2_0.distcp'}: "
            "crc32 "
        )
        assert " its manifest says " in said[1]
    else:
        assert len(said) == 1
    assert sorted(p.name for p in folder.iterdir()) == [
        "step-000000000001",
        "step-000000000002.damaged",
    ]
    [note] = [json.loads(x) for x in (job / "checkpoints-set-aside.jsonl").read_text().splitlines()]
    assert (note["step"], note["renamed_to"]) == (2, str(folder / "step-000000000002.damaged"))
    assert problem.startswith(note["problem"])


def test_a_checkpoint_of_a_newer_layout_is_skipped_and_left_in_place(
    saved: Path, tmp_path: Path
) -> None:
    """Not damaged (a newer hpclaunch reads it): named on stderr as skipped, not renamed,
    not noted for status; step 1 is loaded."""
    folder, job = tmp_path / "ckpt", tmp_path / "job"
    shutil.copytree(saved / "ckpt", folder)
    job.mkdir()
    _newer_layout(folder)
    done = torchrun(tmp_path, 2, "load", str(folder), str(tmp_path), job_dir=job)
    assert loaded_line(done) == {"step": 1, "meta": {"step": 1, "world": 4}}
    bad = folder / "step-000000000002"
    [said] = [x for x in done.stderr.splitlines() if "step-000000000002" in x]
    assert said.startswith(
        f"hpclaunch checkpoint: {bad} skipped as newer (step 2: newer layout: "
        f"{bad / 'hpclaunch-manifest.json'} is of layout 2, newer than this hpclaunch's 1"
    ), done.stderr
    assert said.endswith("; resumed from step-000000000001; it was left as it is")
    assert "damaged" not in done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["step-000000000001", "step-000000000002"]
    assert not (job / "checkpoints-set-aside.jsonl").exists()


def test_a_checkpoint_saved_before_manifests_loads_said_unverified(
    saved: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "ckpt"
    shutil.copytree(saved / "ckpt", folder)
    for step in (1, 2):
        (folder / f"step-{step:012d}" / "hpclaunch-manifest.json").unlink()
    done = torchrun(tmp_path, 2, "load", str(folder), str(tmp_path))
    assert loaded_line(done) == {"step": 2, "meta": {"step": 2, "world": 4}}
    _equal(saved, tmp_path)
    said = (
        f"hpclaunch checkpoint: {folder / 'step-000000000002'} has no manifest (saved before "
        "hpclaunch wrote them): loaded unverified\n"
    )
    assert done.stderr.count(said) == 1 and "set aside" not in done.stderr


# One process, one rank (FSDP2 still gives DTensors): what is refused, and damage.
# Prints one JSON object of what each case did.
CHECKS = """
import json, os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_state_dict
from hpclaunch import checkpoint

folder = sys.argv[1]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0,
                        world_size=1)
model = torch.nn.Sequential(torch.nn.Linear(4, 3))
fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model(torch.ones(2, 4)).sum().backward()
optimizer.step()
out = {}

def refused(key, call):
    try:
        call()
    except checkpoint.CheckpointError as exc:
        out[key] = str(exc)
    else:
        out[key] = None

def state():
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optim_state}

refused("one_file", lambda: checkpoint.save(state(), 0, folder=folder, sharded=False))
refused("local_one_file", lambda: checkpoint.save({"x": torch.ones(1)}, 0, folder=folder,
                                                  local_copy=True))
refused("local_no_agent", lambda: checkpoint.save(state(), 0, folder=folder, local_copy=True))
refused("sync_failed", lambda: checkpoint.save({**state(), "f": lambda: 0}, 6, folder=folder))
for step in (0, 1, 2):  # the first of them prunes the failed save's temporary folder
    checkpoint.save(state(), step, folder=folder, keep_last=3)
refused("no_into", lambda: checkpoint.load_latest(folder))
refused("short_into", lambda: checkpoint.load_latest(folder, into={"model": state()["model"]}))
checkpoint.save({**state(), "f": lambda: 0}, 5, folder=folder, asynchronous=True)
refused("async_failed", checkpoint.wait)
out["after_failure"] = [c.step for c in checkpoint.complete(folder)]
shard = os.path.join(folder, "step-000000000002", "__0_0.distcp")
os.truncate(shard, os.path.getsize(shard) // 2)
out["loaded"] = checkpoint.load_latest(folder, into=state()).step
for step in (0, 1):
    os.truncate(os.path.join(folder, f"step-{step:012d}", ".metadata"), 10)
refused("none_loads", lambda: checkpoint.load_latest(folder, into=state()))
out["names"] = sorted(os.listdir(folder))
out["saves"] = [json.loads(line) for line in open(os.environ["HPCLAUNCH_JOB_DIR"]
                                                  + "/checkpoint-saves.jsonl")]
single = folder + "-one-file"  # the replicated form: a truncated file is set aside too
for step in (0, 1):
    checkpoint.save({"x": torch.full((1000,), float(step))}, step, folder=single)
os.truncate(os.path.join(single, "step-000000000001.pt"), 100)
resumed = checkpoint.load_latest(single)
out["one_file_loaded"] = [resumed.step, resumed.state["x"][0].item()]
# A one-file checkpoint with a byte flipped in its tensor data: its manifest tells.
flipped = folder + "-one-file-flipped"
for step in (0, 1):
    checkpoint.save({"x": torch.full((1000,), float(step))}, step, folder=flipped)
import struct, zipfile
one = os.path.join(flipped, "step-000000000001.pt")
with zipfile.ZipFile(one) as archive:  # torch.save's zip: the tensor's bytes are .../data/0
    [entry] = [i for i in archive.infolist() if i.filename.endswith("/data/0")]
with open(one, "r+b") as handle:
    handle.seek(entry.header_offset + 26)  # the entry's local header: its name and extra
    name_len, extra_len = struct.unpack("<HH", handle.read(4))
    handle.seek(entry.header_offset + 30 + name_len + extra_len + 5)
    byte = handle.read(1)
    handle.seek(-1, os.SEEK_CUR)
    handle.write(bytes([byte[0] ^ 0x40]))
# Damage torch loads without a word: one element changed.
out["flipped_torch"] = int((torch.load(one)["x"] != 1.0).sum())
out["flipped_loaded"] = checkpoint.load_latest(flipped).step
# The newest saved with other shapes than the script's: given into=, it is not taken.
shapes = folder + "-one-file-shapes"
checkpoint.save({"x": torch.zeros(1000)}, 0, folder=shapes)
checkpoint.save({"x": torch.zeros(999)}, 1, folder=shapes)
out["shapes_loaded"] = checkpoint.load_latest(shapes, into={"x": torch.ones(1000)}).step
# 256 MB more: its write is still going on when the script ends, without wait().
checkpoint.save({**state(), "big": torch.ones(64 * 2**20)}, 7, folder=folder,
                asynchronous=True)
out["in_flight"] = checkpoint.in_flight()
print(json.dumps(out))
"""


def test_what_cannot_be_done_exactly_is_refused_and_damage_is_set_aside(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a free port on loopback for the one-rank group
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder, job = tmp_path / "ckpt", tmp_path / "job"
    job.mkdir()  # the job folder, as the agent makes it
    env = base_env(PYTHONWARNINGS="ignore::UserWarning", HPCLAUNCH_JOB_DIR=str(job))
    done = subprocess.run(
        [sys.executable, "-c", CHECKS, str(folder), str(port)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["one_file"].startswith(
        "checkpoint.save(sharded=False) cannot save 'model.0.weight': it is a DTensor"
    )
    assert out["local_one_file"].startswith("save(local_copy=True) keeps each rank's shards")
    assert "needs HPCLAUNCH_LOCAL_CHECKPOINT_DIR" in out["local_no_agent"]
    assert out["no_into"].startswith(f"{folder / 'step-000000000002'} is a sharded checkpoint:")
    assert (
        "entries the state given to load_latest(into=...) lacks, such as optimizer."
        in (out["short_into"])
    )
    assert out["sync_failed"].startswith("the save of step 6 (")  # a CheckpointError too
    assert out["async_failed"].startswith("the asynchronous save of step 5 (")
    assert out["after_failure"] == [0, 1, 2]  # the failed save never became visible
    assert out["loaded"] == 1  # step 2 truncated: set aside, step 1 loaded
    assert out["one_file_loaded"] == [0, 0.0]
    assert (tmp_path / "ckpt-one-file" / "step-000000000001.pt.damaged").exists()
    assert out["flipped_torch"] == 1  # the flip is in the tensor's data, not the zip's
    assert out["flipped_loaded"] == 0
    flipped = tmp_path / "ckpt-one-file-flipped" / "step-000000000001.pt"
    assert (
        f"hpclaunch checkpoint: {flipped} failed to load (step 1: checksum mismatch in "
        f"step-000000000001.pt: {flipped}: crc32 "
    ) in done.stderr
    assert sorted(p.name for p in flipped.parent.iterdir()) == [  # its manifest went with it
        "step-000000000000.pt",
        "step-000000000000.pt.manifest.json",
        "step-000000000001.pt.damaged",
        "step-000000000001.pt.damaged.manifest.json",
    ]
    assert out["shapes_loaded"] == 0
    assert (
        f"{tmp_path / 'ckpt-one-file-shapes' / 'step-000000000001.pt'} failed to load (rank 0: "
        "ValueError: Size mismatch between saved (999,) and current (1000,) for x): set aside "
        "as step-000000000001.pt.damaged; resumed from step-000000000000.pt"
    ) in done.stderr
    # Each set aside is noted for hpclaunch status, with its reason.
    noted = [json.loads(x) for x in (job / "checkpoints-set-aside.jsonl").read_text().splitlines()]
    assert [(n["step"], n["problem"], n["file"]) for n in noted] == [
        (2, "size mismatch", "__0_0.distcp"),
        (1, "size mismatch", "step-000000000001.pt"),
        (1, "checksum mismatch", "step-000000000001.pt"),
        (1, "load failed", None),
    ]
    # Step 2 was set aside only once step 1 had loaded: that showed the loading works.
    # The truncated shard is caught by its manifest before torch reads it.
    assert "step-000000000002 failed to load (step 2: size mismatch in __0_0.distcp: " in (
        done.stderr
    )
    assert "set aside as step-000000000002.damaged; resumed from step-000000000001" in (done.stderr)
    # When none loads, the cause may be the script: nothing is renamed, each is named.
    assert out["none_loads"].startswith(
        f"no checkpoint in {folder} can be loaded: step-000000000001 (step 1: size mismatch "
        "in .metadata: "
    )
    assert "Nothing was renamed" in out["none_loads"]
    assert out["names"] == [
        ".step-000000000005.tmp-local-0-0",  # the failed save's, pruned by the next save
        "step-000000000000",
        "step-000000000001",
        "step-000000000002.damaged",
    ]
    # Blocking saves block training for their whole time; the record says so.
    assert [r["step"] for r in out["saves"]] == [0, 1, 2]
    assert all(r["blocked_s"] == r["total_s"] > 0 and not r["asynchronous"] for r in out["saves"])
    # The save in flight when the script ended was finished before the process exited.
    assert out["in_flight"] == 7
    kept = sorted(c.name for c in folder.iterdir() if not c.name.endswith(".damaged"))
    assert kept == ["step-000000000001", "step-000000000007"]  # keep_last=2
    last = json.loads((job / "checkpoint-saves.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 7 and last["asynchronous"] and last["blocked_s"] < last["total_s"]


# One rank saves asynchronously, then destroys the process group without wait(): the
# save must not be committed (torch's checkpoint would go on as a single process).
DESTROYED = """
import sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from hpclaunch import checkpoint

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0,
                        world_size=1)
model = torch.nn.Sequential(torch.nn.Linear(4, 3))
fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
checkpoint.save({"model": model.state_dict(), "big": torch.ones(64 * 2**20)}, 3,
                folder=sys.argv[1], asynchronous=True)
print("in flight", checkpoint.in_flight(), flush=True)
dist.destroy_process_group()
"""


def test_a_save_in_flight_when_the_group_is_destroyed_is_never_committed(
    tmp_path: Path,
) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = tmp_path / "ckpt"
    done = subprocess.run(
        [sys.executable, "-c", DESTROYED, str(folder), str(port)],
        env=base_env(PYTHONWARNINGS="ignore::UserWarning"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "in flight 3" in done.stdout, done.stdout + done.stderr
    assert checkpoint_steps(folder) == []
    assert (
        "the process group was destroyed while the save of step-000000000003 was in flight; "
        "call checkpoint.wait() before dist.destroy_process_group()"
    ) in done.stderr


def checkpoint_steps(folder: Path) -> list[int]:
    from hpclaunch import checkpoint

    return [c.step for c in checkpoint.complete(folder)]


# 4 ranks hand save() what cannot be saved, each case the same on every rank or on some
# only; every rank must raise (none left waiting in a collective), nothing be written,
# and a save of good state work after them. Rank R writes OUT/refused-R.json: {case: message}.
REFUSALS = """
import json, os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_state_dict
from hpclaunch import checkpoint

folder = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.Sequential(torch.nn.Linear(4, 7), torch.nn.Linear(7, 1))
for layer in (model[0], model[1], model):
    fully_shard(layer, mesh=init_device_mesh("cpu", (world,)))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
model(torch.ones(2, 4)).sum().backward()
optimizer.step()
out = {}

def refused(case, call):
    try:
        call()
    except checkpoint.CheckpointError as exc:
        out[case] = str(exc)
    else:
        out[case] = None

plain = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
refused("plain", lambda: checkpoint.save(plain, 1, folder=folder))
refused("plain_async", lambda: checkpoint.save(plain, 1, folder=folder, asynchronous=True))
refused("optimizer_object", lambda: checkpoint.save({"optimizer": optimizer}, 1, folder=folder))
# Rank 1 alone hands replicated state: the others would write shards.
mixed = {"x": torch.ones(2)} if rank == 1 else {"model": model.state_dict()}
refused("forms_differ", lambda: checkpoint.save(mixed, 2, folder=folder))
# Rank 2 alone asks for what cannot be done (a local copy of replicated state).
local = {"x": torch.ones(2)} if rank == 2 else {"model": model.state_dict()}
refused("one_refuses", lambda: checkpoint.save(local, 3, folder=folder, local_copy=rank == 2))
refused("steps_differ", lambda: checkpoint.save({"model": model.state_dict()}, 4 + rank % 2,
                                                folder=folder))
out["names_after_refusals"] = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
model_state, optim_state = get_state_dict(model, optimizer)
checkpoint.save({"model": model_state, "optimizer": optim_state}, 9, folder=folder)
out["names"] = sorted(os.listdir(folder))
with open(os.path.join(sys.argv[2], f"refused-{rank}.json"), "w") as handle:
    json.dump(out, handle)  # a file each: the ranks' printed lines may interleave
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


def test_state_that_cannot_be_saved_is_refused_on_every_rank_before_any_write(
    tmp_path: Path,
) -> None:
    driver = tmp_path / "refusals.py"
    driver.write_text(REFUSALS)
    folder = tmp_path / "ckpt"
    done = subprocess.run(
        [
            str(VENV_BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node=4",
            str(driver),
            str(folder),
            str(tmp_path),
        ],
        env=base_env(PYTHONWARNINGS="ignore::UserWarning", OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=120,  # a rank left waiting in a collective would stop the run here
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    by_rank = {r: json.loads((tmp_path / f"refused-{r}.json").read_text()) for r in range(4)}
    fix = (
        "save the optimizer as torch.distributed.checkpoint.state_dict.get_state_dict(model, "
        "optimizer) gives it (model_state, optim_state), and load it the same way"
    )
    for rank, out in by_rank.items():
        for case in ("plain", "plain_async"):
            assert out[case].startswith("checkpoint.save cannot save 'optimizer' as a sharded")
            assert out[case].endswith(fix)
        assert out["optimizer_object"].startswith("checkpoint.save cannot save 'optimizer'")
        assert "rank 0's state holds sharded entries" in out["forms_differ"]
        assert "rank 1's holds none" in out["forms_differ"]
        if rank == 2:
            assert out["one_refuses"].startswith("save(local_copy=True) keeps each rank's")
        else:
            assert out["one_refuses"] == (
                "checkpoint.save of step 3 was refused on rank 2 (its error says why); "
                "nothing was written"
            )
        assert out["steps_differ"].startswith(
            "checkpoint.save was called with different steps on different ranks (from 4 to 5; "
            f"this rank: {4 + rank % 2})"
        )
        assert out["names_after_refusals"] == []  # not even a temporary folder
        assert out["names"] == ["step-000000000009"]


# 2 ranks hand save() what only one of them cannot save, or arguments that differ, each
# failing before the agreement (a copy into host memory, a step that is no number, a
# keep_last below 1, a state too deep, a bad HPCLAUNCH_SHARE_WITH_GROUP, local_copy on
# one rank); every rank must raise at that save (none left waiting in a collective, in
# the training's thread or the save's), nothing be written, and a good asynchronous save
# work after them. Rank R writes OUT/one-rank-R.json: {case: [error type, message]}.
ONE_RANK = """
import json, os, sys, threading, torch, torch.distributed as dist
from hpclaunch import checkpoint

folder = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
good = {"w": torch.arange(6.0)}
out = {}

def outcome(case, call):
    try:
        call()
        checkpoint.wait()
    except Exception as exc:
        out[case] = [type(exc).__name__, str(exc)]
    else:
        out[case] = None

def deep():
    nested = {}
    nested["again"] = nested
    return nested

# The one-file form: rank 0 alone copies the state; the sharded form: every rank does.
unpicklable = {"w": torch.arange(6.0), "it": threading.Lock()}
outcome("stage_one_file", lambda: checkpoint.save(
    unpicklable if rank == 0 else good, 1, folder=folder, asynchronous=True))
outcome("stage_sharded", lambda: checkpoint.save(
    unpicklable if rank == 1 else good, 2, folder=folder, asynchronous=True, sharded=True))
outcome("step_not_a_number", lambda: checkpoint.save(good, "3" if rank else 3, folder=folder))
outcome("keep_last", lambda: checkpoint.save(good, 4, folder=folder, keep_last=0 if rank else 2))
outcome("too_deep", lambda: checkpoint.save(deep() if rank else good, 5, folder=folder))
os.environ["HPCLAUNCH_SHARE_WITH_GROUP"] = "maybe" if rank else "1"
outcome("modes", lambda: checkpoint.save(good, 6, folder=folder))
del os.environ["HPCLAUNCH_SHARE_WITH_GROUP"]
outcome("local_copy", lambda: checkpoint.save(
    good, 7, folder=folder, sharded=True, local_copy=rank == 0))
out["names_after_refusals"] = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
checkpoint.save(good, 9, folder=folder, asynchronous=True)
checkpoint.wait()
out["names"] = sorted(os.listdir(folder))
with open(os.path.join(sys.argv[2], f"one-rank-{rank}.json"), "w") as handle:
    json.dump(out, handle)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


def test_what_fails_on_one_rank_before_the_agreement_raises_on_every_rank(
    tmp_path: Path,
) -> None:
    driver = tmp_path / "one_rank.py"
    driver.write_text(ONE_RANK)
    folder = tmp_path / "ckpt"
    done = subprocess.run(
        [
            str(VENV_BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node=2",
            str(driver),
            str(folder),
            str(tmp_path),
        ],
        env=base_env(
            PYTHONWARNINGS="ignore::UserWarning",
            OMP_NUM_THREADS="1",
            HPCLAUNCH_LOCAL_CHECKPOINT_DIR=str(tmp_path / "node-local"),
        ),
        capture_output=True,
        text=True,
        timeout=120,  # a rank left waiting in a collective would stop the run here
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    by_rank = {r: json.loads((tmp_path / f"one-rank-{r}.json").read_text()) for r in range(2)}
    # (case, the rank that cannot, the start of its own error); the other rank names it.
    cases = [
        ("stage_one_file", 0, ["CheckpointError", "the asynchronous save of step 1 cannot copy"]),
        ("stage_sharded", 1, ["CheckpointError", "the asynchronous save of step 2 cannot copy"]),
        ("step_not_a_number", 1, ["CheckpointError", "checkpoint.save takes the step as an"]),
        ("keep_last", 1, ["ValueError", "keep_last must be at least 1, not 0"]),
        ("too_deep", 1, ["RecursionError", ""]),
        ("modes", 1, ["HpclaunchError", "HPCLAUNCH_SHARE_WITH_GROUP='maybe' (from the"]),
    ]
    steps = {"step_not_a_number": 3, "keep_last": 4, "too_deep": 5, "modes": 6}
    for case, cannot, (kind, start) in cases:
        own, other = by_rank[cannot][case], by_rank[1 - cannot][case]
        assert own[0] == kind and own[1].startswith(start), (case, own)
        step = steps.get(case, 1 if case == "stage_one_file" else 2)
        assert other == [
            "CheckpointError",
            f"checkpoint.save of step {step} was refused on rank {cannot} (its error says "
            "why); nothing was written",
        ], (case, other)
    assert "TypeError: cannot pickle '_thread.lock' object" in by_rank[0]["stage_one_file"][1]
    for rank, out in by_rank.items():
        assert out["local_copy"] == [
            "CheckpointError",
            "checkpoint.save of step 7 was called with local_copy=True on rank 0 and "
            "local_copy=False on rank 1: every rank passes the same local_copy (it is a "
            "collective); nothing was written",
        ], rank
        assert out["names_after_refusals"] == []  # not even a temporary folder
        assert out["names"] == ["step-000000000009.pt", "step-000000000009.pt.manifest.json"]
