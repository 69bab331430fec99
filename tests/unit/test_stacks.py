"""`hpclaunch stacks` without SLURM: the stack texts parsed and grouped (py-spy's dump
and faulthandler's, as each prints them), the job folder's request and answer files,
and the login node's side against a fake agent that answers from a thread as a node's
hang watch does. The real agents answer in tests/integration/test_stacks_command.py."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from hpclaunch.cli import CliContext, main
from hpclaunch.jobdir import hangs as protocol
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.node import stacks
from hpclaunch.node.stacks import Frame, Thread
from hpclaunch.ops import stacks as live
from hpclaunch.slurm.commands import CommandResult, FakeRunner, Slurm

JOB = 4242

# `py-spy dump --nonblocking --pid P` of a worker waiting in wait_here (py-spy 0.3).
PY_SPY = """\
Process 27085: /venv/bin/python /work/stuck.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 27085 (idle): "MainThread"
    wait_here (stuck.py:4)
    <module> (stuck.py:13)
Thread 27090 (idle): "saver"
    helper (stuck.py:7)
    Thread.run (threading.py:982)
    Thread._bootstrap_inner (threading.py:1045)
    Thread._bootstrap (threading.py:1002)
"""

# faulthandler.dump_traceback(all_threads=True), as the worker's signal handler writes
# it: the thread that runs the handler (the main thread) comes last.
FAULTHANDLER = """\
Thread 0x00007fbd3f0db6c0 (most recent call first):
  File "/work/stuck.py", line 7 in helper
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007fbd3fc25b80 (most recent call first):
  File "/work/stuck.py", line 4 in wait_here
  File "/work/stuck.py", line 13 in <module>
"""

# Rank 1 of the same script, elsewhere in the loop, with other thread ids and state.
PY_SPY_OTHER = PY_SPY.replace("27085", "31337").replace("(stuck.py:4)", "(stuck.py:3)")
IN_ALL_REDUCE = """\
Thread 2001 (active): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2050)
    wrapper (torch/distributed/c10d_logger.py:75)
    train (train.py:30)
