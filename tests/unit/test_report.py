"""``hpclaunch report``'s text and picture, from a timeline of plain data."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hpclaunch.jobdir import goodput
from hpclaunch.jobdir.goodput import Attempt, RunTimes, Save
from hpclaunch.ops import report
from hpclaunch.ops.status import JobStatus


def two_runs() -> goodput.Timeline:
    runs = [RunTimes(0, 10, 60, "bad nodes"), RunTimes(1, 70, 120, "completed")]
    found = {
        0: [Attempt(0, 0, 12, 20, 1, 50, 30, 55)],
        1: [Attempt(1, 0, 72, 80, 11, 115, 80, 118)],
    }
    timeline = goodput.timeline(runs, found, [Save(10, 30, 2)], set(), 0, 500, True)
    assert timeline is not None
    return timeline


def test_the_text_gives_each_part_and_each_attempt() -> None:
    text = report.text(JobStatus(7, state="COMPLETED"), two_runs())
    assert "goodput: 37.5 % of 2 min 00 s" in text
    assert "    lost                 18 s   15.0 %" in text
    assert (
        "  1    0        +1 min 12 s  +1 min 20 s  +1 min 55 s  70     1.97" in text
    )  # run 1's attempt began 72 s after submission


def test_the_svg_draws_both_runs(tmp_path: Path) -> None:
    report.draw(two_runs(), tmp_path / "t.svg", "job 7")
    root = ET.parse(tmp_path / "t.svg").getroot()
    texts = {"".join(e.itertext()) for e in root.iter("{http://www.w3.org/2000/svg}text")}
    assert {"run 0", "run 1", "queue"} <= texts
    ids = {e.get("id") for e in root.iter()}
    assert {"productive-0", "productive-1", "lost-0"} <= ids


def test_without_matplotlib_the_error_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(report.ReportError, match=r"pip install 'hpclaunch\[report\]'"):
        report.draw(two_runs(), tmp_path / "t.png", "job 7")
    assert not (tmp_path / "t.png").exists()


def test_a_picture_format_it_cannot_draw_is_named() -> None:
    with pytest.raises(report.ReportError, match=r"--output t\.jpg: .*FILE\.png or FILE\.svg"):
        report.check_output(Path("t.jpg"))
