"""SLURM's job states and the one scontrol-then-sacct lookup: pure parsing with plain
strings and dicts, the commands scripted by FakeRunner."""

from __future__ import annotations

import pytest

from hpclaunch.slurm.commands import CommandResult, FakeRunner, Slurm
from hpclaunch.slurm.states import FINAL, JobState, SlurmRecord, Source, is_final

FORGOTTEN = "slurm_load_jobs error: Invalid job id specified\n"


def test_states_parse_as_slurm_prints_them() -> None:
    assert JobState.parse("RUNNING") is JobState.RUNNING
    assert JobState.parse("CANCELLED by 1000") is JobState.CANCELLED  # sacct's
    assert JobState.parse(" REQUEUE_HOLD ") is JobState.REQUEUE_HOLD
    assert JobState.parse("") is None and JobState.parse(None) is None
    assert JobState.parse("WARP_DRIVE_FAIL") is None  # a later SLURM's: no crash
    assert not is_final("WARP_DRIVE_FAIL") and not is_final(None)


def test_the_final_states_are_those_after_which_the_job_runs_no_more() -> None:
    assert {state.value for state in FINAL} == {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
        "PREEMPTED",
        "ENDED",
    }
    assert is_final("CANCELLED by 0") and is_final("NODE_FAIL")
    for text in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "SUSPENDED", "REQUEUE_HOLD"):
        assert not is_final(text), text


def test_a_record_from_scontrol_and_from_sacct() -> None:
    record = SlurmRecord.from_scontrol(
        {
            "JobId": "7",
            "JobName": "train",
            "JobState": "PENDING",
            "Reason": "Resources",
            "Restarts": "2",
            "NodeList": "(null)",
            "ExitCode": "0:0",
            "StdOut": "/l/train-7.out",
        }
    )
    assert record == SlurmRecord(
        Source.SCONTROL, "PENDING", "(null)", "0:0", "7", "train", "Resources", 2, "/l/train-7.out"
    )
    assert record.job_state is JobState.PENDING
    bare = SlurmRecord.from_scontrol({"JobState": "RUNNING", "Reason": "None", "Restarts": "x"})
    assert (bare.reason, bare.restarts, bare.name, bare.stdout) == (None, None, None, None)
    accounted = SlurmRecord.from_sacct("CANCELLED by 0|n[1-2]|0:15", "7")
    assert accounted == SlurmRecord(Source.SACCT, "CANCELLED", "n[1-2]", "0:15", "7")
    assert SlurmRecord.from_sacct("", "7").state is None


def answer(code: int, out: str = "", err: str = "") -> object:
    return lambda argv: CommandResult(argv, code, out, err)


@pytest.mark.parametrize(
    ("handlers", "state", "source", "forgotten", "unreachable", "asked"),
    [
        (
            {"scontrol": answer(0, "JobId=7 JobState=RUNNING\n")},
            "RUNNING",
            Source.SCONTROL,
            False,
            False,
            ["scontrol"],
        ),
        (
            {"scontrol": answer(1, err=FORGOTTEN), "sacct": answer(0, "COMPLETED|n1|0:0\n")},
            "COMPLETED",
            Source.SACCT,
            False,
            False,
            ["scontrol", "sacct"],
        ),
        (
            {"scontrol": answer(1, err=FORGOTTEN), "sacct": answer(0, "\n")},
            None,
            None,
            True,
            False,
            ["scontrol", "sacct"],
        ),
        (
            {"scontrol": answer(1, err=FORGOTTEN), "sacct": answer(1, err="storage is disabled\n")},
            None,
            None,
            True,
            False,
            ["scontrol", "sacct"],
        ),
        (
            {"scontrol": answer(1, err="Socket timed out\n"), "sacct": answer(1, err="no\n")},
            None,
            None,
            False,
            True,
            ["scontrol", "sacct"],
        ),
        (
            {"scontrol": answer(1, err=FORGOTTEN)},  # no sacct installed
            None,
            None,
            True,
            False,
            ["scontrol", "sacct"],
        ),
        ({}, None, None, False, True, ["scontrol"]),  # not a SLURM machine
    ],
)
def test_lookup_asks_scontrol_then_sacct(
    handlers: dict[str, object],
    state: str | None,
    source: Source | None,
    forgotten: bool,
    unreachable: bool,
    asked: list[str],
) -> None:
    fake = FakeRunner(handlers)  # type: ignore[arg-type]
    found = Slurm(fake).lookup(7)
    assert (found.record.state if found.record else None) == state
    assert (found.record.source if found.record else None) == source
    assert (found.forgotten, found.unreachable) == (forgotten, unreachable)
    assert [call[0] for call in fake.calls] == asked
    assert found.not_on_path == (handlers == {})


def test_lookup_keeps_the_first_line_of_each_refusal() -> None:
    fake = FakeRunner(
        {
            "scontrol": answer(1, err=FORGOTTEN + "more\n"),
            "sacct": answer(1, err="sacct: error: storage is disabled\n"),
        }
    )
    found = Slurm(fake).lookup(7)
    assert found.scontrol_error == FORGOTTEN.strip()
    assert found.sacct_error == "sacct: error: storage is disabled"
    assert (
        "sacct",
        "--noheader",
        "--allocations",
        "--parsable2",
        "--format=State,NodeList,ExitCode",
        "--jobs=7",
    ) in fake.calls
