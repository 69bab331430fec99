"""Tracebacks of failed ranks and the root-cause block: plain values and files in tmp_path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpclaunch.jobdir.joblogs import (
    Failure,
    describe_exit,
    root_cause_block,
    traceback_of,
)

TRACE = [
    "[rank3]: Traceback (most recent call last):",
    '[rank3]:   File "train.py", line 9, in <module>',
    "[rank3]: ValueError: bad batch",
]


@pytest.mark.parametrize(
    ("code", "text"),
    [(1, "exit code 1"), (-9, "killed by SIGKILL (exit code -9)"), (-77, "killed by signal 77")],
)
def test_describe_exit(code: int, text: str) -> None:
    assert describe_exit(code).startswith(text)


def test_traceback_from_the_error_file_first(tmp_path: Path) -> None:
    error = tmp_path / "rank-3.json"
    stack = "Traceback (most recent call last):\n  ...\nValueError: recorded"
    error.write_text(
        json.dumps(
            {"message": {"message": "ValueError: recorded", "extraInfo": {"py_callstack": stack}}}
        )
    )
    stderr = tmp_path / "rank-3.err"
    stderr.write_text("\n".join(TRACE) + "\n")
    failure = Failure(3, 1, 1, 100, 0.0, str(error), str(stderr))
    assert traceback_of(failure) == (stack, str(error))
    error.write_text("not json")  # a broken error file: fall back to stderr
    assert traceback_of(failure) == ("\n".join(TRACE), str(stderr))


def test_traceback_from_stderr_takes_the_last_one_or_the_tail(tmp_path: Path) -> None:
    stderr = tmp_path / "rank-0.err"
    stderr.write_text("noise\nTraceback (most recent call last):\nOld: one\n" + "\n".join(TRACE))
    failure = Failure(0, 0, 1, 1, 0.0, "", str(stderr))
    assert traceback_of(failure)[0] == "\n".join(TRACE)
    stderr.write_text("".join(f"line {i}\n" for i in range(50)))
    text, _ = traceback_of(failure)
    assert text.splitlines() == [f"line {i}" for i in range(30, 50)]
    assert traceback_of(Failure(0, 0, 1, 1, 0.0, "", str(tmp_path / "missing"))) == ("", "")


def test_root_cause_block_blames_the_failure_not_the_workers_the_agent_stopped(
    tmp_path: Path,
) -> None:
    stderr = tmp_path / "rank-3.err"
    stderr.write_text("\n".join(TRACE) + "\n")
    failures = [
        Failure(2, 0, -15, 41, 1000.0, "", str(tmp_path / "rank-2.err")),  # stopped by the agent
        Failure(3, 1, 1, 42, 1000.0, "", str(stderr)),
    ]
    block = root_cause_block(
        failures,
        job_id=5,
        host="n2",
        node_rank=1,
        command=("python", "-u", "train.py", "--lr", "1"),
    )
    lines = block.splitlines()
    assert lines[1] == "hpclaunch: job 5 failed on node 1 (n2)"
    assert lines[2] == "  command   : python -u train.py --lr 1"
    assert lines[3] == (
        "  root cause: rank 3 (local rank 1, pid 42), exit code 1, at 1970-01-01 00:16:40 UTC"
    )
    assert f"  traceback (from {stderr}):" in lines
    assert "    [rank3]: ValueError: bad batch" in lines
    assert lines[-2] == "  then      : rank 2 (local rank 0), killed by SIGTERM (exit code -15)"
    with pytest.raises(ValueError, match="at least one failure"):
        root_cause_block([], job_id=5, host="n2", node_rank=1, command=())


def test_root_cause_without_any_traceback() -> None:
    block = root_cause_block(
        [Failure(0, 0, -9, 1, 5.0)], job_id=1, host="n1", node_rank=0, command=("app",)
    )
    assert "killed by SIGKILL (exit code -9)" in block
    assert "traceback : none recorded" in block


def test_root_cause_is_the_rank_that_ended_first_within_the_same_second(tmp_path: Path) -> None:
    # Rank 3 raises; rank 2 then fails in gloo because rank 3 went away. torch gives both
    # the same whole second; their stderr logs, written last before exit, say who was first.
    first = tmp_path / "rank-3.err"
    first.write_text("\n".join(TRACE) + "\n")
    then = tmp_path / "rank-2.err"
    then.write_text("[rank2]: RuntimeError: Connection closed by peer\n")
    os.utime(first, ns=(1_000_100_000_000, 1_000_100_000_000))
    os.utime(then, ns=(1_000_300_000_000, 1_000_300_000_000))
    failures = [
        Failure(2, 0, 1, 41, 1000.0, "", str(then)),
        Failure(3, 1, 1, 42, 1000.0, "", str(first)),
    ]
    block = root_cause_block(failures, job_id=5, host="n2", node_rank=1, command=("app",))
    assert "root cause: rank 3 (local rank 1, pid 42), exit code 1" in block
    assert block.splitlines()[-2] == "  then      : rank 2 (local rank 0), exit code 1"
    os.utime(then, ns=(1_000_050_000_000, 1_000_050_000_000))  # now rank 2 was first
    block = root_cause_block(failures, job_id=5, host="n2", node_rank=1, command=("app",))
    assert "root cause: rank 2 (local rank 0, pid 41)" in block


def test_root_cause_of_lightnings_default_trainer_says_what_to_set(tmp_path: Path) -> None:
    """Lightning's Trainer() counts one device on one node and refuses the launch; the
    block names the fix (its message alone blames the user's devices and num_nodes)."""
    stderr = tmp_path / "rank-0.err"
    stderr.write_text(
        "[rank0]: Traceback (most recent call last):\n"
        "[rank0]: ValueError: You set `devices=1` and `num_nodes=1` in Lightning, but the product"
        " (1 * 1) does not match the world size (4).\n"
    )
    block = root_cause_block(
        [Failure(0, 0, 1, 7, 5.0, "", str(stderr))],
        job_id=1,
        host="n1",
        node_rank=0,
        command=("train.py",),
    )
    assert (
        "  fix       : Lightning's Trainer must be told the job's size: Trainer(**hpclaunch."
        "frameworks.lightning.trainer_args(), ...)" in block
    )
    stderr.write_text("[rank0]: ValueError: bad batch\n")  # any other error: no fix line
    block = root_cause_block(
        [Failure(0, 0, 1, 7, 5.0, "", str(stderr))],
        job_id=1,
        host="n1",
        node_rank=0,
        command=("train.py",),
    )
    assert "fix       :" not in block


def test_root_cause_of_submitits_export_says_to_leave_it_out(tmp_path: Path) -> None:
    stderr = tmp_path / "rank-1.err"
    stderr.write_text(
        "[rank1]: Traceback (most recent call last):\n"
        "[rank1]: RuntimeError: Cannot export environment variables as MASTER_ADDR is already set\n"
    )
    block = root_cause_block(
        [Failure(1, 1, 1, 7, 5.0, "", str(stderr))],
        job_id=1,
        host="n1",
        node_rank=0,
        command=("train.py",),
    )
    assert (
        "  fix       : the agent sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and "
        "LOCAL_RANK already: leave submitit's TorchDistributedEnvironment().export() out" in block
    )
