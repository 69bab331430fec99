"""The layers' watch (hpclaunch.recovery.watch): the bound from the environment, the
pure judgement of what the supervisor has seen, the heartbeat file, and an agent's
look at it. The stopped processes themselves are stopped on the sandbox
(tests/integration/test_stopped_layers.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpclaunch.jobdir import heartbeat
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.recovery import policy
from hpclaunch.recovery.watch import (
    EXIT_BARRIER_S,
    Seen,
    StallKind,
    finished_without_lost,
    judge,
    supervisor_silent,
)

NODES = ("n1", "n2", "n3")
BOUND = 30.0


def seen(**kw: object) -> Seen:
    fields: dict[str, object] = {
        "nodes": NODES,
        "started": 0.0,
        "changed": {},
        "ended": {},
        "statuses": {},
        "srun_stopped": None,
    }
    fields.update(kw)
    return Seen(**fields)  # type: ignore[arg-type]


def test_agents_that_note_progress_are_left_alone() -> None:
    view = seen(changed={"n1": 100.0, "n2": 95.0, "n3": 101.0})
    assert judge(view, 120.0, BOUND).stall is None and not judge(view, 120.0, BOUND).warn


def test_slow_notes_of_every_agent_single_out_none() -> None:
    # Everyone silent at once: a job folder that took no notes looks the same.
    view = seen(changed={"n1": 10.0, "n2": 10.0, "n3": 10.0})
    judged = judge(view, 100.0, BOUND)
    assert judged.stall is None and judged.warn == ()


def test_an_agent_silent_while_others_go_on_is_named_once_and_nothing_is_ended() -> None:
    view = seen(changed={"n1": 100.0, "n2": 60.0, "n3": 101.0})
    judged = judge(view, 100.0, BOUND)
    assert judged.warn == ("n2",) and judged.live == ("n1", "n3") and judged.stall is None
    again = judge(seen(changed=view.changed, flagged=frozenset({"n2"})), 101.0, BOUND)
    assert again.warn == () and again.stall is None


def test_a_named_agent_ends_the_step_once_the_others_fall_silent_too() -> None:
    view = seen(changed={"n1": 100.0, "n2": 60.0, "n3": 101.0}, flagged=frozenset({"n2"}))
    assert judge(view, 129.0, BOUND).stall is None  # n1 and n3 within the bound
    stall = judge(view, 131.5, BOUND).stall
    assert stall is not None and stall.kind is StallKind.AGENT and stall.nodes == ("n2",)
    assert not stall.finished and stall.message.startswith("the agent on n2 noted no progress")


def test_an_agent_that_outlives_the_others_ends_by_the_bound_after_their_ends() -> None:
    view = seen(
        changed={"n1": 50.0, "n2": 50.0, "n3": 50.0},
        ended={"n1": 100.0, "n3": 101.0},
        statuses={"n1": 0, "n3": 0},
    )
    assert judge(view, 130.0, BOUND).stall is None  # a healthy agent ends soon after
    stall = judge(view, 131.0, BOUND).stall
    assert stall is not None and stall.nodes == ("n2",) and stall.statuses is None


def test_agents_whose_workers_ended_are_waiting_not_silent() -> None:
    # n1's rank 0 evaluates on after the training while n2 and n3 wait at torch's exit
    # barrier (their attempts logs say their workers ended): no one is named.
    view = seen(changed={"n1": 100.0, "n2": 40.0, "n3": 41.0}, resting={"n2": 45.0, "n3": 46.0})
    judged = judge(view, 120.0, BOUND)
    assert judged.warn == () and judged.stall is None


def test_a_named_agent_ends_the_step_as_soon_as_the_others_workers_end() -> None:
    view = seen(changed={"n1": 100.0, "n2": 60.0, "n3": 101.0}, flagged=frozenset({"n2"}))
    resting = seen(**{**view.__dict__, "resting": {"n1": 105.0, "n3": 105.0}})
    stall = judge(resting, 106.0, BOUND).stall
    assert stall is not None and stall.nodes == ("n2",)


def test_an_agent_that_never_noted_is_not_taken_for_a_stopped_one() -> None:
    # A script that reports no progress: no notes from anyone; n2 runs on after the
    # others ended (a long evaluation, say): nothing says it is stopped.
    view = seen(ended={"n1": 100.0, "n3": 100.0}, statuses={"n1": 0, "n3": 0})
    assert judge(view, 1000.0, BOUND).stall is None


def test_an_agent_that_never_noted_is_neither_named_nor_singled_out_beside_one_that_did() -> None:
    # n1 notes progress; n2 never notes (a spare standing by, or ranks that report no
    # progress): it is not warned of while n1 goes on, nor singled out once n1 rests.
    view = seen(nodes=("n1", "n2"), changed={"n1": 60.0})
    judged = judge(view, 70.0, BOUND)
    assert judged.warn == () and judged.stall is None and judged.live == ("n1",)
    resting = seen(nodes=("n1", "n2"), changed={"n1": 95.0}, resting={"n1": 100.0})
    for now in (101.0, 131.0, 1000.0):
        assert judge(resting, now, BOUND).stall is None and judge(resting, now, BOUND).warn == ()


def test_an_agent_whose_workers_ended_but_that_never_ends_is_silent_past_the_barrier() -> None:
    view = seen(ended={"n1": 100.0, "n3": 100.0}, statuses={"n1": 0, "n3": 0}, resting={"n2": 90.0})
    assert judge(view, 100.0 + EXIT_BARRIER_S + BOUND - 1, BOUND).stall is None
    stall = judge(view, 100.0 + EXIT_BARRIER_S + BOUND, BOUND).stall
    assert stall is not None and stall.nodes == ("n2",)
    assert stall.message == (
        "the agent on n2 noted no end 330 s after its workers and the others ended "
        "(torch's exit barrier waits 300 s); the supervisor ended the step"
    )


def test_an_agent_at_the_exit_barrier_after_the_others_ended_is_waiting_not_silent() -> None:
    # n1's rank 0 saved on past the others' exit barrier (300 s): n2 and n3 ended 0;
    # then n1's workers ended and its agent waits at the barrier. It is not named at
    # the bound: torch's barrier, not a stop, holds it.
    view = seen(
        changed={"n1": 400.0, "n2": 50.0, "n3": 50.0},
        ended={"n2": 360.0, "n3": 360.0},
        statuses={"n2": 0, "n3": 0},
        resting={"n1": 410.0},
    )
    for now in (410.0 + BOUND, 410.0 + 2 * BOUND, 410.0 + EXIT_BARRIER_S):
        assert judge(view, now, BOUND).stall is None


def test_a_failed_peer_is_examined_before_an_agent_silent_at_its_barrier() -> None:
    # --no-kill: n1 failed (exit 1) while n2 waited at the exit barrier and was named:
    # n1's failure record decides, and n2 is not kept out.
    from hpclaunch.jobdir.failures import Finding, Verdict

    bad = Finding(Verdict.BAD_NODES, ("n1",), "RuntimeError: boom")
    situation = policy.Situation(137, None, 0, None, 3, bad, silent=("n2",))
    decision = policy.decide(situation)
    assert decision.reason is policy.Reason.BAD_NODES and decision.exclude == ("n1",)
    bug = policy.Situation(137, None, 0, None, 3, Finding(Verdict.BUG, message="x"), silent=("n2",))
    assert policy.decide(bug).reason is policy.Reason.BUG
    unknown = policy.Situation(137, None, 0, None, 3, Finding(Verdict.UNKNOWN), silent=("n2",))
    assert policy.decide(unknown).reason is policy.Reason.AGENT_SILENT


def test_agents_on_a_lost_node_leave_the_others_ends_standing() -> None:
    from hpclaunch.slurm.commands import NodeState

    view = seen(
        changed={"n1": 50.0, "n2": 50.0, "n3": 50.0},
        ended={"n1": 100.0, "n3": 101.0},
        statuses={"n1": 0, "n3": 0},
    )
    stall = judge(view, 131.0, BOUND).stall
    assert stall is not None and stall.others == {"n1": 0, "n3": 0}
    down = {"n2": NodeState("down")}
    done = finished_without_lost(stall, down)
    assert done is not None and done.finished and done.statuses == {"n1": 0, "n3": 0}
    assert "SLURM says n2 is lost" in done.message
    assert finished_without_lost(stall, {"n2": NodeState("mixed")}) is None  # alive: stopped
    assert finished_without_lost(stall, {}) is None  # not known
    failed = judge(seen(**{**view.__dict__, "statuses": {"n1": 0, "n3": 1}}), 131.0, BOUND).stall
    assert failed is not None and finished_without_lost(failed, down) is None


def test_srun_stopped_for_the_bound_is_killed() -> None:
    assert (
        judge(seen(srun_stopped=10.0, changed={n: 35.0 for n in NODES}), 39.0, BOUND).stall is None
    )
    stall = judge(seen(srun_stopped=10.0, changed={n: 35.0 for n in NODES}), 40.0, BOUND).stall
    assert stall is not None and stall.kind is StallKind.SRUN and not stall.finished
    assert "was stopped (state T) for 30 s; the supervisor killed it" in stall.message


def test_srun_left_after_every_agent_ended_is_killed_and_their_statuses_stand() -> None:
    ends = {"ended": {"n1": 10.0, "n2": 12.0, "n3": 11.0}, "statuses": {"n1": 0, "n2": 0, "n3": 1}}
    assert judge(seen(**ends), 41.0, BOUND).stall is None
    stall = judge(seen(**ends), 42.0, BOUND).stall
    assert stall is not None and stall.kind is StallKind.SRUN and stall.finished
    assert stall.statuses == {"n1": 0, "n2": 0, "n3": 1}
    assert "had not exited 30 s after every agent noted its end" in stall.message


def test_the_policy_requeues_without_a_silent_agent_and_after_a_stuck_srun() -> None:
    base = policy.Situation(137, None, 0, None, 3)
    silent = policy.decide(policy.Situation(137, None, 0, None, 3, silent=("n2",)))
    assert silent == policy.Decision(policy.Action.REQUEUE, policy.Reason.AGENT_SILENT, 0, ("n2",))
    stuck = policy.decide(policy.Situation(137, None, 0, None, 3, srun_stuck=True))
    assert stuck == policy.Decision(policy.Action.REQUEUE, policy.Reason.SRUN_STUCK, 0)
    spent = policy.Situation(137, None, 3, None, 3, silent=("n2",))
    assert policy.decide(spent).action is policy.Action.GIVE_UP
    assert policy.decide(base).reason is policy.Reason.FAILED


def test_the_heartbeat_is_rewritten_in_place_at_one_size(tmp_path: Path) -> None:
    folder = JobFolder(tmp_path)
    assert heartbeat.read(folder, 0) is None
    beat = heartbeat.Beat(folder, 0, 20.0)
    beat.beat()
    first = heartbeat.read(folder, 0)
    inode = os.stat(heartbeat.path(folder, 0)).st_ino
    beat.beat()
    second = heartbeat.read(folder, 0)
    beat.close()
    assert first and second and first != second and len(first) == len(second)
    assert os.stat(heartbeat.path(folder, 0)).st_ino == inode
    assert second.split() == [str(os.getpid()).encode(), b"2", b"20"]
    assert heartbeat.bound_s(second) == 20.0 and heartbeat.bound_s(b"12 3") is None


def open_fds_on(target: Path) -> list[str]:
    """This process's descriptors open on ``target`` (Linux: /proc/self/fd)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(target):
                found.append(fd)
        except OSError:
            continue  # the descriptor listdir itself used, closed meanwhile
    return found


