"""The pure parts of a lost batch host's deputy (hpclaunch.recovery.deputy): reading
``scontrol show job``, telling a lost batch host, the exactly-once claim, the agents'
notes of their ends, and where libslurm is looked for. The deputy itself runs on the
sandbox (tests/integration/test_batch_host_lost.py)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from hpclaunch.jobdir import agent_ends
from hpclaunch.jobdir.agent_ends import AgentEnd
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.record.job_record import read_run
from hpclaunch.recovery import deputy
from hpclaunch.recovery.deputy import JobView, lost_batch_host
from hpclaunch.slurm import libslurm
from hpclaunch.slurm.commands import NodeState, parse_show_job

# What SLURM 22.05 printed on the sandbox after the batch host n1 of a --no-kill job died.
AFTER_LOSS = (
    "JobId=2 JobName=j.sh UserId=root(0) JobState=RUNNING Reason=None Restarts=0 "
    "NodeList=n[2-3] BatchHost=n1 NumNodes=2 StdOut=/tmp/exp/j-2.out"
)
UP = NodeState("mixed")


def view(text: str) -> JobView:
    return JobView.of(parse_show_job(text))


def test_a_batch_host_slurm_took_out_of_the_job_is_lost() -> None:
    job = view(AFTER_LOSS)
    assert job.nodes == ("n2", "n3") and job.batch_log == "/tmp/exp/j-2.out"
    assert lost_batch_host(job, {"n2": UP, "n3": UP}) == "n1"
    assert "runs on n2,n3" in deputy.why_lost(job, "n1")


def test_a_batch_host_still_in_the_job_is_lost_only_when_slurm_marks_it_so() -> None:
    job = view(AFTER_LOSS.replace("NodeList=n[2-3]", "NodeList=n[1-3]"))
    assert lost_batch_host(job, {"n1": UP}) is None
    assert lost_batch_host(job, {}) is None  # sinfo did not list it: no verdict
    assert lost_batch_host(job, {"n1": NodeState("down")}) == "n1"
    assert lost_batch_host(job, {"n1": NodeState("down", responding=False)}) == "n1"
    # Not heard from lately is no verdict by itself: the probe of its slurmd decides.
    busy = {"n1": NodeState("mixed", responding=False)}
    assert lost_batch_host(job, busy) is None
    assert deputy.silent(job, busy) and not deputy.silent(job, {"n1": UP})
    assert "does not answer" in deputy.why_lost(job, "n1")


@pytest.mark.parametrize("state", ["COMPLETING", "COMPLETED", "PENDING", "REQUEUED"])
def test_a_job_that_is_not_running_has_nothing_to_take_over(state: str) -> None:
    job = view(AFTER_LOSS.replace("JobState=RUNNING", f"JobState={state}"))
    assert lost_batch_host(job, {}) is None


def test_a_relative_or_missing_batch_log_is_not_written() -> None:
    assert view(AFTER_LOSS.replace("StdOut=/tmp/exp/j-2.out", "StdOut=j-2.out")).batch_log is None
    assert view(AFTER_LOSS.replace(" StdOut=/tmp/exp/j-2.out", "")).batch_log is None


def _claim(root: str, node: str, start: Any, results: Any) -> None:
    start.wait()
    holder = deputy.claim(JobFolder(Path(root)), 3, node, "n1")
    results.put((node, holder))


def test_exactly_one_of_racing_agents_takes_the_role(tmp_path: Path) -> None:
    nodes = [f"n{i}" for i in range(2, 10)]
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(str(tmp_path), n, start, results)) for n in nodes]
    for proc in procs:
        proc.start()
    start.set()
    got = dict(results.get(timeout=30) for _ in nodes)
    for proc in procs:
        proc.join(timeout=30)
    winners = [node for node, holder in got.items() if holder is None]
    assert len(winners) == 1, got
    assert {holder for holder in got.values() if holder is not None} == set(winners)
    assert deputy.taken_by(tmp_path, 3) == winners[0]
    assert deputy.taken_by(tmp_path, 4) is None  # another run's role is its own


def test_the_supervisor_stands_down_only_for_its_own_run(tmp_path: Path) -> None:
    assert not deputy.stood_down(tmp_path, 0)
    assert deputy.claim(JobFolder(tmp_path), 0, "n2", "n1") is None
    assert deputy.stood_down(tmp_path, 0)
    assert not deputy.stood_down(tmp_path, 1)


def test_the_agents_ends_are_read_back_by_node(tmp_path: Path) -> None:
    folder = JobFolder(tmp_path)
    agent_ends.write(folder, 0, AgentEnd("n2", 0))
    agent_ends.write(folder, 0, AgentEnd("n3", 1))
    folder.agent_end(0, "n4").write_text("{not json")
    assert read_run(tmp_path, 0).ended(("n2", "n3", "n4", "n5")) == {"n2": 0, "n3": 1}
    assert read_run(tmp_path, 1).ended(("n2",)) == {}


def test_a_job_stopped_by_a_signal_is_left_to_its_supervisor(tmp_path: Path) -> None:
    # 128 + SIGUSR1: the supervisor passed the warning on, so it is there to act; the
    # agent asks SLURM nothing (no runner would answer here) and notes nothing.
    status = deputy.after_agent(
        138, job_id=2, requeue=0, node="n2", job_dir=tmp_path, slurm=None, env={}
    )  # type: ignore[arg-type]
    assert status == 138 and not JobFolder(tmp_path).agents(0).exists()


def test_slurm_is_given_the_wait_status_of_the_exit() -> None:
    assert libslurm.wait_status(0) == 0
    assert libslurm.wait_status(4) == 4 << 8
    with pytest.raises(ValueError, match="not 256"):
        libslurm.wait_status(256)


def test_libslurm_is_looked_for_beside_scontrol_first(tmp_path: Path) -> None:
    bin_dir = tmp_path / "usr" / "bin"
    bin_dir.mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "x86_64-linux-gnu").mkdir(parents=True)
    found = libslurm.candidates(str(bin_dir / "scontrol"), "libslurm.so.38")
    usr = (tmp_path / "usr").resolve()
    assert found[0] == usr / "lib" / "libslurm.so"
    assert usr / "lib" / "x86_64-linux-gnu" / "slurm-wlm" / "libslurmfull.so" in found
    assert found[-1] == Path("libslurm.so.38")
    assert libslurm.candidates(None, None) == []


def test_a_link_retried_by_nfs_that_says_eexist_to_its_maker_is_still_its_claim(
    tmp_path: Path,
) -> None:
    # NFSv3: the LINK's reply is lost, the retry is answered EEXIST, yet the note in
    # place is this agent's: it must act, or no agent would.
    import json
    import os

    from hpclaunch.recovery.deputy import linked_by_us

    path = tmp_path / "deputy.json"
    note = {"node": "n2", "pid": os.getpid(), "lost": "n1", "why": "silent", "at": 5.0}
    mine = tmp_path / ".deputy.json.n2.1"
    mine.write_text(json.dumps(note))
    os.link(mine, path)  # the first LINK, whose reply was lost
    assert linked_by_us(mine, path, note)
    mine.unlink()  # the link count cannot tell now; the note's content still does
    mine.write_text(json.dumps(note))
    assert linked_by_us(mine, path, note)
    other = {**note, "node": "n3", "pid": 1}
    path.unlink()
    path.write_text(json.dumps(other))
    assert not linked_by_us(mine, path, note)
