"""Per-rank log files for torch's elastic agent, named by global rank (imports torch).

torch's own ``DefaultLogsSpecs`` names files by *local* rank and by the agent's
own restart count, under a random folder name, and deletes an attempt's folder
when the same number comes round again. This one writes the layout of
``hpclaunch.jobdir.layout`` (global ranks, the job-wide attempt) and never deletes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs, Std

from hpclaunch.contract import worker_env
from hpclaunch.jobdir.layout import AttemptFolder, JobFolder, RankFile


class RankLogs(LogsSpecs):
    """Each worker's stdout and stderr go to ``rank-R.out`` / ``rank-R.err``; with
    ``tee`` the agent also copies them to its own output, each line prefixed."""

    def __init__(
        self, job_dir: Path, requeue: int, step: str, *, tee: bool, node: str | None = None
    ) -> None:
        super().__init__(str(job_dir), redirects=Std.ALL, tee=Std.ALL if tee else Std.NONE)
        self._node = node
        self._job = JobFolder(job_dir)
        self._requeue = requeue
        self._step = step
        self._copy = tee
        self.folder: AttemptFolder | None = None  # the latest attempt's folder

    @property
    def root_log_dir(self) -> str:
        return str(self._job.logs)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        attempt = attempt_of(envs)
        folder = self._job.attempt(self._requeue, self._step, attempt)
        folder.path.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        dest = LogsDest()
        for local_rank, env in envs.items():
            rank = int(env["RANK"])
            out, err = folder.rank_file(rank, RankFile.OUT), folder.rank_file(rank, RankFile.ERR)
            error_file = folder.rank_file(rank, RankFile.ERROR)
            dest.stdouts[local_rank] = str(out)
            dest.stderrs[local_rank] = str(err)
            dest.error_files[local_rank] = str(error_file)
            if self._copy:
                dest.tee_stdouts[local_rank] = str(out)
                dest.tee_stderrs[local_rank] = str(err)
            env["TORCHELASTIC_ERROR_FILE"] = str(error_file)
            env[worker_env.ATTEMPT] = str(attempt)
        if self._node is not None:  # which ranks this node ran, for `hpclaunch logs --node`
            ranks = sorted(int(env["RANK"]) for env in envs.values())
            folder.write_node_ranks(self._node, ranks)
        return dest

    def __repr__(self) -> str:
        return f"RankLogs({self.root_log_dir!r}, tee={self._copy})"


def attempt_of(envs: Mapping[int, Mapping[str, str]]) -> int:
    """The attempt the workers of ``envs`` start in: what hpclaunch's agent put in
    their environment (HPCLAUNCH_ATTEMPT), else torch's per-agent restart count."""
    env = next(iter(envs.values()), {})
    return int(env.get(worker_env.ATTEMPT) or env.get("TORCHELASTIC_RESTART_COUNT") or 0)