def test_each_beat_is_flushed_and_closed_so_other_nodes_see_it(tmp_path: Path) -> None:
    # On NFS a write into a kept-open file stays in the writer's page cache for up to
    # half a minute: the other nodes would see a still beat. Each beat is closed.
    folder = JobFolder(tmp_path)
    beat = heartbeat.Beat(folder, 0, 20.0)
    for sequence in (1, 2, 3):
        beat.beat()
        assert open_fds_on(heartbeat.path(folder, 0)) == []
        content = heartbeat.read(folder, 0)
        assert content is not None and content.split()[1] == str(sequence).encode()
    beat.close()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_an_agent_sees_a_live_supervisor_at_its_next_beat(tmp_path: Path) -> None:
    folder, clock = JobFolder(tmp_path), Clock()
    beat = heartbeat.Beat(folder, 0, 20.0)
    beat.beat()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 1.0 and beat.sequence == 1:
            beat.beat()

    assert supervisor_silent(tmp_path, 0, clock, sleep) is None
    assert clock.now < 2.0
    beat.close()


def test_an_agent_calls_a_still_heartbeat_silent_after_the_bound(tmp_path: Path) -> None:
    clock = Clock()
    beat = heartbeat.Beat(JobFolder(tmp_path), 0, 20.0)
    beat.beat()
    beat.close()
    waited = supervisor_silent(tmp_path, 0, clock, clock.sleep)
    assert waited is not None and 20.0 <= waited < 21.0


