"""The runs whose workers died of a stop signal they do not catch, from the agents'
notes in a job folder (tmp_path)."""

from __future__ import annotations

from pathlib import Path

from hpclaunch.jobdir.layout import JobFolder
from hpclaunch.ops import unsaved
from hpclaunch.recovery.deputy import note_end


def test_a_run_whose_workers_died_of_an_uncaught_signal_is_named(tmp_path: Path) -> None:
    folder = JobFolder(tmp_path)
    note_end(folder, 0, "n1", 138, "SIGUSR1")
    note_end(folder, 0, "n2", 138, "SIGUSR1")
    note_end(folder, 1, "n1", 0)
    (folder.agents(1) / "node-n2.json").write_text("{torn")  # a note cut short: skipped
    assert unsaved.uncaught(tmp_path, 0) == {"n1": "SIGUSR1", "n2": "SIGUSR1"}
    assert unsaved.uncaught(tmp_path, 1) == {}
    assert unsaved.notes(tmp_path, [0, 1, 2]) == [
        "run 0: the workers on n1,n2 were killed by SIGUSR1, which they do not catch, so they "
        "saved nothing on it; catch it (hpclaunch.checkpoint.Preemption, or for Lightning "
        "hpclaunch.frameworks.lightning.StopCheckpoint)"
    ]
