"""torch's known-harmless lines: which are taken out of the batch log, and the summary.
The input is a batch log recorded on the sandbox (torch 2.13, examples/train.py on 3 nodes)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from hpclaunch.recovery.noise import Noise
from hpclaunch.recovery.stepdeath import Tee

RECORDED = (Path(__file__).parent / "torch_noise_recorded.txt").read_text().splitlines()


def test_the_recorded_noise_is_taken_and_the_rest_is_kept() -> None:
    noise = Noise()
    kept = [line for line in RECORDED if not noise.take(line)]
    heads = [line for line in RECORDED if "TCPStore.cpp" in line]  # the warnings stay
    assert len(heads) == 2
    assert kept == [
        line for line in RECORDED if line.startswith(("[rank0] ", "W1124", "hpc")) or line in heads
    ]
    assert (noise.hostname, noise.stacks) == (2, 2)
    assert noise.stack_text.startswith("recvVector failed: Failed to recv, got 0 bytes.")
    first, second = noise.summary("/j/logs/requeue-0/torch-noise.log")
    assert first.startswith(
        "torch's c10d warned 2 times (once per agent and worker) that "
        "'The hostname of the client socket cannot be retrieved. err=-3'"
    )
    assert "docs/troubleshooting.md" in first and first.endswith("torch-noise.log")
    assert second.startswith("torch printed 2 C++ stacks of its rendezvous store")


def test_a_stack_ends_at_the_first_line_of_something_else() -> None:
    noise = Noise()
    head = (
        "[W1124 11:47:12.151164755 TCPStore.cpp:106] [c10d] sendBytes failed on "
        "SocketImpl(fd=4, addr=[::1]:30791, remote=[::1]:38043): Broken pipe"
    )
    lines = [
        head,
        "frame #0: c10::Error::Error() + 0x9d",
        "Traceback (most recent call last):",
        "frame #1: not after a head",
    ]
    assert [noise.take(line) for line in lines] == [False, True, False, False]
    assert noise.summary("f") == [
        "torch printed 1 C++ stack of its rendezvous store ('sendBytes failed: Broken pipe'), "
        "each after the TCPStore warning above: harmless at the end of a run, where an "
        "agent's last store request finds the store's host gone (see "
        "docs/troubleshooting.md); the frames are in f"
    ]


def test_nothing_seen_nothing_said() -> None:
    noise = Noise()
    assert not noise.take("[rank0] START {}")
    assert noise.summary("f") == []


def test_the_tee_keeps_noise_out_of_the_batch_log_and_in_its_file(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    raw = tmp_path / "logs" / "requeue-0" / "torch-noise.log"
    source = io.BytesIO("".join(line + "\n" for line in RECORDED).encode())
    tee = Tee(source, raw).start()
    assert tee.deaths() == ()  # waits for the copy to end
    printed = capfd.readouterr().err.splitlines()
    assert printed == [
        line
        for line in RECORDED
        if line.startswith(("[rank0] ", "W1124", "hpc")) or "TCPStore.cpp" in line
    ]
    assert raw.read_text().splitlines() == [line for line in RECORDED if line not in printed]
    assert [line.split(" ", 3)[:3] for line in tee.summary()] == [
        ["torch's", "c10d", "warned"],
        ["torch", "printed", "2"],
    ]


def test_without_a_file_the_tee_copies_everything(capfd: pytest.CaptureFixture[str]) -> None:
    tee = Tee(io.BytesIO(b"[rank1] [W1125 04:59:34.1 socket.cpp:207] [c10d] x\n")).start()
    tee.deaths()
    assert capfd.readouterr().err == "[rank1] [W1125 04:59:34.1 socket.cpp:207] [c10d] x\n"
    assert tee.summary() == []


def test_a_noise_file_that_cannot_be_written_does_not_stop_the_copy(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A full job folder (/dev/full refuses every write, as a full filesystem does):
    the noise is counted and dropped, every other line still reaches the batch log."""
    many = RECORDED * 40  # more than a write buffer of noise
    source = io.BytesIO("".join(line + "\n" for line in many).encode())
    tee = Tee(source, Path("/dev/full")).start()
    assert tee.deaths() == ()
    printed = capfd.readouterr().err.splitlines()
    kept = [line for line in many if line.startswith(("[rank0] ", "W1124", "hpc"))]
    assert [line for line in printed if line.startswith(("[rank0] ", "W1124", "hpc"))] == kept
    said = tee.summary()
    assert said[0].split(" ", 3)[:3] == ["torch's", "c10d", "warned"]
    assert said[0].endswith("/dev/full (which refused them: No space left on device (ENOSPC))")
