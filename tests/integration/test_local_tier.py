"""The node-local tier and the modes of what a job writes, on real SLURM: two sandboxes
on one machine run a job with the same id, cluster name, run and node names at the
same time, and neither sees the other's node-local files; a job submitted under
umask 000 gets a job folder and checkpoints only its owner can reach."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpclaunch.node import local_folder
from hpclaunch.sandbox.cluster import Sandbox
from hpclaunch.sandbox.conf import SandboxSpec
from tests.integration.helpers import VENV_BIN, base_env
from tests.integration.sandbox_fixture import Running, client_env, require_sandbox
from tests.integration.training_jobs import EXAMPLES, submit

pytestmark = pytest.mark.integration

ONE_NODE = ("--nodes", "1", "--nproc-per-node", "2")
# Each worker leaves its job's tag in its node-local folder, waits until the other
# job's workers have left theirs (so both jobs' folders exist at once), and prints
# what its own folder holds.
SIDE_BY_SIDE = """\
import json, os, sys, time
from pathlib import Path

tag, meet = sys.argv[1], Path(sys.argv[2])
local = Path(os.environ["HPCLAUNCH_LOCAL_CHECKPOINT_DIR"])
rank = os.environ["RANK"]
(local / f"{tag}-{rank}").write_text(tag)
(meet / f"{tag}-{rank}").write_text(str(local))
deadline = time.monotonic() + 90
while len(list(meet.iterdir())) < 4:
    if time.monotonic() > deadline:
        sys.exit("the other job's workers never came")
    time.sleep(0.05)
