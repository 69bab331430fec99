"""Right verdicts from plain strings and records: error texts compared without what
varies run to run, a shared folder that refuses the job's files blamed on no node,
a hang that is not a bug; and how the supervisor's history and `hpclaunch status`
show them. (The same faults on the sandbox: tests/integration/test_storage_faults.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpclaunch.cli.format import render_status
from hpclaunch.jobdir import failures
from hpclaunch.jobdir.errortext import (
    SharedFolder,
    StorageErrno,
    StorageFault,
    normalise,
    same_error,
    storage_fault,
    timed_out,
)
from hpclaunch.jobdir.failures import Finding, NodeRecord, Verdict, WorkerFailure, classify
from hpclaunch.jobdir.history import Action, History, HistoryError, Reason, finish
from hpclaunch.ops.status import gather
from hpclaunch.recovery import verdicts
from hpclaunch.recovery.policy import Decision, Situation, decide
from hpclaunch.slurm.commands import CommandResult, FakeRunner, Slurm

CKPT = "/scratch/me/run7/ckpt"
JOB_DIR = "/home/me/hpclaunch-logs/41"
SHARED = failures.shared_folders(JOB_DIR, CKPT)
# What rank 0 and the others say when the checkpoint folder is full (as
# hpclaunch.checkpoint.save words it; seen on a full tmpfs).
FULL_RANK0 = (
    f"hpclaunch.checkpoint.store.CheckpointError: the save of step 9 ({CKPT}/step-000000000009"
    ".pt) failed: OSError: [Errno 28] No space left on device; it was not committed, the "
    "previous checkpoints stay"
)
FULL_OTHERS = (
    f"hpclaunch.checkpoint.store.CheckpointError: the save of step 9 ({CKPT}/step-000000000009"
    ".pt) failed on rank 0: [Errno 28] No space left on device (its log says more); it was not "
    "committed, the previous checkpoints stay"
)
READ_ONLY = f"OSError: [Errno 30] Read-only file system: '{CKPT}/.step-000000000004.pt.tmp-3301'"
TIMEOUT = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78]"
    " Timed out waiting 30000ms for recv operation to complete"
)
PEER = "RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.2]:3344."


def rec(node: str, attempt: int, *workers: tuple[int, int, str]) -> NodeRecord:
    return NodeRecord(
        node,
        int(node[1:]) - 1,
        0,
        attempt,
        float(attempt),
        tuple(WorkerFailure(*w) for w in workers),
    )


@pytest.mark.parametrize(
    ("one", "other"),
    [
        # pids, ports, IPv4 and IPv6 addresses, host:port
        ("worker (pid 3301) lost its store", "worker (pid 77120) lost its store"),
        ("Connection refused: 10.1.4.7:29500", "Connection refused: 10.1.9.12:31877"),
        ("connect to [fe80::1:2]:29500 failed", "connect to [2001:db8::17]:41234 failed"),
        ("peer ::ffff:10.0.0.3 gone", "peer 2001:db8:0:0:1:0:0:1 gone"),
        ("store at n12.cluster:29500 timed out", "store at n7.cluster:31001 timed out"),
        # pointers and ids, times and dates, durations and sizes
        ("bad tensor at 0x7f3a9c001e40", "bad tensor at 0x55d2b10a3f00"),
        ("at 2026-11-24T17:25:49.509Z: boom", "at 2026-12-01 08:01:02: boom"),
        ("I1124 17:25:49.509000 boom", "I1124 09:03:11.000417 boom"),
        (
            ".step-4.tmp-93a27944_6e3b_4878_aa2b_4aafee54a7b9",
            ".step-4.tmp-0c9f1d2e-aaaa-4bbb-8ccc-0123456789ab",
        ),
        ("Timed out waiting 30000ms", "Timed out waiting 1800000ms"),
        ("no answer in 30 s (PID: 17)", "no answer in 2.5 s (PID: 9120)"),
        (
            "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600005 milliseconds",
            "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800017 milliseconds",
        ),
        ("listening on port=29500 failed", "listening on port=31877 failed"),
        # blanks
        ("a  b\tc ", "a b c"),
    ],
)
def test_what_varies_run_to_run_is_not_the_error(one: str, other: str) -> None:
    assert normalise(one) == normalise(other)
    assert same_error(one, ["something else", other])


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("rank 2: node n2 is bad", "rank 2: node n3 is bad"),  # a digit of a name is the name's
        ("CUDA error: out of memory", "CUDA error: an illegal memory access"),
        ("OSError: [Errno 28] No space left on device", "OSError: [Errno 30] Read-only file"),
        ("cuda0 failed", "cuda1 failed"),
        # a device's, a rank's, a step's number is part of the error: an error that
        # follows its rank must not look like one that follows a GPU
        ("RuntimeError: ECC error on GPU 3", "RuntimeError: ECC error on GPU 5"),
        ("ValueError: bad value at step 3", "ValueError: bad value at step 11"),
        ("rank 3 lost its input", "rank 5 lost its input"),
    ],
)
def test_different_errors_stay_different(one: str, other: str) -> None:
    assert normalise(one) != normalise(other)
    assert not same_error(one, [other])


def test_storage_faults_need_a_storage_error_on_a_shared_folder() -> None:
    ckpt, job = SHARED
    assert (ckpt.role, job.role) == ("checkpoint folder", "job folder")
    assert storage_fault(FULL_RANK0, SHARED) == StorageFault(ckpt, StorageErrno.ENOSPC)
    assert storage_fault(FULL_OTHERS, SHARED) == StorageFault(ckpt, StorageErrno.ENOSPC)
    assert storage_fault(READ_ONLY, SHARED) == StorageFault(ckpt, StorageErrno.EROFS)
    quota = f"OSError: [Errno 122] Disk quota exceeded: '{JOB_DIR}/logs/requeue-0/x'"
    assert storage_fault(quota, SHARED) == StorageFault(job, StorageErrno.EDQUOT)
    denied = f"PermissionError: [Errno 13] Permission denied: '{JOB_DIR}'"
    assert storage_fault(denied, SHARED) == StorageFault(job, StorageErrno.EACCES)
    # a node's own disk, a folder that merely starts like the shared one, no errno text
    assert storage_fault("OSError: [Errno 28] No space left on device: '/tmp/x'", SHARED) is None
    assert storage_fault(f"No space left on device: '{CKPT}-old/x'", SHARED) is None
    assert storage_fault(f"No space left on device: '/home/u{CKPT}/x'", SHARED) is None
    assert storage_fault(f"No space left on device: '.{CKPT}/x'", SHARED) is None
    assert storage_fault(f"No space left on device ({CKPT}/x)", SHARED) is not None
    assert storage_fault(f"{CKPT}/x: No space left on device", SHARED) is not None
    assert storage_fault(f"RuntimeError: file write failed: {CKPT}/x", SHARED) is None
    assert storage_fault(FULL_RANK0, ()) is None


def test_a_shared_folder_is_found_by_its_real_path(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    folder = SharedFolder("checkpoint folder", str(tmp_path / "link"), "--checkpoint-dir")
    assert folder.named_in(f"Read-only file system: '{real}/step-1.pt'")
    assert folder.named_in(f"Read-only file system: '{tmp_path}/link/step-1.pt'")
    assert not folder.named_in(f"Read-only file system: '{tmp_path}/other/step-1.pt'")


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        # the rank 0 that saves is on n1; n2's ranks learn of it: the storage, no node
        (
            [rec("n1", 0, (0, 1, FULL_RANK0), (1, -15, PEER)), rec("n2", 0, (2, 1, FULL_OTHERS))],
            Finding(
                Verdict.STORAGE,
                (),
                FULL_RANK0,
                StorageFault(SHARED[0], StorageErrno.ENOSPC),
                ("n1", "n2"),
            ),
        ),
        # only rank 0's node wrote a record (its own errors only): still no node to blame
        (
            [rec("n1", 0, (0, 1, READ_ONLY)), rec("n1", 1, (0, 1, READ_ONLY))],
            Finding(
                Verdict.STORAGE, (), READ_ONLY, StorageFault(SHARED[0], StorageErrno.EROFS), ("n1",)
            ),
        ),
        # every failed rank timed out waiting: a hang, not a bug
        (
            [rec("n1", 0, (0, 1, TIMEOUT), (1, 1, TIMEOUT)), rec("n2", 0, (3, 1, TIMEOUT))],
            Finding(Verdict.HANG, (), TIMEOUT),
        ),
        (
            [rec("n1", 0, (0, 1, TIMEOUT)), rec("n2", 0, (2, -15, "x"), (3, 1, TIMEOUT))],
            Finding(Verdict.HANG, (), TIMEOUT),
        ),
        # a node with an error of its own, and ranks elsewhere that timed out waiting for it
        (
            [rec("n1", 0, (0, 1, TIMEOUT)), rec("n2", 0, (2, 1, "CUDA error: ECC"))],
            Finding(Verdict.BAD_NODES, ("n2",), "CUDA error: ECC"),
        ),
    ],
)
def test_classify_storage_and_hangs(records: list[NodeRecord], expected: Finding) -> None:
    assert classify(records, ["n1", "n2"], SHARED) == expected


def test_the_culprit_of_storage_said_so_and_a_hang_has_none() -> None:
    records = [rec("n1", 0, (0, 1, PEER)), rec("n2", 0, (2, 1, FULL_RANK0))]
    finding = classify(records, ["n1", "n2"], SHARED)
    assert finding.verdict is Verdict.STORAGE and failures.culprit(records, finding) == "n2"
    hang = [rec("n1", 0, (0, 1, TIMEOUT)), rec("n2", 0, (2, 1, TIMEOUT))]
    assert failures.culprit(hang, classify(hang, ["n1", "n2"], SHARED)) is None


def test_timeouts_of_gloo_nccl_and_the_store() -> None:
    assert timed_out(TIMEOUT)
    assert timed_out(
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) "
        "ran for 600012 milliseconds before timing out."
    )
    assert timed_out("torch.distributed.DistStoreError: wait timeout after 300000ms, keys: /x")
    assert not timed_out("ValueError: bad value at step 3")
    assert not timed_out(PEER)


def test_storage_and_hangs_end_the_job_without_blaming_a_node() -> None:
    storage = Finding(Verdict.STORAGE, (), READ_ONLY, StorageFault(SHARED[0], StorageErrno.EROFS))
    for spent in (0, 2):  # never a requeue, whatever is left of the budgets
        situation = Situation(1, None, 0, None, 3, storage, failure_requeues=spent)
        assert decide(situation) == Decision(Action.NONE, Reason.STORAGE, 1)
    hang = Situation(1, None, 0, None, 3, Finding(Verdict.HANG, (), TIMEOUT))
    assert decide(hang) == Decision(Action.NONE, Reason.HANG, 1)


def test_an_error_follows_its_rank_whatever_its_pid_and_port() -> None:
    now = "RuntimeError: rank 3 (pid 4412) could not reach 10.0.0.5:29517"
    before = "RuntimeError: rank 3 (pid 918) could not reach 10.0.0.9:29601"
    bad = Finding(Verdict.BAD_NODES, ("n3",), now)
    again = Situation(1, None, 1, None, 3, bad, failure_requeues=1, earlier_errors=(before,))
    assert decide(again) == Decision(Action.NONE, Reason.BUG, 1)
    other = Situation(1, None, 1, None, 3, bad, failure_requeues=1, earlier_errors=("CUDA",))
    assert decide(other) == Decision(Action.REQUEUE, Reason.BAD_NODES, 0, ("n3",))


def test_the_messages_name_the_folder_the_error_and_the_fix() -> None:
    fault = StorageFault(SHARED[0], StorageErrno.ENOSPC)
    message = verdicts.explain(Finding(Verdict.STORAGE, (), FULL_RANK0, fault), 41, None)
    assert message is not None
    for part in (
        f"checkpoint folder {CKPT}",
        "No space left on device",
        "free space",
        "No node is kept out",
        "scontrol requeue 41",
        "--checkpoint-dir",
    ):
        assert part in message, part
    fault = StorageFault(SHARED[1], StorageErrno.EROFS)
    message = verdicts.storage_message(fault, 41)
    assert f"job folder {JOB_DIR}" in message and "read-only" in message and "--log-dir" in message
    hang = verdicts.explain(Finding(Verdict.HANG, (), TIMEOUT), 41, Path(JOB_DIR))
    assert hang is not None and "not an error in the script" not in hang
    assert "timed out waiting in a collective" in hang and "a rank hung, or the ranks" in hang
    assert f"{JOB_DIR}/logs" in hang
    assert verdicts.explain(Finding(Verdict.BUG, (), "x"), 41, None) is None


def test_probe_passes_a_writable_folder_and_leaves_nothing(tmp_path: Path) -> None:
    assert verdicts.probe(tmp_path) is None
    assert os.listdir(tmp_path) == []
    assert verdicts.probe(tmp_path / "missing") is None  # not created yet: no verdict
    records = [rec("n1", 0, (0, 1, "ValueError: bad"))]
    shared = failures.shared_folders(tmp_path, None)
    assert verdicts.examine(records, ["n1"], shared).verdict is Verdict.BUG


def test_status_shows_the_verdict_of_a_storage_failure(tmp_path: Path) -> None:
    job_dir = tmp_path / "logs" / "41"
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    history = History(41, 3, checkpoint_dir=str(ckpt))
    run = history.start({"SLURM_JOB_NODELIST": "n[1-2]"}, 0)
    message = READ_ONLY.replace(CKPT, str(ckpt))
    failures.write(job_dir, failures.record_of("n1", 0, 0, 0, []))  # a record, as an agent's
    failures.write(job_dir, NodeRecord("n1", 0, 0, 1, 1.0, (WorkerFailure(0, 1, message),)))
    failures.write_block(job_dir, 0, "n1", "== block of n1 ==")
    fault = StorageFault(failures.shared_folders(job_dir, ckpt)[0], StorageErrno.EROFS)
    verdict = verdicts.storage_message(fault, 41)
    finish(run, 1, None, Decision(Action.NONE, Reason.STORAGE, 1), message, verdict)
    history.save(job_dir)
    assert History.load(job_dir, 41).runs[0].verdict == verdict

    def scontrol(argv: tuple[str, ...]) -> CommandResult:
        return CommandResult(argv, 0, "JobId=41 JobState=FAILED NodeList=n[1-2] ExitCode=1:0\n")

    status = gather(41, Slurm(FakeRunner({"scontrol": scontrol})), {}, job_dir)
    assert status.verdict == verdict and status.excluded == []
    assert status.root_cause == "== block of n1 =="
    text = render_status(status)
    assert f"  verdict:         the checkpoint folder {ckpt} cannot be written: Read-only" in text
    assert "shared folder not writable -> none" in text


def test_a_history_with_fields_this_version_does_not_know_loads(tmp_path: Path) -> None:
    """An older hpclaunch reads a newer one's history (the ``verdict`` field, and
    whatever comes later) and the other way round: unknown fields are left out."""
    history = History(41, 3)
    history.start({"SLURM_JOB_NODELIST": "n1"}, 0)
    history.save(tmp_path)
    path = tmp_path / "history.json"
    data = json.loads(path.read_text())
    data["runs"][0]["from_a_newer_version"] = {"x": 1}
    del data["runs"][0]["verdict"]  # as an older version wrote it
    path.write_text(json.dumps(data))
    loaded = History.load(tmp_path, 41)
    assert [(r.requeue_count, r.nodes, r.verdict) for r in loaded.runs] == [(0, "n1", None)]
    data["runs"][0].pop("nodes")  # a field it needs is still required
    path.write_text(json.dumps(data))
    with pytest.raises(HistoryError, match="not a history hpclaunch wrote"):
        History.load(tmp_path, 41)