"""


def test_py_spy_and_faulthandler_parse_to_the_same_threads() -> None:
    by_spy, by_fh = stacks.parse(PY_SPY), stacks.parse(FAULTHANDLER)
    assert [t.name for t in by_spy] == ["MainThread", "saver"]
    assert by_spy[0].frames == (
        Frame("wait_here", "stuck.py", 4),
        Frame("<module>", "stuck.py", 13),
    )
    assert by_spy[1].frames[0] == Frame("helper", "stuck.py", 7)
    assert [t.name for t in by_fh] == ["MainThread", ""]  # faulthandler names no thread
    assert by_fh[0].frames == (
        Frame("wait_here", "/work/stuck.py", 4),
        Frame("<module>", "/work/stuck.py", 13),
    )
    assert [f.function for f in by_fh[1].frames] == [
        "helper",
        "run",
        "_bootstrap_inner",
        "_bootstrap",
    ]
    assert stacks.parse("no stack: py-spy did not answer in 10 s") == []


def test_waiting_and_where_read_the_main_thread() -> None:
    assert stacks.waiting(stacks.parse(IN_ALL_REDUCE)) is True
    assert stacks.waiting(stacks.parse(PY_SPY)) is False
    assert stacks.waiting([]) is None
    assert stacks.where(stacks.parse(IN_ALL_REDUCE)) == "train (train.py:30)"
    assert stacks.where([Thread("MainThread", ())]) == ""


def test_identical_stacks_are_grouped_most_ranks_first() -> None:
    found = {
        0: PY_SPY_OTHER,
        1: PY_SPY,
        2: PY_SPY.replace("27085", "4000"),  # the same stack in another process
        3: PY_SPY.replace("27090", "4001"),
        5: "no stack: py-spy: Permission denied",
    }
    groups = stacks.grouped(found)
    assert [ranks for ranks, _ in groups] == [[1, 2, 3], [0], [5]]
    assert groups[0][1] == (
        "Thread MainThread:\n    wait_here (stuck.py:4)\n    <module> (stuck.py:13)\n"
        "Thread saver:\n    helper (stuck.py:7)\n    Thread.run (threading.py:982)\n"
        "    Thread._bootstrap_inner (threading.py:1045)\n"
        "    Thread._bootstrap (threading.py:1002)"
    )
    assert "wait_here (stuck.py:3)" in groups[1][1]
    assert groups[2][1] == "no stack: py-spy: Permission denied"  # a note stays as it is
    assert stacks.grouped({}) == []


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([0], "0"),
        ([0, 1, 2, 5], "0-2,5"),
        ([7, 3, 4, 5, 9], "3-5,7,9"),
        ([1, 3], "1,3"),
        ([], ""),
        (list(range(256)), "0-255"),
    ],
)
def test_ranks_text(ranks: list[int], text: str) -> None:
    assert stacks.ranks_text(ranks) == text


def test_sections_read_back_rank_by_rank() -> None:
    found = {3: FAULTHANDLER, 2: PY_SPY, 10: "no stack: the worker did not answer in 10 s"}
    text = protocol.sections(found)
    assert text.startswith("=== rank 2\nProcess 27085:") and "\n=== rank 10\n" in text
    assert protocol.from_sections(text) == {r: t.rstrip() for r, t in found.items()}
    assert protocol.from_sections("") == {}
    assert protocol.from_sections("stray line\n=== rank x\n=== rank 1\na\n") == {1: "a"}


def job_folder(root: Path, nodes: Mapping[str, list[int]], requeue: int = 0) -> JobFolder:
    """A running job's folder: one attempt, with each node's rank list."""
    job = JobFolder(root / "logs" / str(JOB))
    attempt = job.attempt(requeue, "0", 0)
    attempt.path.mkdir(parents=True)
    for node, ranks in nodes.items():
        attempt.write_node_ranks(node, ranks)
    return job


class FakeAgents:
    """A thread standing in for the nodes' agents: each looks for open requests and
    answers with its ranks' stacks, through the agents' own protocol functions."""

    def __init__(self, job: JobFolder, answers: Mapping[str, Mapping[int, str]]) -> None:
        self.job, self.answers = job, answers
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.wait(0.02):
            for node, stacks_of_node in self.answers.items():
                for request in protocol.open_requests(self.job, node):
                    protocol.write_answer(self.job, request, node, stacks_of_node)


@pytest.fixture
def agents() -> Iterator[Callable[[JobFolder, Mapping[str, Mapping[int, str]]], FakeAgents]]:
    started: list[FakeAgents] = []

    def start(job: JobFolder, answers: Mapping[str, Mapping[int, str]]) -> FakeAgents:
        fake = FakeAgents(job, answers)
        fake.thread.start()
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.done.set()
        fake.thread.join(timeout=5)


def scontrol(state: str, restarts: str = "0", reason: str = "None") -> FakeRunner:
    def answer(argv: tuple[str, ...]) -> CommandResult:
        fields = f"JobId={JOB} JobName=stuck JobState={state} Restarts={restarts} Reason={reason}"
        return CommandResult(argv, 0, fields + " NodeList=n[1-2]\n")

    return FakeRunner({"scontrol": answer})


def cli(tmp_path: Path, runner: FakeRunner, *args: str) -> Result:
    env = {"HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")}
    obj = CliContext(slurm=Slurm(runner), cwd=tmp_path, env=env)
    return CliRunner().invoke(main, list(args), obj=obj)


def test_every_node_answers_and_identical_stacks_print_once(
    tmp_path: Path, agents: Callable[..., FakeAgents]
) -> None:
    job = job_folder(tmp_path, {"n1": [0, 1], "n2": [2, 3]})
    agents(
        job,
        {
            "n1": {0: PY_SPY, 1: PY_SPY.replace("27085", "2")},
            "n2": {2: PY_SPY.replace("27085", "3"), 3: PY_SPY_OTHER},
        },
    )
    result = cli(tmp_path, scontrol("RUNNING"), "stacks", "--job-dir", str(job.root), str(JOB))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        f"job {JOB}: stacks of 4 ranks on n[1-2] (requeue 0, step 0, attempt 0), read in "
    )
    assert lines[2:5] == [
        "ranks 0-2 (3 ranks):",
        "  Thread MainThread:",
        "      wait_here (stuck.py:4)",
    ]
    assert "rank 3:" in lines and result.stdout.count("Thread saver:") == 2
    assert "no answer" not in result.stdout
    # Nothing is left for an agent to answer, and no answers pile up in the folder.
    assert list(job.stacks.iterdir()) == []

    raw = cli(
        tmp_path, scontrol("RUNNING"), "stacks", "--raw", "--job-dir", str(job.root), str(JOB)
    )
    assert raw.exit_code == 0, raw.output
    assert [line for line in raw.stdout.splitlines() if line.startswith("===")] == [
        "=== rank 0",
        "=== rank 1",
        "=== rank 2",
        "=== rank 3",
    ]
    assert raw.stdout.count("Process ") == 4


def test_a_node_that_does_not_answer_is_named(
    tmp_path: Path, agents: Callable[..., FakeAgents]
) -> None:
    job = job_folder(tmp_path, {"n1": [0, 1], "n2": [2, 3], "n3": [4, 5]})
    agents(job, {"n1": {0: PY_SPY, 1: PY_SPY}, "n3": {4: PY_SPY}})  # n3's rank 5 exited
    found = live.ask(JOB, Slurm(scontrol("RUNNING")), {}, job.root, timeout_s=0.5)
    assert found.answered == ("n1", "n3") and sorted(found.stacks) == [0, 1, 4]
    assert found.silent == {"n2": [2, 3]} and found.unread == {"n3": [5]}
    assert found.waited_s >= 0.5
    text = live.render(found)
    assert "\nranks 0-1,4 (3 ranks):\n" in text
    assert "\nno answer from n2 (ranks 2-3) in 0.5 s: an agent looks for requests every 2 s" in text
    assert text.endswith("\nn3 answered without rank 5 (its worker had exited)")
    assert list(job.stacks.iterdir()) == []


def test_no_answer_at_all_is_an_error(tmp_path: Path) -> None:
    job = job_folder(tmp_path, {"n1": [0, 1]})
    result = cli(
        tmp_path,
        scontrol("RUNNING"),
        "stacks",
        "--timeout",
        "0.3",
        "--job-dir",
        str(job.root),
        str(JOB),
    )
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"Error: no node of job {JOB} answered in 0.3 s (asked: n1, requeue 0, step 0, "
        "attempt 0): an agent looks for requests"
    )
    assert list(job.stacks.iterdir()) == []  # the request is taken back


def test_waiting_polls_until_every_node_answered(tmp_path: Path) -> None:
    job = job_folder(tmp_path, {"n1": [0], "n2": [1]})
    request = protocol.request_stacks(job)
    naps: list[float] = []
    late = {"n1": 1, "n2": 3}  # the look after which each node's answer is there

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        for node, after in late.items():
            if len(naps) == after:
                protocol.write_answer(job, request, node, {int(node[1]) - 1: PY_SPY})

    answers = live.wait_answers(job, request, {"n1": [0], "n2": [1]}, 30.0, sleep=sleep)
    assert sorted(answers) == ["n1", "n2"] and naps == [live.POLL_S] * 3
    assert protocol.open_requests(job, "n3") == [request]
    live.withdraw(job, request)
    assert protocol.open_requests(job, "n3") == [] and list(job.stacks.iterdir()) == []


@pytest.mark.parametrize(
    ("state", "words"),
    [
        ("PENDING", "is PENDING (Resources): it has no workers yet"),
        ("COMPLETED", "has ended (COMPLETED): its workers are gone"),
        ("SUSPENDED", "is SUSPENDED, not RUNNING: only a running job's agents"),
    ],
)
def test_a_job_that_is_not_running_is_refused(tmp_path: Path, state: str, words: str) -> None:
    job = job_folder(tmp_path, {"n1": [0, 1]})
    slurm = scontrol(state, reason="Resources" if state == "PENDING" else "None")
    result = cli(tmp_path, slurm, "stacks", "--job-dir", str(job.root), str(JOB))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: job {JOB} {words}")
    assert f"hpclaunch status {JOB}" in result.stderr
    assert not job.stacks.exists()  # nothing asked


def test_a_running_job_whose_workers_have_not_started_is_refused(tmp_path: Path) -> None:
    job = job_folder(tmp_path, {"n1": [0, 1]})  # the rank lists of run 0 only
    result = cli(
        tmp_path, scontrol("RUNNING", restarts="1"), "stacks", "--job-dir", str(job.root), str(JOB)
    )
    assert result.exit_code == 1
    assert "is RUNNING, but its workers have not started yet" in result.stderr
    assert "try again in a few seconds" in result.stderr


def test_bad_timeouts_are_usage_errors(tmp_path: Path) -> None:
    for bad in ("0", "-1", "soon"):
        result = cli(tmp_path, scontrol("RUNNING"), "stacks", "--timeout", bad, str(JOB))
        assert result.exit_code == 2, bad


def test_without_slurm_the_state_is_unknown_and_nothing_is_asked(tmp_path: Path) -> None:
    job = job_folder(tmp_path, {"n1": [0, 1]})
    result = cli(tmp_path, FakeRunner({}), "stacks", "--job-dir", str(job.root), str(JOB))
    assert result.exit_code == 3  # SLURM's: it could not be asked
    assert result.stderr.startswith(f"Error: job {JOB}'s state is unknown, so it cannot be asked")
    assert "not on PATH here" in result.stderr and not job.stacks.exists()