def test_no_heartbeat_is_no_verdict(tmp_path: Path) -> None:
    clock = Clock()
    assert supervisor_silent(tmp_path, 0, clock, clock.sleep) is None and clock.now == 0


def test_the_watch_timeout_goes_from_the_job_to_the_supervisor() -> None:
    from hpclaunch.errors import SpecError
    from hpclaunch.job.render import supervisor_settings
    from hpclaunch.job.spec import JobSpec

    assert "--watch-timeout" not in supervisor_settings(JobSpec("t.py")).to_argv()
    argv = supervisor_settings(JobSpec("t.py", watch_timeout_s=120)).to_argv()
    assert argv[argv.index("--watch-timeout") + 1] == "120"
    with pytest.raises(SpecError, match="5 is below the minimum of 20"):
        JobSpec("t.py", watch_timeout_s=5)


def test_status_names_a_silent_agent_while_its_run_goes_on(tmp_path: Path) -> None:
    from hpclaunch.jobdir import agent_ends, silent_agents
    from hpclaunch.jobdir.agent_ends import AgentEnd
    from hpclaunch.jobdir.history import History, Run
    from hpclaunch.ops.status import gather
    from hpclaunch.slurm.commands import CommandResult, FakeRunner, Slurm

    job_dir = tmp_path / "logs" / "7"
    folder = JobFolder(job_dir)
    folder.root.mkdir(parents=True)
    history = History(7, 3, runs=[Run(0, "n[1-2]", 1000.0)])
    folder.history.write_text(json.dumps(history.to_json()))
    silent_agents.write(folder, 0, silent_agents.SilentAgent("n2", 1100.0, 60.0, ("n1",)))

    def scontrol(state: str) -> Slurm:
        line = f"JobId=7 JobName=t JobState={state} Restarts=0 NodeList=n[1-2] ExitCode=0:0"
        return Slurm(FakeRunner({"scontrol": lambda argv: CommandResult(argv, 0, line + "\n")}))

    env = {"HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")}
    running = gather(7, scontrol("RUNNING"), env, job_dir, now=1200.0)
    [note] = [n for n in running.notes if "n2" in n]
    assert note.startswith(
        "run 0: the agent on n2 noted no progress for 60 s while the agents on n1 go on"
    )
    # Its end noted, or the job over: the history says the rest.
    assert not [n for n in gather(7, scontrol("COMPLETED"), env, job_dir).notes if "n2" in n]
    agent_ends.write(folder, 0, AgentEnd("n2", 0))
    assert not [n for n in gather(7, scontrol("RUNNING"), env, job_dir).notes if "n2" in n]


