"""What a job's ``stderr()`` gives: every rank's stderr of the latest attempt."""

from __future__ import annotations

from pathlib import Path

from hpclaunch.executor.jobs import ranks_stderr
from hpclaunch.jobdir.layout import JobFolder, RankFile


def test_every_ranks_stderr_of_the_latest_attempt_prefixed_by_rank(tmp_path: Path) -> None:
    job = JobFolder(tmp_path)
    assert ranks_stderr(tmp_path) is None  # no rank has run yet
    old = job.attempt(0, "0", 0)
    old.path.mkdir(parents=True)
    old.rank_file(0, RankFile.ERR).write_text("from the first attempt\n")
    new = job.attempt(0, "0", 1)
    new.path.mkdir(parents=True)
    for rank in (10, 2, 0):
        new.rank_file(rank, RankFile.ERR).write_text(f"line one of {rank}\nline two\n")
    new.rank_file(1, RankFile.ERR).write_text("")
    assert ranks_stderr(tmp_path) == (
        "[rank0] line one of 0\n[rank0] line two\n"
        "[rank2] line one of 2\n[rank2] line two\n"
        "[rank10] line one of 10\n[rank10] line two\n"
    )
