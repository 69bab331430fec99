"""A shared folder that refuses the job's files, on the sandbox, with examples/train.py:
the checkpoint folder full (a small tmpfs, filled) or read-only (a read-only bind
mount). Each job ends FAILED without a requeue, keeps no node out, and says once what
happened, where, and the fix, in its batch log and in `hpclaunch status`; a folder
made writable again and the job requeued as the message says resumes from its last
checkpoint with the digest of an uninterrupted run. No process of the job is left."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from hpclaunch.jobdir.errortext import SharedFolder, StorageErrno
from hpclaunch.jobdir.failures import Verdict
from hpclaunch.recovery import verdicts
from tests.integration.helpers import VENV_BIN, wait_for
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import EXAMPLES, Job, digest_of, submit

pytestmark = pytest.mark.integration

TRAIN = EXAMPLES / "train.py"
STEPS = ("--steps", "30", "--checkpoint-every", "5", "--step-time", "0.15")
# One restart in place, which fails the same way, is enough to see the verdict.
ONE_RESTART = ("--max-restarts", "1")
STORAGE_REASON = "shared folder not writable"


@pytest.fixture(scope="module")
def uninterrupted(reference_digest: Callable[..., str]) -> str:
    return reference_digest(TRAIN, *STEPS)


def mount_namespaces(sandbox: Running) -> list[list[str]]:
    """A command prefix for each mount namespace the sandbox's nodes run in: each
    node's own in netns mode (mounts made in this test's namespace do not reach it,
    as a filesystem mounted on one machine does not reach another), else this one."""
    daemons = sandbox.box.status()["daemons"]
    own = os.readlink("/proc/self/ns/mnt")
    prefixes: dict[str, list[str]] = {}
    for node in sandbox.layout.nodes:
        pid = int(daemons[node.name]["pid"])
        namespace = os.readlink(f"/proc/{pid}/ns/mnt")
        prefixes[namespace] = [] if namespace == own else ["nsenter", f"--target={pid}", "--mount"]
    return list(prefixes.values())


@contextmanager
def on_every_node(
    sandbox: Running, setup: Sequence[Sequence[str]], teardown: Sequence[Sequence[str]]
) -> Iterator[None]:
    """``setup`` run on every node of the sandbox (every node sees the same folder
    refuse, as with a shared filesystem), ``teardown`` on each afterwards, whatever
    happened."""
    prefixes = mount_namespaces(sandbox)
    try:
        for prefix in prefixes:
            for argv in setup:
                subprocess.run([*prefix, *argv], check=True, capture_output=True, text=True)
        yield
    finally:
        for prefix in prefixes:
            for argv in teardown:
                subprocess.run([*prefix, *argv], check=False, capture_output=True)


def status_text(job: Job) -> str:
    """`hpclaunch status JOBID` as a user runs it from the submit folder."""
    done = subprocess.run(
        [str(VENV_BIN / "hpclaunch"), "status", str(job.id)],
        cwd=job.folder,
        env=job.env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stdout.startswith(f"job {job.id} (train): FAILED"), done.stdout + done.stderr
    return done.stdout


def check_verdict(job: Job, folder: Path, error: str) -> None:
    """The job failed for the storage of ``folder``: no requeue, no node kept out, the
    verdict once in the batch log and in `hpclaunch status`."""
    assert job.wait_end() == "FAILED", job.log
    assert job.history() == [(0, STORAGE_REASON, "none")]
    history = json.loads((job.job_dir / "history.json").read_text())
    assert history["excluded_nodes"] == [] and history["runs"][0]["excluded"] == []
    fields = job.fields()
    assert fields["Restarts"] == "0" and fields.get("ExcNodeList", "(null)") == "(null)"
    verdict = f"the checkpoint folder {folder} cannot be written: {error}"
    assert job.log.count(f"supervisor: {verdict}") == 1, job.log
    assert f"`scontrol requeue {job.id}` resumes the job" in job.log
    assert "errors on some nodes only" not in job.log and "requeueing" not in job.log
    # One block, of node 0 (rank 0 there wrote the checkpoint and got the error).
    assert job.log.count("root cause: rank") == 1
    assert f"hpclaunch: job {job.id} failed on node 0 (" in job.log
    assert history["runs"][0]["verdict"].startswith(verdict)
    text = status_text(job)
    assert f"  verdict:         {verdict}" in text, text
    assert f"{STORAGE_REASON} -> none" in text and "  kept out:" not in text, text


def test_a_full_checkpoint_folder_fails_the_job_and_blames_no_node(
    sandbox: Running, tmp_path: Path
) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    fill = 'cat /dev/zero > "$1/filler" 2>/dev/null; test "$(stat -f -c %a "$1")" = 0'
    with on_every_node(
        sandbox,
        setup=[
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)],
            ["sh", "-c", fill, "sh", str(folder)],
        ],
        teardown=[["umount", "--lazy", str(folder)]],
    ):
        job = submit(
            sandbox, tmp_path / "job", TRAIN, *STEPS, options=ONE_RESTART, checkpoint_dir=folder
        )
        check_verdict(job, folder, "No space left on device (ENOSPC)")
    assert [s["step"] for s in job.lines("START")] == [0, 0]  # nothing was ever saved


def test_a_read_only_checkpoint_folder_fails_the_job_then_resumes_once_writable(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    job = submit(
        sandbox, tmp_path / "job", TRAIN, *STEPS, options=ONE_RESTART, checkpoint_dir=folder
    )
    job.wait_checkpoint(4)
    with on_every_node(
        sandbox,
        setup=[
            ["mount", "--bind", str(folder), str(folder)],
            ["mount", "-o", "remount,bind,ro", str(folder)],
        ],
        teardown=[["umount", "--lazy", str(folder)]],
    ):
        check_verdict(job, folder, "Read-only file system (EROFS)")
        saved = job.committed()
    # Writable again: the fix the message gives resumes from the last checkpoint.
    job.run("scontrol", "requeue", str(job.id))
    wait_for(lambda: job.fields()["JobState"] != "FAILED", what=f"job {job.id} requeued")
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    assert job.history() == [(0, STORAGE_REASON, "none"), (1, "completed", "none")]
    last = job.lines("START")[-1]
    assert (last["requeue"], last["step"]) == ("1", saved[-1] + 1)


def test_the_supervisors_test_write_sees_full_and_read_only_folders(tmp_path: Path) -> None:
    """What the supervisor falls back on when no failure record names the error."""
    full, read_only = tmp_path / "full", tmp_path / "ro"
    full.mkdir()
    read_only.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], check=True)
    try:
        subprocess.run(
            ["sh", "-c", 'cat /dev/zero > "$1/filler" 2>/dev/null; true', "sh", str(full)],
            check=True,
        )
        subprocess.run(["mount", "--bind", str(read_only), str(read_only)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(read_only)], check=True)
        for path, errno in ((full, StorageErrno.ENOSPC), (read_only, StorageErrno.EROFS)):
            folder = SharedFolder("checkpoint folder", str(path), "--checkpoint-dir")
            finding = verdicts.examine([], ["n1"], [folder])
            assert finding.verdict is Verdict.STORAGE and finding.storage is not None
            assert (finding.storage.folder, finding.storage.errno) == (folder, errno)
            assert f"a test write into {path} failed" in finding.message
        assert os.listdir(full) == ["filler"]  # the test write left nothing behind
    finally:
        subprocess.run(["umount", "--lazy", str(read_only)], check=False)
        subprocess.run(["umount", "--lazy", str(full)], check=False)