def test_the_step_watch_reads_the_notes_names_the_silent_agent_and_ends_the_step(
    tmp_path: Path,
) -> None:
    from hpclaunch.jobdir import attempts, progress_notes, silent_agents
    from hpclaunch.jobdir.progress_notes import NodeProgress, RankProgress
    from hpclaunch.recovery.watch import StepWatch

    folder, clock = JobFolder(tmp_path), Clock()

    def note(node: str, at: float) -> None:
        rank = RankProgress(0, int(at), 1.0, 1.0, 0.0)
        progress_notes.write(folder, 0, NodeProgress(node, 0, at, (rank,)))

    watch = StepWatch(tmp_path, 0, ("n1", "n2"), 20.0, clock)
    note("n1", 1.0)
    note("n2", 1.0)
    for at in range(0, 40):  # n1 notes on every 10 s, n2 stops
        clock.now = float(at)
        if at % 10 == 0:
            note("n1", 100.0 + at)
        assert watch.tick(os.getpid()) is None
    assert heartbeat.read(folder, 0) is not None  # it beat meanwhile
    named = [silent_agents.parse(p.read_text()) for p in folder.agents(0).glob("silent-*")]
    assert [(s.node, s.live) for s in named] == [("n2", ("n1",))]
    # n1's workers end (its attempts log says so): no agent's notes go on.
    attempts.append(folder, 0, attempts.AttemptEvent("n1", 0, attempts.END, 140.0))
    clock.now = 45.0
    stall = watch.tick(os.getpid())
    assert stall is not None and stall.nodes == ("n2",) and stall.kind is StallKind.AGENT
    watch.close()


