"""The supervisor's verdicts where they meet SLURM and the filesystem: a hang whose
node SLURM says is lost, a verdict logged only when the job ends for it, a test write
that gets no answer, and a storage error seen on one node of several. SLURM is a
scripted command layer here; the same paths on the sandbox:
tests/integration/test_storage_faults.py and test_hang_verdict.py."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from hpclaunch.jobdir import failures
from hpclaunch.jobdir.errortext import StorageErrno, StorageFault
from hpclaunch.jobdir.failures import Finding, NodeRecord, Verdict, WorkerFailure
from hpclaunch.jobdir.history import History
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.recovery import verdicts
from hpclaunch.recovery.supervisor import StepResult, Supervisor
from hpclaunch.slurm.commands import CommandResult, FakeRunner, NodeState, Slurm

TIMEOUT = "RuntimeError: [unbound_buffer.cc:78] Timed out waiting 30000ms for recv operation"
HANG = Finding(Verdict.HANG, (), TIMEOUT)


def slurm(sinfo: str) -> tuple[Slurm, FakeRunner]:
    fake = FakeRunner(
        {
            "sinfo": lambda argv: CommandResult(argv, 0, sinfo),
            "scontrol": lambda argv: CommandResult(argv, 0),
        }
    )
    return Slurm(fake), fake


def test_a_hang_with_a_lost_node_is_that_node_not_a_hang() -> None:
    up = {"n1": NodeState("allocated"), "n2": NodeState("allocated")}
    assert verdicts.unless_lost(HANG, up, ["n1", "n2"]) == HANG
    for lost in (NodeState("allocated", responding=False), NodeState("down")):
        found = verdicts.unless_lost(HANG, {**up, "n2": lost}, ["n1", "n2"])
        assert found == Finding(Verdict.BAD_NODES, ("n2",), "node lost (n2 down or not responding)")
    # only a hang is reconsidered; a node outside the step changes nothing
    bug = Finding(Verdict.BUG, (), "ValueError")
    assert verdicts.unless_lost(bug, {"n2": NodeState("down")}, ["n1", "n2"]) == bug
    assert verdicts.unless_lost(HANG, {**up, "n9": NodeState("down")}, ["n1", "n2"]) == HANG
    # sinfo's words, through the command layer; SLURM not answering keeps the hang
    asked, fake = slurm("n1 allocated\nn2 allocated*\n")
    assert verdicts.hang_or_lost(HANG, asked, ["n1", "n2"]).nodes == ("n2",)
    assert [call[0] for call in fake.calls] == ["sinfo"]
    assert verdicts.hang_or_lost(HANG, Slurm(FakeRunner({})), ["n1", "n2"]) == HANG


def supervisor(tmp_path: Path, sinfo: str = "n1 allocated\nn2 allocated\n") -> Supervisor:
    env = {"SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "n[1-2]"}
    return Supervisor(env, slurm(sinfo)[0], tmp_path / "41", 3, 2)


def timed_out_everywhere(job_dir: Path) -> None:
    for node, rank in (("n1", 0), ("n2", 1)):
        worker = WorkerFailure(rank, 1, TIMEOUT)
        failures.write(job_dir, NodeRecord(node, rank, 0, 0, float(rank), (worker,)))


def test_the_supervisor_asks_slurm_before_it_calls_a_hang(tmp_path: Path) -> None:
    run = supervisor(tmp_path, sinfo="n1 allocated\nn2 down*\n")
    timed_out_everywhere(tmp_path / "41")
    assert run.after_step(StepResult(1, ())) == 0  # requeued without n2
    history = History.load(tmp_path / "41", 41)
    assert [(r.reason, r.action, r.excluded) for r in history.runs] == [
        ("bad nodes", "requeue", ["n2"])
    ]
    assert run.verdict is None and history.runs[0].verdict is None


def test_a_verdict_is_logged_only_when_the_job_ends_for_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    run = supervisor(tmp_path)
    timed_out_everywhere(tmp_path / "41")
    JobFolder(tmp_path / "41").cancelled.touch()  # `hpclaunch cancel` came first
    run.after_step(StepResult(1, ()))
    assert run.verdict is not None  # the records do say a hang ...
    assert "timed out waiting in a collective" not in caplog.text  # ... it is not why it ended
    assert [r.reason for r in History.load(tmp_path / "41", 41).runs] == ["cancelled"]
    caplog.clear()
    JobFolder(tmp_path / "41").cancelled.unlink()
    supervisor(tmp_path).after_step(StepResult(1, ()))
    assert caplog.text.count("timed out waiting in a collective") == 1


def test_a_test_write_that_gets_no_answer_is_a_storage_verdict(tmp_path: Path) -> None:
    """A hung mount holds the write forever: the supervisor waits a time limit, not
    for ever, and says which folder did not answer."""
    released = threading.Event()

    def hangs(folder: Path) -> OSError | None:
        released.wait()
        return None

    try:
        refused = verdicts.probe_in_time(tmp_path, 0.2, hangs)
        assert isinstance(refused, TimeoutError) and str(refused) == "did not answer in 0.2 s"
        folders = failures.shared_folders(tmp_path, None)
        finding = verdicts.examine([], ["n1"], folders, probe_timeout_s=0.2, write=hangs)
    finally:
        released.set()
    assert finding.verdict is Verdict.STORAGE and finding.storage is not None
    assert finding.storage.errno is StorageErrno.HUNG and finding.storage.folder == folders[0]
    assert finding.message == f"a test write into {tmp_path} did not answer in 0.2 s"
    message = verdicts.explain(finding, 41, tmp_path)
    assert message is not None and message.startswith(
        f"the job folder {tmp_path} cannot be written: did not answer a test write in time"
    )
    assert "(HUNG)" not in message and "lost mount" in message
    # a folder that answers is no verdict; the text of a hung mount is no errno to match
    assert verdicts.probe_in_time(tmp_path, 5.0, verdicts.probe) is None
    assert failures.classify([], ["n1"], folders) == Finding(Verdict.UNKNOWN)


def test_a_storage_error_says_which_hosts_saw_it() -> None:
    ckpt = failures.shared_folders(None, "/scratch/ckpt")[0]
    error = "OSError: [Errno 30] Read-only file system: '/scratch/ckpt/step-4.pt'"
    records = [
        NodeRecord("n1", 0, 0, 0, 0.0, (WorkerFailure(0, 1, "Connection closed by peer"),)),
        NodeRecord("n2", 1, 0, 0, 0.0, (WorkerFailure(1, 1, error),)),
    ]
    finding = failures.classify(records, ["n1", "n2"], [ckpt])
    assert finding == Finding(
        Verdict.STORAGE, (), error, StorageFault(ckpt, StorageErrno.EROFS), ("n2",)
    )
    one = verdicts.explain(finding, 41, None, ["n1", "n2"])
    assert one is not None and "Read-only file system (EROFS), seen on n2 only (of 2 nodes)" in one
    assert "it is that node's mount" in one and "df -h /scratch/ckpt" in one
    assert finding.storage is not None
    every = verdicts.storage_message(finding.storage, 41, ("n1", "n2"), ["n1", "n2"])
    assert "seen on n1, n2. No node is kept out" in every and "that node's mount" not in every
