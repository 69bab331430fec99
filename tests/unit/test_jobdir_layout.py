"""The job folder's paths, pinned to the names earlier versions wrote: a folder one
version wrote must be read by the next, so a renamed file fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpclaunch.jobdir import atomic, layout
from hpclaunch.jobdir.layout import AttemptFolder, ExecutorFolder, JobFolder, RankFile
from hpclaunch.record.job_record import JobRecord

ROOT = Path("/s/logs/12")


def test_where_a_job_folder_is() -> None:
    assert JobFolder.of("/s/logs", 12) == JobFolder(ROOT)
    assert JobFolder.of(Path("/s/logs"), "12").root == ROOT
    assert JobFolder.from_env({}, 12).root == Path("hpclaunch-logs/12")
    assert JobFolder.from_env({"HPCLAUNCH_JOB_DIR": "/s/12"}, 12).root == Path("/s/12")
    assert JobFolder.from_env({"HPCLAUNCH_JOB_DIR": "  "}, 12).root == Path("hpclaunch-logs/12")
    assert layout.JOB_DIR_VAR == "HPCLAUNCH_JOB_DIR"


def test_every_file_of_the_job_folder_keeps_its_name() -> None:
    job = JobFolder(ROOT)
    assert str(job.script) == "/s/logs/12/job.sbatch"
    assert str(job.history) == "/s/logs/12/history.json"
    assert str(job.cancelled) == "/s/logs/12/cancelled"
    assert str(job.checkpoints) == "/s/logs/12/checkpoints"
    assert str(job.logs) == "/s/logs/12/logs"
    assert str(job.local_requeues) == "/s/logs/12/local-requeues"
    assert str(job.failures(1)) == "/s/logs/12/failures/requeue-1"
    assert (
        str(job.failure_record(1, 2, "n3"))
        == "/s/logs/12/failures/requeue-1/attempt-2/node-n3.json"
    )
    assert str(job.root_cause(1, "n3")) == "/s/logs/12/failures/requeue-1/root-cause-n3.txt"
    assert str(job.agent_end(1, "n3")) == "/s/logs/12/agents/requeue-1/node-n3.json"
    assert str(job.deputy(1)) == "/s/logs/12/agents/requeue-1/deputy.json"


def test_rank_logs_keep_their_names() -> None:
    attempt = JobFolder(ROOT).attempt(1, "0", 2)
    assert attempt == AttemptFolder(1, "0", 2, Path("/s/logs/12/logs/requeue-1/step-0/attempt-2"))
    assert attempt.label == "requeue 1, step 0, attempt 2"
    folder = "/s/logs/12/logs/requeue-1/step-0/attempt-2"
    assert str(attempt.rank_file(7, RankFile.OUT)) == f"{folder}/rank-7.out"
    assert str(attempt.rank_file(7, RankFile.ERR)) == f"{folder}/rank-7.err"
    assert str(attempt.rank_file(7, RankFile.ERROR)) == f"{folder}/rank-7.json"
    assert str(attempt.node_ranks_file("n1")) == f"{folder}/node-n1.ranks"
    assert str(JobFolder(ROOT).attempt(0, "batch", 0).path).endswith(
        "requeue-0/step-batch/attempt-0"
    )


def test_the_batch_log_and_the_executor_files_keep_their_names() -> None:
    assert layout.BATCH_LOG_PATTERN == "%x-%j.out"
    assert str(layout.batch_log(Path("/s/logs"), "train", 12)) == "/s/logs/train-12.out"
    executor = ExecutorFolder(Path("/x"))
    assert str(executor.info("123_4")) == "/x/123_4_hpclaunch.json"
    assert str(executor.finished_root("7")) == "/x/.7_finished"
    run = {"HPCLAUNCH_REQUEUE_COUNT": "1", "SLURM_STEP_ID": "0", "HPCLAUNCH_ATTEMPT": "2"}
    assert str(executor.finished("7", run)) == "/x/.7_finished/1-0-2"
    assert str(executor.finished("7", {})) == "/x/.7_finished/0-0-0"


def old_folder(root: Path) -> Path:
    """A job folder as the previous version wrote it, by hand: the names are literal."""
    for name in (
        "requeue-1/step-0/attempt-0",
        "requeue-0/step-1/attempt-0",
        "requeue-0/step-batch/attempt-1",
        "requeue-0/step-0/attempt-10",
        "requeue-0/step-0/attempt-2",
    ):
        (root / "logs" / name).mkdir(parents=True)
    (root / "logs" / "requeue-x" / "step-0" / "attempt-0").mkdir(parents=True)  # not ours
    (root / "logs" / "requeue-0" / "step-0" / "attempt-3").write_text("a file, not a folder")
    ranks = root / "logs" / "requeue-0" / "step-0" / "attempt-2"
    (ranks / "node-n1.ranks").write_text("[0, 1]\n")
    (ranks / "node-n2.ranks").write_text("not json")
    for requeue in ("requeue-2", "requeue-0", "requeue-y"):
        (root / "failures" / requeue / "attempt-0").mkdir(parents=True)
    (root / "failures" / "requeue-2" / "attempt-0" / "node-n2.json").write_text(
        '{"node": "n2", "node_rank": 1, "requeue_count": 2, "attempt": 0, "time": 5.0, '
        '"workers": [{"rank": 3, "exitcode": 1, "message": "ValueError: bad"}]}'
    )
    (root / "failures" / "requeue-2" / "root-cause-n2.txt").write_text("block\n")
    return root


def test_attempts_of_an_old_folder_are_listed_in_run_order(tmp_path: Path) -> None:
    job = JobFolder(old_folder(tmp_path))
    found = [(a.requeue, a.step, a.attempt) for a in job.attempts()]
    assert found == [(0, "batch", 1), (0, "0", 2), (0, "0", 10), (0, "1", 0), (1, "0", 0)]
    assert job.attempts()[1].node_ranks() == {"n1": [0, 1]}  # an unreadable note is skipped
    assert JobFolder(tmp_path / "missing").attempts() == []


def test_failure_files_of_an_old_folder_are_found(tmp_path: Path) -> None:
    record = JobRecord.read(old_folder(tmp_path), 7)
    assert [q for q, run in record.runs.items() if run.failures or run.root_causes] == [2]
    assert [(r.node, r.workers[0].message) for r in record.run(2).failures] == [
        ("n2", "ValueError: bad")
    ]
    assert [node for node, _ in record.run(2).root_causes] == ["n2"]
    assert record.run(0).root_causes == () and record.run(5).failures == ()


def test_node_ranks_round_trip(tmp_path: Path) -> None:
    attempt = JobFolder(tmp_path).attempt(0, "0", 0)
    attempt.path.mkdir(parents=True)
    attempt.write_node_ranks("n7", [3, 2])
    assert json.loads((attempt.path / "node-n7.ranks").read_text()) == [3, 2]
    assert attempt.node_ranks() == {"n7": [3, 2]}


def test_write_atomic_replaces_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    atomic.write_bytes_atomic(target, b"one")
    atomic.write_bytes_atomic(target, b"two")
    assert target.read_bytes() == b"two"

    def fail(handle: object) -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic.write_atomic(target, fail, replace=True)
    assert target.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temporary file left
    assert atomic.write_atomic(target, lambda h: h.write(b"three")) is False
