"""The runs whose workers died of a stop signal they do not catch, from the agents'
end notes in a job folder (tmp_path), read through the job record."""

from __future__ import annotations

from pathlib import Path

from hpclaunch.jobdir import agent_ends
from hpclaunch.jobdir.agent_ends import AgentEnd
from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.record import signals
from hpclaunch.record.job_record import JobRecord


def test_a_run_whose_workers_died_of_an_uncaught_signal_is_named(tmp_path: Path) -> None:
    folder = JobFolder(tmp_path)
    agent_ends.write(folder, 0, AgentEnd("n1", 138, "SIGUSR1"))
    agent_ends.write(folder, 0, AgentEnd("n2", 138, "SIGUSR1"))
    agent_ends.write(folder, 1, AgentEnd("n1", 0))
    (folder.agents(1) / "node-n2.json").write_text("{torn")  # a note cut short: skipped
    (folder.agents(1) / "node-n3.json").write_text('{"node": "n3", "status": "0"}')  # not ours
    record = JobRecord.read(tmp_path, 7)
    assert signals.uncaught(record.run(0)) == {"n1": "SIGUSR1", "n2": "SIGUSR1"}
    assert signals.uncaught(record.run(1)) == {}
    assert record.run(1).ended(("n1", "n2", "n3")) == {"n1": 0}
    assert signals.notes(record.runs.values()) == [
        "run 0: the workers on n1,n2 were killed by SIGUSR1, which they do not catch, so they "
        "saved nothing on it; catch it (hpclaunch.checkpoint.Preemption, or for Lightning "
        "hpclaunch.frameworks.lightning.StopCheckpoint)"
    ]
