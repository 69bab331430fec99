"""What the agent's sweep ends and reaps, chosen from plain process tables."""

from __future__ import annotations

import logging

from hpclaunch.node.sweep import (
    KILL_PASSES,
    KILL_TIME_S,
    SWEEP_GRACE_S,
    adopted_zombies,
    describe,
    kill_wait,
    leftovers,
    outcome,
)
from hpclaunch.procs import Proc

AGENT = 100  # the agent leads session 100 here


def table(*rows: tuple[int, int, int] | tuple[int, int, int, str]) -> list[Proc]:
    """Processes from (pid, ppid, session[, state]) rows."""
    return [Proc(row[0], row[1], row[2], row[3] if len(row) > 3 else "S", 0) for row in rows]


# An agent with its zygote (its session), an scontrol call (its session), the etcd
# sidecar (a session of its own, with a child), a worker forked by the zygote with a
# child in its process group and a grandchild in a new session, an orphan re-parented
# to the agent after a double fork, a zombie it adopted, and a process of another job.
NODE = table(
    (101, AGENT, AGENT),  # zygote
    (108, AGENT, AGENT),  # scontrol
    (105, AGENT, 105),  # etcd sidecar
    (106, 105, 105),  # what the sidecar runs
    (102, 101, 102),  # worker
    (103, 102, 102),  # in the worker's group
    (110, 103, 110),  # started with setsid by 103
    (104, AGENT, 104),  # a daemon, re-parented to the agent
    (107, AGENT, 102, "Z"),  # an adopted process that ended
    (200, 1, 200),  # another job's
    (201, 200, 200),
)


def test_the_sweep_takes_what_the_workers_started_outside_the_agents_session() -> None:
    found = [p.pid for p in leftovers(NODE, AGENT, AGENT, spared=(105,))]
    assert sorted(found) == [102, 103, 104, 110]


def test_parents_come_before_their_children() -> None:
    found = [p.pid for p in leftovers(NODE, AGENT, AGENT, spared=(105,))]
    assert found.index(102) < found.index(103) < found.index(110)


def test_a_spared_helper_keeps_what_it_runs_and_unspared_it_is_ended() -> None:
    assert {105, 106} <= {p.pid for p in leftovers(NODE, AGENT, AGENT)}
    assert not {105, 106} & {p.pid for p in leftovers(NODE, AGENT, AGENT, spared=(105,))}


def test_zombies_are_not_ended_but_the_children_of_the_agents_session_are_searched() -> None:
    rows = table((101, AGENT, AGENT), (102, 101, 102, "Z"), (103, 101, 103), (104, 103, 103))
    assert [p.pid for p in leftovers(rows, AGENT, AGENT)] == [103, 104]


def test_nothing_outside_the_agents_tree_is_taken() -> None:
    assert leftovers(table((200, 1, 200), (201, 200, 201)), AGENT, AGENT) == []
    # A table that names the agent as its own parent (pid 0's children) does not loop.
    assert leftovers(table((AGENT, AGENT, AGENT)), AGENT, AGENT) == []


def test_adopted_zombies_are_reaped_session_leaders_too_but_not_the_owned_workers() -> None:
    rows = table(
        (107, AGENT, 102, "Z"),  # adopted from a worker's session: reaped
        (110, AGENT, 110, "Z"),  # a worker's setsid child, adopted: reaped
        (111, AGENT, 111, "Z"),  # a fresh worker torch reads the status of: owned
        (112, AGENT, AGENT, "Z"),  # the agent's own child in its session
        (114, AGENT, 102),  # running
        (115, 114, 102, "Z"),  # not the agent's child
        (116, AGENT, 105, "Z"),  # spared
    )
    assert adopted_zombies(rows, AGENT, AGENT, spared=(116,), owned=(111,)) == [107, 110]
    # As the agent ends, torch has read its workers' status: they are reaped too.
    assert adopted_zombies(rows, AGENT, AGENT, spared=(116,)) == [107, 110, 111]


def test_the_passes_of_sigkill_end_within_the_sweeps_time() -> None:
    # Every pass waits its whole share (a process stuck in uninterruptible I/O).
    left, waits = KILL_TIME_S, []
    for passes_left in range(KILL_PASSES, 0, -1):
        waits.append(kill_wait(left, passes_left))
        left -= waits[-1]
    assert waits == [1.0, 1.0, 1.0]
    assert sum(waits) == KILL_TIME_S
    assert SWEEP_GRACE_S + KILL_TIME_S <= 5.0  # twice that is well within KillWait (30 s)
    # A pass whose targets exited at once leaves its time to the later ones.
    assert kill_wait(2.9, 2) == 1.45
    # Past the deadline, a pass still sends SIGKILL but does not wait.
    assert kill_wait(-0.5, 1) == 0.0


def test_the_lines_that_end_a_sweep_say_what_happened() -> None:
    ok: list[tuple[int, str]] = []
    assert outcome({1, 2}, set(), ok, 2.0) == []
    assert outcome({1, 2}, {2}, ok, 2.0) == [
        (logging.WARNING, "1 of them outlived SIGTERM by 2 s: SIGKILL")
    ]
    # Processes found only after the SIGTERM (started meanwhile) are not counted as
    # having outlived it.
    assert outcome({1, 2}, {2, 3, 4}, ok, 0.3) == [
        (
            logging.WARNING,
            "1 of them outlived SIGTERM by 0.3 s and 2 were started meanwhile: SIGKILL",
        )
    ]
    assert outcome({1}, {3}, ok, 2.0) == [(logging.WARNING, "1 was started meanwhile: SIGKILL")]
    # The last pass killed everything: no "still running" line.
    assert not any(level == logging.ERROR for level, _ in outcome({1}, {1}, ok, 2.0))
    left = [(1, "sleep 1"), (9, "sleep 9")]
    assert outcome({1}, {1}, left, 2.0) == [
        (logging.WARNING, "1 of them outlived SIGTERM by 2 s: SIGKILL"),
        (logging.ERROR, "still running after SIGKILL: 1 sleep 1"),
        (logging.ERROR, "started after the last SIGKILL, left running: 9 sleep 9"),
    ]


def test_the_log_names_a_few_commands_and_counts_the_rest() -> None:
    found = [(pid, f"sleep {pid}") for pid in range(1, 11)]
    assert describe(found, named=3) == "1 sleep 1; 2 sleep 2; 3 sleep 3; and 7 more"
    long = "python -m tensorboard.main --logdir " + "x" * 100
    assert describe([(5, long)]) == f"5 {long[:77]}..."
    assert describe([(5, "sleep 1")]) == "5 sleep 1"
