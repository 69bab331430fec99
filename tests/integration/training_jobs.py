"""The example training scripts (examples/train.py, examples/train_fsdp.py) as jobs
on the sandbox: submitted through ``hpclaunch sbatch`` on 2 nodes x 2 workers, read
back through their log's START / STOPPED / RESULT lines, their job folder and
``scontrol``, and waited for until they have ended and every process is gone."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hpclaunch import procs
from hpclaunch.sandbox.cluster import NodeAction
from hpclaunch.slurm.commands import parse_show_job
from hpclaunch.slurm.hostlist import expand
from tests.integration.helpers import VENV_BIN, wait_for
from tests.integration.sandbox_fixture import Running

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# A job of the high partition that needs every node whole preempts (requeues) the others.
HIGH_JOB = ("-o", "/dev/null", "--wrap", "sleep 1")
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
# A committed checkpoint of either form: step-N.pt (one file) or step-N/ (sharded).
_COMMITTED = re.compile(r"^step-(\d{12})(\.pt)?$")


@dataclass
class Job:
    id: int
    folder: Path  # the submit folder
    env: dict[str, str]
    name: str  # the job name: the script's, without .py
    checkpoint_dir: Path | None = None  # --checkpoint-dir, when given

    @property
    def log(self) -> str:
        return (self.folder / "logs" / f"{self.name}-{self.id}.out").read_text()

    @property
    def job_dir(self) -> Path:
        return self.folder / "logs" / str(self.id)

    @property
    def checkpoints(self) -> Path:
        return self.checkpoint_dir or self.job_dir / "checkpoints"

    def fields(self) -> dict[str, str]:
        out = subprocess.run(
            ["scontrol", "show", "job", str(self.id)],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return parse_show_job(out)

    def lines(self, kind: str) -> list[dict[str, object]]:
        """The fields of global rank 0's ``KIND {...}`` lines, in order."""
        return [
            json.loads(line.split(f"{kind} ", 1)[1])
            for line in self.log.splitlines()
            if line.startswith(f"[rank0] {kind} ")
        ]

    def history(self) -> list[tuple[int, str | None, str]]:
        runs = json.loads((self.job_dir / "history.json").read_text())["runs"]
        return [(r["requeue_count"], r["reason"], r["action"]) for r in runs]

    def committed(self) -> list[int]:
        """The steps of the committed checkpoints now in the checkpoint folder, oldest
        first (read by name: a committed one got its name in one rename)."""
        try:
            names = [entry.name for entry in self.checkpoints.iterdir()]
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_COMMITTED.match, names) if m)

    def wait_checkpoint(self, step: int) -> None:
        """Until a checkpoint of ``step`` or a later one is committed."""
        wait_for(
            lambda: any(s >= step for s in self.committed()),
            timeout_s=120,
            what=f"job {self.id}'s checkpoint of step {step}",
        )

    def wait_end(self) -> str:
        """The job's final state, once it has one and every process of it is gone."""
        wait_for(lambda: self.fields()["JobState"] in ENDED, timeout_s=180, what=f"job {self.id}")
        entry = f"SLURM_JOB_ID={self.id}".encode()
        wait_for(
            lambda: not procs.with_environ(entry),
            timeout_s=30,
            what=f"every process of job {self.id} to exit",
        )
        return self.fields()["JobState"]

    def status(self) -> str:
        """What ``hpclaunch status`` prints for this job."""
        argv = [str(VENV_BIN / "hpclaunch"), "status", "--job-dir", str(self.job_dir), str(self.id)]
        done = subprocess.run(
            argv, cwd=self.folder, env=self.env, capture_output=True, text=True, check=True
        )
        return done.stdout

    def run(self, *argv: str) -> None:
        """A SLURM command aimed at this job (scontrol requeue, scancel ...)."""
        subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=True)


def submit(
    sandbox: Running,
    folder: Path,
    script: Path,
    *args: str,
    partition: str | None = None,
    options: tuple[str, ...] = (),
    checkpoint_dir: Path | None = None,
) -> Job:
    """``script`` copied into ``folder`` and submitted from there on 2 nodes x 2
    workers, with ``args`` after it; ``options`` go to hpclaunch sbatch."""
    env = dict(sandbox.env)
    env["PATH"] = f"{VENV_BIN}:{env['PATH']}"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(script, folder / script.name)
    extra = ["--partition", partition] if partition else []
    if checkpoint_dir is not None:
        extra += ["--checkpoint-dir", str(checkpoint_dir)]
    result = subprocess.run(
        [
            str(VENV_BIN / "hpclaunch"),
            "sbatch",
            "--log-dir",
            "logs",
            "--nodes",
            "2",
            "--nproc-per-node",
            "2",
            "--gpus-per-node",
            "0",
            *extra,
            *options,
            script.name,
            *args,
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return Job(int(result.stdout), folder, env, script.stem, checkpoint_dir)


def end_with_a_lost_node(sandbox: Running, job: Job) -> tuple[str, str]:
    """Kill a node of ``job`` other than its batch step's, as a machine that died, and
    wait for the job's end: (its final state, the node). SLURM would mark the node DOWN
    after its timeouts (~25 s); this does it at once. The node is back in service after,
    for the next tests."""
    lost = expand(job.fields()["NodeList"])[1]
    try:
        sandbox.box.kill_node(lost)
        sandbox.box.set_node_state(lost, NodeAction.DOWN, "test: node lost")
        return job.wait_end(), lost
    finally:
        sandbox.box.start_node(lost)


def uninterrupted_digest(sandbox: Running, folder: Path, script: Path, *args: str) -> str:
    """The digest of a run that nothing interrupts (for a module's reference fixture)."""
    job = submit(sandbox, folder, script, *args)
    assert job.wait_end() == "COMPLETED", job.log
    [result] = job.lines("RESULT")
    assert result["started_at"] == 0 and result["world_size"] == 4, job.log
    return str(result["digest"])


def digest_of(job: Job, *, last: bool = False) -> str:
    """The digest of the job's one RESULT line (``last``: of its last one, for a job
    whose completion can race with SLURM's warning and run once more)."""
    results = job.lines("RESULT")
    if not last:
        assert len(results) == 1, job.log
    return str(results[-1]["digest"])


# The flags of a worker crash: rank 3 exits 3 at step 12, on the job's first attempt.
CRASH = ("--crash-rank", "3", "--crash-at", "12")


def check_restarted_in_place(job: Job, uninterrupted: str) -> None:
    """A job submitted with ``CRASH``, or a rank that hangs at step 12 (checkpoints every
    5 steps), ends as an uninterrupted one, after one restart in place from step 9's."""
    assert job.wait_end() == "COMPLETED", job.log
    assert digest_of(job) == uninterrupted
    starts = job.lines("START")
    # One restart in place (attempt 1, same run), resumed from the checkpoint of step 9.
    assert [(s["attempt"], s["requeue"], s["step"]) for s in starts] == [
        ("0", "0", 0),
        ("1", "0", 10),
    ]
    assert job.fields()["Restarts"] == "0"
    assert job.history() == [(0, "completed", "none")]
