"""The job record (hpclaunch.record.job_record): a job folder with 3 runs, written by
the modules that write each file, read back typed and whole; ``hpclaunch status`` opens
each of its files once; torn and foreign files are left out, not guessed at."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hpclaunch.jobdir import agent_ends, attempts, failures, hangs, progress_notes, saves, typed
from hpclaunch.jobdir.agent_ends import AgentEnd
from hpclaunch.jobdir.history import History, Run
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.jobdir.progress_notes import NodeProgress, RankProgress
from hpclaunch.ops.status import gather
from hpclaunch.record.job_record import JobRecord

T0 = 1_700_000_000.0


def job_folder(root: Path, pattern_dir: Path) -> JobFolder:
    """A job that ran 3 times on 2 nodes, 2 attempts a run, with a hang, failures, agents'
    end notes, 20 saves, a checkpoint folder and a file of the script's own."""
    job = JobFolder(root)
    runs = []
    for requeue in range(3):
        start = T0 + requeue * 400
        reason, action = ("completed", "none") if requeue == 2 else ("bad nodes", "requeue")
        runs.append(Run(requeue, "n[1-2]", start, start + 300, reason=reason, action=action))
        for node in ("n1", "n2"):
            for number in range(2):
                at = start + 10 + number * 140
                for event in (
                    attempts.AttemptEvent(node, number, attempts.BEGIN, at),
                    attempts.AttemptEvent(
                        node, number, attempts.FIRST, at + 8, 1, None, 0, "checkpoint"
                    ),
                    attempts.AttemptEvent(node, number, attempts.STEP, at + 60, 250),
                    attempts.AttemptEvent(node, number, attempts.END, at + 130, 500, at + 125),
                ):
                    attempts.append(job, requeue, event)
                job.attempt(requeue, "0", number).path.mkdir(parents=True, exist_ok=True)
            ranks = (RankProgress(0, 500, 4.0, 0.3, 5.0, True, 0, "checkpoint"),)
            progress_notes.write(job, requeue, NodeProgress(node, 1, start + 300, ranks))
            agent_ends.write(job, requeue, AgentEnd(node, 1 if requeue < 2 else 0))
        if requeue < 2:
            worker = failures.WorkerFailure(3, 1, "RuntimeError: boom")
            failures.write(root, failures.NodeRecord("n2", 1, requeue, 0, start + 140, (worker,)))
            failures.write_block(root, requeue, "n2", f"== root cause of run {requeue} ==")
    rank = hangs.RankAtHang(0, 0, 100, "S", 12, 30.0, False, "f (t.py:1)")
    report = hangs.HangReport("n1", 0, 1, 0, T0 + 500, "no progress", 20.0, (rank,), (0,), "x", "s")
    hangs.write_report(job, report)
    History(7, 3, runs, signal_lead_s=60.0, checkpoint_patterns=[str(pattern_dir / "*.pt")]).save(
        root
    )
    for index in range(20):
        record = saves.SaveRecord(
            index * 25, False, False, 0.4, 0.6, 10**6, 4, T0 + 30 + index * 55, index * 25 + 1
        )
        saves.append(job.saves, record)
    job.checkpoints.mkdir()
    (job.checkpoints / "step-000000000475.pt").write_bytes(b"x")
    (job.checkpoints / "step-000000000450.pt.damaged").write_bytes(b"x")
    pattern_dir.mkdir()
    (pattern_dir / "snapshot.pt").write_bytes(b"x")
    return job


@contextmanager
def opened_under(root: Path) -> Iterator[Counter[str]]:
    """The files opened and the folders listed under ``root`` while the block runs (the
    interpreter's audit events: every open and every directory listing is one)."""
    seen: Counter[str] = Counter()
    _ACTIVE.append((str(root), seen))
    try:
        yield seen
    finally:
        _ACTIVE.pop()


_ACTIVE: list[tuple[str, Counter[str]]] = []


def _hook(event: str, args: tuple[object, ...]) -> None:
    if not _ACTIVE or event not in ("open", "os.scandir", "os.listdir"):
        return
    root, seen = _ACTIVE[-1]
    path = args[0] if args else None
    if isinstance(path, bytes | str | os.PathLike) and str(os.fspath(path)).startswith(root):
        seen[f"{event} {os.fspath(path)!s}"] += 1


sys.addaudithook(_hook)  # an audit hook stays for the process: it looks only when asked