def test_agents_restarted_in_place_are_not_silent_before_their_first_step(
    tmp_path: Path,
) -> None:
    # Both nodes' workers failed (a crash) and restart in place; the new attempt starts
    # longer than the bound (its own first-step watch bounds that). n2's last note, of
    # the attempt before, is older than n1's: neither is named, the step is not ended.
    from hpclaunch.jobdir import attempts, progress_notes
    from hpclaunch.jobdir.progress_notes import NodeProgress, RankProgress
    from hpclaunch.recovery.watch import StepWatch

    folder, clock = JobFolder(tmp_path), Clock()

    def note(node: str, attempt: int, at: float) -> None:
        rank = RankProgress(0, int(at), 1.0, 1.0, 0.0)
        progress_notes.write(folder, 0, NodeProgress(node, attempt, at, (rank,)))

    def event(node: str, attempt: int, kind: str, at: float) -> None:
        attempts.append(folder, 0, attempts.AttemptEvent(node, attempt, kind, at))

    watch = StepWatch(tmp_path, 0, ("n1", "n2"), 20.0, clock)
    event("n1", 0, attempts.BEGIN, 99.0)
    event("n2", 0, attempts.BEGIN, 99.0)
    note("n1", 0, 100.0)
    note("n2", 0, 100.0)
    assert watch.tick(os.getpid()) is None
    clock.now = 6.0
    note("n2", 0, 106.0)  # its end note, then n1's some seconds later
    event("n2", 0, attempts.END, 106.0)
    event("n2", 1, attempts.BEGIN, 107.0)
    assert watch.tick(os.getpid()) is None
    clock.now = 12.0
    note("n1", 0, 112.0)
    event("n1", 0, attempts.END, 112.0)
    event("n1", 1, attempts.BEGIN, 113.0)
    for at in range(12, 90):
        clock.now = float(at)
        assert watch.tick(os.getpid()) is None, at
    assert list(folder.agents(0).glob("silent-*")) == []
    # Once stepping in the new attempt, an agent that stops is named as before.
    for at in range(90, 130):
        clock.now = float(at)
        if at % 10 == 0:
            note("n1", 1, 100.0 + at)
        if at == 90:
            note("n2", 1, 100.0 + at)
        assert watch.tick(os.getpid()) is None, at
    [named] = list(folder.agents(0).glob("silent-*"))
    assert named.name == "silent-n2.json"
    watch.close()


def test_a_suspended_job_is_not_taken_for_silent_agents_and_a_named_one_is_cleared(
    tmp_path: Path,
) -> None:
    # SLURM suspends the job (scontrol suspend): the supervisor's monotonic clock runs
    # on while nobody can note anything. That time is not silence.
    from hpclaunch.jobdir import progress_notes, silent_agents
    from hpclaunch.jobdir.progress_notes import NodeProgress, RankProgress
    from hpclaunch.recovery.watch import StepWatch

    folder, clock = JobFolder(tmp_path), Clock()

    def note(node: str, at: float) -> None:
        rank = RankProgress(0, int(at), 1.0, 1.0, 0.0)
        progress_notes.write(folder, 0, NodeProgress(node, 0, at, (rank,)))

    watch = StepWatch(tmp_path, 0, ("n1", "n2"), 20.0, clock)
    for at in range(0, 12):
        clock.now = float(at)
        if at % 10 == 0:
            note("n1", 100.0 + at)
            note("n2", 100.0 + at)
        assert watch.tick(os.getpid()) is None
    clock.now = 600.0  # resumed after ten minutes
    assert watch.tick(os.getpid()) is None
    note("n1", 1000.0)  # n1's agent notes first after the resume
    for at in range(601, 615):
        clock.now = float(at)
        assert watch.tick(os.getpid()) is None
    assert list(folder.agents(0).glob("silent-*")) == []  # n2 was not named
    # n2 truly stops now: named after the bound while n1 goes on; then its notes go on
    # again (it was continued): the name is taken back, and it is not singled out.
    for at in range(615, 645):
        clock.now = float(at)
        if at % 10 == 0:
            note("n1", 1000.0 + at)
        assert watch.tick(os.getpid()) is None
    [named] = [silent_agents.parse(p.read_text()) for p in folder.agents(0).glob("silent-*")]
    assert named.node == "n2"
    note("n2", 2000.0)
    for at in range(645, 660):
        clock.now = float(at)
        assert watch.tick(os.getpid()) is None
    assert list(folder.agents(0).glob("silent-*")) == []
    clock.now = 680.0  # n1 and n2 both quiet 20 s: nobody singled out
    assert watch.tick(os.getpid()) is None
    watch.close()


