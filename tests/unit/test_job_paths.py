"""The limits on the strings that become paths (hpclaunch.job.paths): plain strings."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from hpclaunch.errors import SpecError
from hpclaunch.job import paths
from hpclaunch.job.spec import JobSpec


def test_a_job_name_must_leave_room_for_the_batch_log_name() -> None:
    paths.check_job_name("a" * 240, given=True)  # NAME-4294967295.out is 255 bytes
    with pytest.raises(SpecError) as caught:
        paths.check_job_name("a" * 300, given=True)
    assert caught.value.field == "job_name"
    assert str(caught.value) == (
        "job name 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'... (300 characters) is 300 bytes "
        "long; the batch log is named NAME-JOBID.out, and a file name may be at most 255 "
        "bytes, so a job name may be at most 240: give a shorter --job-name"
    )


def test_a_job_name_is_measured_in_bytes() -> None:
    with pytest.raises(SpecError, match="is 242 bytes long"):
        paths.check_job_name("é" * 121, given=True)


def test_a_folder_part_longer_than_a_file_name_is_refused() -> None:
    paths.check_components("log_dir", "logs/" + "b" * 255)
    with pytest.raises(SpecError, match=r"its part 'bbbb.*\(256 characters\) is 256 bytes"):
        paths.check_components("log_dir", "logs/" + "b" * 256)


def test_a_folder_whose_whole_path_leaves_no_room_is_refused() -> None:
    deep = "/".join(["d" * 200] * 19)  # 3818 bytes: room for 256 more, and the cwd's
    paths.check_lengths(deep, None, PurePosixPath("/w"))
    with pytest.raises(SpecError) as caught:
        paths.check_lengths("logs", deep + "/x" * 20, PurePosixPath("/w"))
    assert caught.value.field == "checkpoint_dir"
    assert "a path may be at most 4095 bytes, and hpclaunch needs 256" in str(caught.value)
    with pytest.raises(SpecError) as caught:
        paths.check_lengths(deep, None, PurePosixPath("/" + "w" * 40))
    assert caught.value.field == "log_dir"


def test_the_job_spec_refuses_a_long_job_name_and_folder_part() -> None:
    with pytest.raises(SpecError, match="at most 240"):
        JobSpec(entrypoint="train.py", job_name="n" * 241)
    with pytest.raises(SpecError, match="give a --job-name of that length"):
        JobSpec(entrypoint="s" * 245 + ".py")
    with pytest.raises(SpecError) as caught:
        JobSpec(entrypoint="train.py", checkpoint_dir="/ckpt/" + "c" * 300)
    assert caught.value.field == "checkpoint_dir"