files = sorted(p.name for p in local.iterdir() if p.is_file())
print("SEEN " + json.dumps({"local": str(local), "files": files}), flush=True)
"""


@pytest.fixture
def two_sandboxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Running]]:
    """Two fresh 1-node sandboxes: both number their first job 1, both call their node
    n1 and their cluster "sandbox"."""
    require_sandbox()
    boxes: list[Sandbox] = []
    try:
        running = []
        for _ in range(2):
            box = Sandbox(Path(tmp_path_factory.mktemp("sbx")))
            boxes.append(box)
            running.append(Running(box, box.up(SandboxSpec(nodes=1)), client_env(box)))
        yield running
    finally:
        left = [leftover for box in boxes for leftover in box.down()]
        assert not left, f"sandbox down left {left}"


def seen(log: str) -> list[dict[str, object]]:
    return [json.loads(m.group(1)) for m in re.finditer(r"SEEN (\{.*\})", log)]


def test_two_sandboxes_with_the_same_job_id_never_share_node_local_files(
    two_sandboxes: list[Running], tmp_path: Path
) -> None:
    script = tmp_path / "side_by_side.py"
    script.write_text(SIDE_BY_SIDE)
    meet = tmp_path / "meet"
    meet.mkdir()
    jobs = {
        tag: submit(run, tmp_path / tag, script, tag, str(meet), options=ONE_NODE)
        for tag, run in zip("ab", two_sandboxes, strict=True)
    }
    assert jobs["a"].id == jobs["b"].id  # the collision under test
    for job in jobs.values():
        assert job.wait_end() == "COMPLETED", job.log
    uid = os.getuid()
    folders = set()
    for tag, job in jobs.items():
        reports = seen(job.log)
        assert len(reports) == 2, job.log  # one for each worker
        for report in reports:
            assert report["files"] == [f"{tag}-0", f"{tag}-1"], job.log  # its own, only
            folders.add(str(report["local"]))
        assert len({str(r["local"]) for r in reports}) == 1
    assert len(folders) == 2  # one folder each
    for path in map(Path, folders):
        assert path.name.startswith(f"hpclaunch-u{uid}-sandbox-{jobs['a'].id}-"), path
        assert path.name.endswith("-0-n1"), path
        # Gone with the agent, its lock with it.
        assert not path.exists() and not Path(f"{path}{local_folder.LOCK_SUFFIX}").exists()


def test_two_agents_of_one_job_id_on_one_node_never_share_files_and_clear_leftovers(
    tmp_path: Path,
) -> None:
    """Without SLURM (its variables set by the test) and without a submission stamp:
    two agents of job 4242 on node localhost of cluster "twin", at once; a leftover
    folder of a job gone is cleared, and the old naming is neither read nor removed."""
    script = tmp_path / "side_by_side.py"
    script.write_text(SIDE_BY_SIDE)
    meet = tmp_path / "meet"
    meet.mkdir()
    shm = local_folder.base_folder()
    gone = shm / f"{local_folder.prefix(os.getuid())}twin-4242-p1.1-0-localhost"
    old = shm / "hpclaunch-4242-0-localhost"  # before the key: another job's, maybe
    for folder in (gone, old):
        (folder / "progress" / "attempt-0").mkdir(parents=True)
        (folder / "progress" / "attempt-0" / "local-0.progress").write_text("stale")
    env = base_env(
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_NUM_NODES="1",
        SLURM_NODEID="0",
        SLURM_STEP_ID="0",
        SLURM_CLUSTER_NAME="twin",
    )
    try:
        agents = {
            tag: subprocess.Popen(
                [
                    str(VENV_BIN / "hpclaunch"),
                    "agent",
                    "--nproc-per-node",
                    "2",
                    "--master-port",
                    str(port),  # the port derived from the job id would be the same
                    "--job-dir",
                    str(tmp_path / tag),
                    str(script),
                    tag,
                    str(meet),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for tag, port in (("a", 29611), ("b", 29612))
        }
        said = {tag: proc.communicate(timeout=120) for tag, proc in agents.items()}
        for tag, proc in agents.items():
            assert proc.returncode == 0, said[tag][1][-3000:]
            reports = seen(said[tag][0])
            assert [r["files"] for r in reports] == [[f"{tag}-0", f"{tag}-1"]] * 2, said[tag]
        locals_ = {str(r["local"]) for out, _ in said.values() for r in seen(out)}
        assert len(locals_) == 2
        assert not gone.exists()
        assert (old / "progress" / "attempt-0" / "local-0.progress").read_text() == "stale"
        cleared = f"removed the node-local folder {gone} that no running job holds"
        assert sum(cleared in err for _, err in said.values()) == 1
    finally:
        shutil.rmtree(gone, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder everyone may pass through (tmp_path is 0700, which would hide all)."""
    folder = Path(tempfile.mkdtemp(prefix="hpclaunch-modes-", dir="/tmp"))
    os.chmod(folder, 0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_under_umask_000_a_jobs_folders_and_checkpoints_are_its_owners(
    sandbox: Running, open_umask: None, open_folder: Path
) -> None:
    ckpts = open_folder / "checkpoints" / "run"  # neither folder exists yet
    logs = open_folder / "submit" / "logs"  # the user's log folder, open to all
    logs.mkdir(parents=True)
    os.chmod(logs, 0o755)
    job = submit(
        sandbox,
        open_folder / "submit",
        EXAMPLES / "train.py",
        "--steps",
        "6",
        "--checkpoint-every",
        "3",
        checkpoint_dir=ckpts,
    )
    assert job.wait_end() == "COMPLETED", job.log
    committed = job.committed()
    assert len(committed) == 2, committed  # saved every 3 of 6 steps, both kept
    assert mode(logs) == 0o755  # the user's: left as it was
    assert mode(job.job_dir) == 0o700
    assert mode(logs / f"train-{job.id}.out") == 0o600  # SLURM made it 0666 here
    assert mode(ckpts.parent) == mode(ckpts) == 0o700  # both made by the job
    for step in committed:
        assert mode(ckpts / f"step-{step:012d}.pt") == 0o600
    # What workers write inside keeps the umask's mode, but nobody else can reach it
    # through the job folder.
    inside = job.job_dir / "history.json"
    assert mode(inside) & 0o004, oct(mode(inside))  # readable, were it reached
    newest = ckpts / f"step-{committed[-1]:012d}.pt"
    for path in (inside, newest, logs / f"train-{job.id}.out"):
        denied = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, path