def test_status_of_a_job_with_3_runs_opens_each_file_once(tmp_path: Path) -> None:
    root = tmp_path / "logs" / "7"
    job_folder(root, tmp_path / "own")
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "HOME": str(tmp_path)}
    with opened_under(tmp_path) as seen:
        status = gather(7, None, env, root, now=T0 + 2000)
    twice = {name: count for name, count in seen.items() if count > 1}
    assert not twice, f"read more than once: {twice}"
    opened = {name.split(" ", 1)[1] for name in seen if name.startswith("open ")}
    assert str(root / "history.json") in opened
    assert str(root / "checkpoint-saves.jsonl") in opened
    assert len([p for p in opened if "/progress/" in p]) == 12  # 3 runs x 2 nodes x 2 files
    # And it read what it says.
    assert [r.requeue for r in status.runs] == [0, 1, 2]
    assert status.checkpoint_step == 475 and status.last_save is not None
    assert status.found_checkpoint == str(tmp_path / "own" / "snapshot.pt")
    assert status.hangs and status.goodput is not None and len(status.lost_work) == 2


def test_the_record_holds_every_file_typed(tmp_path: Path) -> None:
    root = tmp_path / "job"
    job_folder(root, tmp_path / "own")
    record = JobRecord.read(root, 7)
    assert sorted(record.runs) == [0, 1, 2] and record.history_error is None
    run = record.run(1)
    assert [n.node for n in run.notes] == ["n1", "n2"] and run.notes[0].ranks[0].resumed == 0
    assert len(run.events) == 16 and run.events[0].event == "begin"
    assert [h.node for h in run.hangs] == ["n1"] and run.hangs[0].ranks[0].waiting is False
    assert run.ended(("n1", "n2")) == {"n1": 1, "n2": 1}
    assert run.failures[0].workers[0].message == "RuntimeError: boom"
    assert run.block("n9") == "== root cause of run 1 ==\n"  # another node's, when not its own
    assert len(record.saves) == 20 and record.saves[-1].steps_done == 476
    assert [c.step for c in record.checkpoints.committed] == [475]
    assert record.checkpoints.damaged == ("step-000000000450.pt.damaged",)
    assert [f.path.name for f in record.found.found] == ["snapshot.pt"]
    assert len(record.attempt_logs) == 6
    assert record.run(9).notes == ()  # a run it holds nothing of


def test_torn_and_foreign_files_are_left_out(tmp_path: Path) -> None:
    job = JobFolder(tmp_path)
    ranks = (RankProgress(0, 5, 1.0, 0.3, 0.1),)
    progress_notes.write(job, 0, NodeProgress("n1", 0, T0, ranks))
    (job.progress(0) / "node-n2.json").write_text(
        '{"node": "n2", "attempt": 0, "time": 1.0, "ranks": [{"rank": "0"}]}'
    )
    (job.progress(0) / "node-n3.json").write_text('{"node": "n3", "att')
    (job.progress(0) / "attempts-node-n1.jsonl").write_text(
        '{"node": "n1", "attempt": 0, "event": "begin", "time": 1.0}\n{"node": "n1", "attem\n'
        '{"node": "n1", "attempt": "0", "event": "first", "time": 2.0}\n'
    )
    (tmp_path / "history.json").write_text("[not a history")
    record = JobRecord.read(tmp_path, 7)
    assert [n.node for n in record.run(0).notes] == ["n1"]
    assert [e.event for e in record.run(0).events] == ["begin"]
    assert record.history_error is not None and "history.json" in record.history_error
    assert record.history.runs == []


def test_typed_loading_names_the_field_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match=r"RankProgress.step: '5' is not an int"):
        typed.load(
            RankProgress, {"rank": 0, "step": "5", "steps_per_s": None, "slowest_s": 0, "idle_s": 0}
        )
    with pytest.raises(ValueError, match="RankProgress: no idle_s"):
        typed.load(RankProgress, {"rank": 0, "step": 5, "steps_per_s": None, "slowest_s": 0})
    with pytest.raises(ValueError, match=r"AgentEnd\.status: True is not an int"):
        typed.load(AgentEnd, {"node": "n1", "status": True})
    # A newer writer's field is ignored, an older one's missing field takes its default.
    note = typed.load(
        RankProgress,
        {"rank": 0, "step": 5, "steps_per_s": 1, "slowest_s": 0, "idle_s": 0, "new": 1},
    )
    assert note.steps_per_s == 1.0 and note.resumed is None
    assert typed.load(AgentEnd, json.loads('{"node": "n1", "status": 143}')) == AgentEnd("n1", 143)
