"""``hpclaunch report``'s text and picture, from a timeline of plain data: every run
visible, each lane saying how its run ended, the rate panel's range holding every rate,
and the table counting steps as status does."""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hpclaunch.ops import report
from hpclaunch.ops.status import JobStatus
from hpclaunch.record import goodput
from hpclaunch.record.attempts import Attempt
from hpclaunch.record.checkpoints import Kind, Saved
from hpclaunch.record.goodput import RunTimes

SVG = "{http://www.w3.org/2000/svg}"


def two_runs() -> goodput.Timeline:
    """Run 0 lost a node after 30 steps (checkpoint of step 10 at 30 s), run 1 resumed
    from it and completed, stepping twice as fast as run 0."""
    runs = [
        RunTimes(0, 10, 60, "bad nodes", "requeue"),
        RunTimes(1, 70, 120, "completed", "none"),
    ]
    found = {
        0: [Attempt(0, 0, 12, 20, 1, 50, 30, 55, None, None, True, ((20, 1), (50, 30)))],
        1: [Attempt(1, 0, 72, 80, 12, 115, 80, 118, 11, "checkpoint", True, ((80, 12), (115, 80)))],
    }
    saved = [Saved(Kind.HPCLAUNCH, "step 10", 32, 11, 30, 2)]
    timeline = goodput.timeline(runs, found, saved, set(), 0, 500, True)
    assert timeline is not None
    return timeline


def test_the_text_gives_each_part_each_attempt_and_how_each_run_ended() -> None:
    text = report.text(JobStatus(7, state="COMPLETED"), two_runs())
    assert "goodput: 37.5 % of 2 min 00 s" in text
    assert re.search(r"    lost +\d+ s +\d+\.\d %", text)
    # Run 1 began 72 s after submission, resumed from 11 steps done and reached 80, as
    # status counts them.
    assert "  1    0        +1 min 12 s  +1 min 20 s  +1 min 55 s  11→80        1.94" in text
    assert "  run 0: requeued: bad nodes" in text and "  run 1: completed" in text


def svg(tmp_path: Path, timeline: goodput.Timeline) -> ET.Element:
    report.draw(timeline, tmp_path / "t.svg", "job 7")
    return ET.parse(tmp_path / "t.svg").getroot()


def test_the_svg_draws_every_run_and_names_how_each_ended(tmp_path: Path) -> None:
    root = svg(tmp_path, two_runs())
    texts = {"".join(e.itertext()).strip() for e in root.iter(f"{SVG}text")}
    assert {"run 0", "run 1", "queue", "requeued: bad nodes", "completed"} <= texts
    ids = {e.get("id") for e in root.iter()}
    assert {"productive-0", "productive-1", "lost-0", "ending-0", "ending-1"} <= ids
    assert {"rate-0-0", "rate-1-0"} <= ids


def _rate_line_y(root: ET.Element, gid: str) -> float:
    group = next(e for e in root.iter() if e.get("id") == gid)
    path = next(e for e in group.iter(f"{SVG}path"))
    return float(re.findall(r"[-\d.]+", path.get("d", ""))[1])


def _frame_top(root: ET.Element) -> float:
    """The top edge of the rate panel's frame (its second axes' patch)."""
    patches = [e for e in root.iter() if (e.get("id") or "").startswith("patch_")]
    frames = [p for p in patches if p.get("id") in {"patch_3", "patch_2"}]
    assert frames, [p.get("id") for p in patches]
    path = next(e for e in frames[-1].iter(f"{SVG}path"))
    ys = [float(v) for v in re.findall(r"[-\d.]+", path.get("d", ""))[1::2]]
    return min(ys)


def test_the_fastest_run_s_rate_is_inside_the_panel_not_on_its_frame(tmp_path: Path) -> None:
    root = svg(tmp_path, two_runs())
    top = _frame_top(root)
    fastest = _rate_line_y(root, "rate-1-0")  # SVG y grows downwards
    slower = _rate_line_y(root, "rate-0-0")
    assert top < fastest - 5 < slower  # below the frame's top edge, above the slower one


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


@pytest.mark.parametrize(
    ("run", "said"),
    [
        (RunTimes(0, 1, None), "running"),
        (RunTimes(0, 1, 9, "completed", "none"), "completed"),
        (RunTimes(0, 1, 9, "time limit", "requeue"), "requeued: time limit"),
        (RunTimes(0, 1, 9, "bad nodes", "give up"), "ended (give up): bad nodes"),
        (
            RunTimes(0, 1, 9, "the same error on every node", "none"),
            "ended: the same error on every node",
        ),
        (RunTimes(0, 1, 9, "cancelled", "none"), "ended: cancelled"),
        (RunTimes(0, 1, 9, "requeued by SLURM", "SLURM requeues"), "requeued by SLURM"),
    ],
)
def test_each_run_s_ending_in_words(run: RunTimes, said: str) -> None:
    assert report.ending(run) == said
