"""A job folder that refuses new files in the middle of a run, on the sandbox, with
examples/train.py (its checkpoints in a folder of their own): full (a small ext4 of
its own, filled), immutable (`chattr +i`), or read-only (a read-only bind mount).
Training goes on and finishes, so the job ends COMPLETED with the digest of an
uninterrupted run; the history is closed (rewritten in place where a new file is
refused), or, where nothing can be written, the batch log says so in one line and
`hpclaunch status` says what is known instead of "running". No process is left."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.helpers import wait_for
from tests.integration.sandbox_fixture import Running
from tests.integration.test_storage_faults import mount_namespaces, on_every_node
from tests.integration.training_jobs import EXAMPLES, Job, digest_of, submit

pytestmark = pytest.mark.integration

TRAIN = EXAMPLES / "train.py"
STEPS = ("--steps", "30", "--checkpoint-every", "5", "--step-time", "0.15")
IN_PLACE = "could not be replaced ({error}); rewritten in place"
# Blocks taken when written, not later (delayed allocation holds a margin back from
# a write that fills the filesystem, which the next writer gets): full is full.
MOUNT_OPTIONS = ("-o", "nodelalloc")
# Another user's files filling the job's filesystem, and taking every block that frees
# up (the job's processes replace their notes: each replacement frees the old one's),
# until stopped. A large write leaves the last few blocks; writes of one block take them.
FILL = (
    'while :; do cat /dev/zero >> "$1/filler" 2>/dev/null; '
    'dd if=/dev/zero bs=4096 of="$1/filler-blocks" oflag=append conv=notrunc 2>/dev/null; '
    "sleep 0.02; done"
)


@pytest.fixture(scope="module")
def uninterrupted(reference_digest: Callable[..., str]) -> str:
    return reference_digest(TRAIN, *STEPS)


def check_finished(job: Job, uninterrupted: str) -> None:
    """The job ended COMPLETED, with the uninterrupted run's model, in one run."""
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    assert job.fields()["Restarts"] == "0"
    assert "Traceback" not in job.log, job.log
    assert f"hpclaunch[job {job.id}]: supervisor: job completed" in job.log, job.log


def submit_mid_run(sandbox: Running, tmp_path: Path, *options: str) -> Job:
    """The job, its checkpoints outside its folder (tmp_path/checkpoints)."""
    return submit(
        sandbox,
        tmp_path / "job",
        TRAIN,
        *STEPS,
        options=options,
        checkpoint_dir=tmp_path / "checkpoints",
    )