def test_an_agent_does_not_count_a_suspension_as_the_supervisor_s_silence(
    tmp_path: Path,
) -> None:
    clock = Clock()
    beat = heartbeat.Beat(JobFolder(tmp_path), 0, 20.0)
    beat.beat()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if 5.0 <= clock.now < 5.5:
            clock.now += 600.0  # the job is suspended for ten minutes
        elif clock.now >= 607.0 and beat.sequence == 1:
            beat.beat()  # the supervisor's first beat after the resume

    assert supervisor_silent(tmp_path, 0, clock, sleep) is None
    beat.close()


def test_agents_that_outlive_srun_wait_for_a_deciding_supervisor_not_the_bound(
    tmp_path: Path,
) -> None:
    # After a stall's kill an agent can outlive srun; the supervisor then decides (SLURM
    # patience, the failure records) without its wait loop. Its last beat names a
    # longer bound, and the agent waits for the beat that says it has acted.
    from hpclaunch.recovery.watch import StepWatch, deciding_s

    clock = Clock()
    longer = deciding_s(20.0, 90.0, 300.0)
    assert longer == 20.0 + 300.0 + 120.0
    watch = StepWatch(tmp_path, 0, ("n1",), 20.0, clock, deciding_s=longer)
    watch.beat()
    watch.deciding()
    assert heartbeat.bound_s(heartbeat.read(JobFolder(tmp_path), 0) or b"") == longer

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 200.0 and not decided:
            decided.append(True)
            watch.decided()  # after_step returned, 200 s on: well past the watch's 20 s

    decided: list[bool] = []
    assert supervisor_silent(tmp_path, 0, clock, sleep) is None
    assert 200.0 <= clock.now < 201.0
    # A supervisor that never decides is silent after the longer bound.
    still = Clock()
    watch.deciding()
    waited = supervisor_silent(tmp_path, 0, still, still.sleep)
    assert waited is not None and longer <= waited < longer + 1


def test_the_watch_follows_the_attempts_logs_from_where_it_stopped(tmp_path: Path) -> None:
    # The logs grow all the job long: each read takes only what was appended since.
    from hpclaunch.jobdir import agent_ends, attempts
    from hpclaunch.jobdir.agent_ends import AgentEnd
    from hpclaunch.jobdir.follow import Follower

    folder = JobFolder(tmp_path)
    for second in range(200):
        attempts.append(folder, 0, attempts.AttemptEvent("n1", 0, attempts.STEP, float(second)))
    attempts.append(folder, 0, attempts.AttemptEvent("n2", 0, attempts.BEGIN, 5.0))
    follower = Follower(folder, 0)
    first = follower.read()
    assert {n: e.event for n, e in first.latest.items()} == {"n1": "step", "n2": "begin"}
    assert first.latest["n1"].time == 199.0 and first.ends == ()
    before = follower.bytes_read
    end = attempts.AttemptEvent("n1", 0, attempts.END, 300.0)
    attempts.append(folder, 0, end)
    log = attempts.path(folder, 0, "n1")
    with open(log, "ab") as torn:  # a line still being written is left for later
        torn.write(b'{"attempt": 1, "event": "be')
    agent_ends.write(folder, 0, AgentEnd("n1", 0))
    second = follower.read()
    assert second.latest["n1"] == end and second.latest["n2"].event == "begin"
    assert second.ends == (AgentEnd("n1", 0),)
    taken = len(json.dumps(end.__dict__, sort_keys=True)) + 1
    assert follower.bytes_read - before == taken + len(b'{"attempt": 1, "event": "be')
    with open(log, "ab") as torn:
        torn.write(b'gin", "node": "n1", "time": 310.0}\n')
    assert follower.read().latest["n1"].event == "begin"
