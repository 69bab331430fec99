"""Scripts that checkpoint their own way (no hpclaunch import, no option), requeued
mid-run on the sandbox: ``status``, ``status --json``, ``sbatch --follow`` and the
batch log say nothing false about the work lost, judged against what each script
noted it did (tests/integration/own_resume_claims.py).

Four jobs at once, one node of two workers each, so the module costs about one job's
time: a plain DDP script after PyTorch's multinode.py with SGD (its resume point is
invisible to hpclaunch: every claim must say unknown), a plain DDP loop with AdamW (the
optimizer's restored step count shows it), Hugging Face's ``Trainer`` and Lightning
(each with its own checkpoints). Each is requeued with ``scontrol requeue`` a few steps
after its first checkpoint and resumes from it."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.helpers import VENV_BIN, wait_for
from tests.integration.own_resume_claims import Said, Truth, falsehoods, resume_problems
from tests.integration.sandbox_fixture import Running
from tests.integration.training_jobs import Job

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
# Script -> whether hpclaunch can see where it resumed without a change to it.
SCRIPTS = {
    "own_ddp_sgd.py": False,  # SGD keeps no state: nothing restored tells the step
    "own_ddp_adamw.py": True,  # AdamW's restored ``step``
    "own_hf_trainer.py": True,  # the Trainer's AdamW (and its global step)
    "own_lightning.py": True,  # Lightning's global step (and Adam's ``step``)
}
STEPS, SAVE_EVERY, STEP_TIME = 30, 10, 0.25
WORKERS = 2  # on one node each: the four jobs run at once on the sandbox's 4 nodes
# The requeue once a script has noted this many steps past its first checkpoint: ~2 s of
# steps before the next one, so the run ends between the two.
PAST_CHECKPOINT = 3


@dataclass
class Submitted:
    """A job submitted with ``hpclaunch sbatch --follow``, which runs till the job ends."""

    script: str
    job: Job
    follower: subprocess.Popen[bytes]
    stderr: Path  # the --follow text

    @property
    def steps(self) -> Path:
        return self.job.folder / "out" / "steps.jsonl"

    def truth(self) -> Truth:
        return Truth.parse(self.steps.read_text())

    def noted_step(self) -> int:
        """The step of the script's latest note of run 0's steps (0: none yet); its
        last whole line only, as this is read every few milliseconds."""
        try:
            lines = self.steps.read_text().split("\n")[:-1]  # a line being written is not
        except FileNotFoundError:
            return 0
        last = json.loads(lines[-1]) if lines else {}
        return int(last.get("step", 0)) if last.get("run") == 0 else 0


@dataclass(frozen=True)
class Ended:
    """A job of the module, once it has ended: what it did and what hpclaunch said."""

    state: str
    truth: Truth
    said: Said


def submit_following(sandbox: Running, folder: Path, script: str) -> Submitted:
    env = dict(sandbox.env)
    env["PATH"] = f"{VENV_BIN}:{env['PATH']}"
    folder.mkdir(parents=True)
    shutil.copy(HERE / script, folder / script)
    argv = [
        str(VENV_BIN / "hpclaunch"),
        "sbatch",
        "--follow",
        "--log-dir",
        "logs",
        "--nodes",
        "1",
        "--nproc-per-node",
        str(WORKERS),
        "--gpus-per-node",
        "0",
        script,
        "out",
        "--steps",
        str(STEPS),
        "--save-every",
        str(SAVE_EVERY),
        "--step-time",
        str(STEP_TIME),
    ]
    stdout, stderr = folder / "sbatch.out", folder / "sbatch.err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        follower = subprocess.Popen(argv, cwd=folder, env=env, stdout=out, stderr=err)
    wait_for(
        lambda: stdout.read_text().strip() != "" or follower.poll() is not None,
        timeout_s=60,
        what=f"{script}'s job id",
    )
    text = stdout.read_text().strip()
    assert text.isdigit(), f"{script}: sbatch said {text!r}: {stderr.read_text()}"
    job = Job(int(text), folder, env, Path(script).stem)
    return Submitted(script, job, follower, stderr)


def hpclaunch_status(job: Job, *options: str) -> str:
    argv = [str(VENV_BIN / "hpclaunch"), "status", *options, "--job-dir", str(job.job_dir)]
    done = subprocess.run(
        [*argv, str(job.id)], cwd=job.folder, env=job.env, capture_output=True, text=True
    )
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    return done.stdout


def requeue_each_past_its_checkpoint(jobs: list[Submitted]) -> None:
    """``scontrol requeue`` each job once its script has noted PAST_CHECKPOINT steps
    after its first checkpoint, in the order they get there."""
    waiting = list(jobs)

    def requeue_those_past() -> bool:
        for each in list(waiting):
            if each.noted_step() >= SAVE_EVERY + PAST_CHECKPOINT:
                each.job.run("scontrol", "requeue", str(each.job.id))
                waiting.remove(each)
            elif each.follower.poll() is not None:  # --follow ends with the job
                pytest.fail(f"{each.script}'s job ended before its requeue:\n{each.job.log}")
        return not waiting

    past = SAVE_EVERY + PAST_CHECKPOINT
    wait_for(requeue_those_past, timeout_s=240, what=f"each script past step {past}")


def ended(each: Submitted) -> Ended:
    state = each.job.wait_end()
    each.follower.wait(timeout=60)  # the job has ended: --follow stops by itself
    said = Said(
        status_json=json.loads(hpclaunch_status(each.job, "--json")),
        status_text=hpclaunch_status(each.job),
        follow_text=each.stderr.read_text(),
        batch_log=each.job.log,
    )
    return Ended(state, each.truth(), said)


@pytest.fixture(scope="module")
def own_jobs(
    sandbox: Running, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Ended]]:
    """The four jobs, submitted together, each requeued once past its first
    checkpoint, once they have all ended."""
    root = tmp_path_factory.mktemp("own-resume")
    jobs: list[Submitted] = []
    try:
        for script in SCRIPTS:
            jobs.append(submit_following(sandbox, root / Path(script).stem, script))
        requeue_each_past_its_checkpoint(jobs)
        yield {each.script: ended(each) for each in jobs}
    finally:  # what a failure left running goes, so the session's next tests have the nodes
        for each in jobs:
            if each.follower.poll() is None:
                scancel = ["scancel", str(each.job.id)]
                subprocess.run(scancel, env=each.job.env, capture_output=True, check=False)
                each.follower.kill()
                each.follower.wait()


def show(script: str, end: Ended, problems: list[str]) -> str:
    """What a failure prints: the problems, then what hpclaunch said and the truth."""
    said = end.said
    lost = json.dumps(said.status_json.get("lost_work"), indent=1)
    goodput = json.dumps(said.status_json.get("goodput"), indent=1)
    truth = end.truth
    runs = {
        r.run: {"resumed": r.resumed, "last": r.last, "done": r.done} for r in truth.runs.values()
    }
    for r in truth.requeued():
        runs[r].update(repeats=truth.repeats(r), redone_s=round(truth.redone_s(r), 2))
    return "\n".join(
        [
            f"{script}: {len(problems)} problem(s):",
            *(f"  - {p}" for p in problems),
            f"truth: {runs}",
            f"status --json lost_work: {lost}",
            f"status --json goodput: {goodput}",
            "status:",
            said.status_text,
            "--follow:",
            said.follow_text,
            "batch log, hpclaunch's lines:",
            *(line for line in said.batch_log.splitlines() if "supervisor: " in line),
        ]
    )


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_the_script_resumed_from_its_own_checkpoint(
    own_jobs: dict[str, Ended], script: str
) -> None:
    end = own_jobs[script]
    assert end.state == "COMPLETED", end.said.batch_log
    problems = resume_problems(end.truth, steps=STEPS, save_every=SAVE_EVERY, world_size=WORKERS)
    assert not problems, show(script, end, problems) + "\nbatch log:\n" + end.said.batch_log


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_nothing_false_is_said_about_the_lost_work(own_jobs: dict[str, Ended], script: str) -> None:
    end = own_jobs[script]
    problems = falsehoods(end.truth, end.said, visible=SCRIPTS[script])
    assert not problems, show(script, end, problems)