def test_an_immutable_job_folder_mid_run_ends_completed_with_its_history_closed(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit_mid_run(sandbox, tmp_path)
    job.wait_checkpoint(4)
    try:
        subprocess.run(["chattr", "+i", str(job.job_dir)], check=True, capture_output=True)
        check_finished(job, uninterrupted)
    finally:
        subprocess.run(["chattr", "-i", str(job.job_dir)], check=False, capture_output=True)
    assert IN_PLACE.format(error="Operation not permitted") in job.log, job.log
    assert job.history() == [(0, "completed", "none")]
    assert "completed -> none" in job.status()


@contextmanager
def small_filesystem(tmp_path: Path, size: str = "16M") -> Iterator[str]:
    """A small ext4 filesystem on a loop device; yields the device. One device, mounted
    wherever the test wants it: every mount of it shares one filesystem, as every
    node of a cluster sees one shared filesystem."""
    image = tmp_path / "job-folder.img"
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    # -m 0: no blocks kept for root, which every process of the sandbox is.
    subprocess.run(["mkfs.ext4", "-q", "-m", "0", "-b", "4096", str(image)], check=True)
    device = subprocess.run(
        ["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        yield device
    finally:
        subprocess.run(["losetup", "--detach", device], check=False)


@contextmanager
def filling(folder: Path) -> Iterator[None]:
    """``folder``'s filesystem kept full (FILL) while the block runs, from when a new
    file first gets no block."""
    filler = subprocess.Popen(["sh", "-c", FILL, "sh", str(folder)])
    probe = folder / "probe"

    def refused() -> bool:
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.write(fd, bytes(8192))
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            return exc.errno == errno.ENOSPC
        finally:
            probe.unlink(missing_ok=True)
        return False

    try:
        wait_for(refused, what=f"{folder} full")
        yield
    finally:
        filler.kill()
        filler.wait()


def test_a_job_folder_that_fills_mid_run_ends_completed_with_its_history_closed(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    with small_filesystem(tmp_path) as device:
        job = submit_mid_run(sandbox, tmp_path, "--sbatch-option", "hold")
        # Held: the job folder becomes the small filesystem (with what sbatch put
        # there) on every node and here, then the job starts.
        stage = tmp_path / "stage"
        stage.mkdir()
        job.job_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", *MOUNT_OPTIONS, device, str(stage)], check=True)
        subprocess.run(["cp", "-a", f"{job.job_dir}/.", str(stage)], check=True)
        subprocess.run(["umount", str(stage)], check=True)
        mount = ["mount", *MOUNT_OPTIONS, device, str(job.job_dir)]
        here = [] if [] in mount_namespaces(sandbox) else [[]]
        with on_every_node(sandbox, [mount], [["umount", "--lazy", str(job.job_dir)]]):
            for prefix in here:
                subprocess.run([*prefix, *mount], check=True)
            try:
                job.run("scontrol", "release", str(job.id))
                job.wait_checkpoint(4)
                with filling(job.job_dir):
                    check_finished(job, uninterrupted)
                assert IN_PLACE.format(error="No space left on device") in job.log, job.log
                assert job.history() == [(0, "completed", "none")]
                assert "completed -> none" in job.status()
            finally:
                for prefix in here:
                    subprocess.run([*prefix, "umount", "--lazy", str(job.job_dir)], check=False)


def test_a_read_only_job_folder_mid_run_ends_completed_and_status_says_so(
    sandbox: Running, tmp_path: Path, uninterrupted: str
) -> None:
    job = submit_mid_run(sandbox, tmp_path)
    job.wait_checkpoint(4)
    folder = str(job.job_dir)
    with on_every_node(
        sandbox,
        setup=[["mount", "--bind", folder, folder], ["mount", "-o", "remount,bind,ro", folder]],
        teardown=[["umount", "--lazy", folder]],
    ):
        check_finished(job, uninterrupted)
        history = job.job_dir / "history.json"
        said = (
            f"hpclaunch[job {job.id}]: supervisor: could not write the job's history {history}: "
            "Read-only file system (EROFS); the job goes on and ends as its step does"
        )
        assert job.log.count(said) == 1, job.log
        assert "Fix: its filesystem is mounted read-only" in job.log
        assert job.history() == [(0, None, None)]  # it could not be closed
        text = job.status()
        assert text.startswith(f"job {job.id} (train): COMPLETED"), text
        assert "history not writable (SLURM: COMPLETED)" in text and "running" not in text, text
        assert (
            f"  note: run 0's end is not in {history}: its supervisor could not write it "
            "(Read-only file system (EROFS)); SLURM says COMPLETED" in text
        ), text
    # Writable again: a later run (requeued by hand) closes what run 0 left open.
    saved = job.committed()
    job.run("scontrol", "requeue", str(job.id))
    wait_for(lambda: job.fields()["Restarts"] == "1", what=f"job {job.id} requeued")
    assert job.wait_end() == "COMPLETED", job.log
    runs = json.loads((job.job_dir / "history.json").read_text())["runs"]
    assert [(r["requeue_count"], r["reason"]) for r in runs] == [(0, "lost"), (1, "completed")]
    assert runs[0]["error"].startswith("no end recorded: its supervisor could not write")
    assert digest_of(job, last=True) == uninterrupted
    assert job.lines("START")[-1]["step"] == saved[-1] + 1
