"""The values the rendered script passes on to the agent, and their parsers: a node
range (``2:4``), a hang timeout (``auto``, ``off``, seconds) and etcd endpoints. The
login node parses what users type with these parsers, and the agent parses its options
with the same ones (the ``Parsed`` rows of ``hpclaunch.contract.table``), so a value
means the same on both sides. Pure; each parser raises SpecError naming the option.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from hpclaunch.errors import SpecError

# Patterns are compiled on first use (re's own cache), not by every command that loads
# this module.
_SIGNED = r"-?[0-9]+\Z"


@dataclass(frozen=True)
class NodeRange:
    """A node count, fixed (``min == max``) or elastic."""

    min: int
    max: int

    def __post_init__(self) -> None:
        if self.min < 1:
            raise SpecError(
                "nodes", f"node count {self.min} is not positive; ask for at least 1 node"
            )
        if self.min > self.max:
            raise SpecError(
                "nodes",
                f"node range {self.min}:{self.max} has MIN > MAX; "
                f"write it as {self.max}:{self.min}",
            )

    @property
    def is_elastic(self) -> bool:
        return self.min != self.max

    def multiples(self, k: int) -> tuple[int, int] | None:
        """The smallest and largest multiples of ``k`` in the range; None if none is."""
        low, high = -(-self.min // k) * k, self.max // k * k
        return (low, high) if low <= high else None

    def __str__(self) -> str:
        """The form the CLI takes and the agent receives: ``N`` or ``MIN:MAX``."""
        return str(self.min) if not self.is_elastic else f"{self.min}:{self.max}"

    @property
    def sbatch(self) -> str:
        """SLURM's form: ``N`` or ``MIN-MAX``."""
        return str(self.min) if not self.is_elastic else f"{self.min}-{self.max}"


def parse_nodes(text: str) -> NodeRange:
    """Parse ``N`` or ``MIN:MAX``. Raises SpecError."""
    text = text.strip()
    parts = text.split(":")
    if len(parts) > 2 or not all(re.match(_SIGNED, p.strip()) for p in parts):
        hint = ""
        if re.fullmatch(r"[0-9]+-[0-9]+", text):
            hint = f"; for a range write {text.replace('-', ':')}"
        raise SpecError(
            "nodes", f"{text!r} is not a node count: use N or MIN:MAX, e.g. 4 or 2:4{hint}"
        )
    low = int(parts[0])
    return NodeRange(low, int(parts[-1]))


# --hang-timeout: the automatic timeout's words (hpclaunch.node.hangs documents them).
HANG_AUTO, HANG_OFF = "auto", "off"
HANG_FLOOR_S = 300.0  # auto: never less than this,
HANG_MULTIPLE = 10.0  # and this many times the slowest step seen (hpclaunch.node.hangs)
MIN_HANG_TIMEOUT_S = 1.0  # the watch looks twice a second: less would see hangs in steps
# The bounds of the stretches between steps, in the same words (auto, off, seconds):
# --checkpoint-timeout (a save or load through hpclaunch.checkpoint), --pause-timeout (the
# script's own hpclaunch.progress.paused()), --first-step-timeout (from an attempt's start
# to its first step). auto: STRETCH_MULTIPLE times the longest the job's recent saves and
# its starts were seen to take (LOAD_MULTIPLE for a load: every rank may read one file that
# one rank wrote), at least STRETCH_FLOOR_S; UNSEEN_SAVE_S for a save or load before any
# save of the job was recorded; PAUSE_S for a pause; the first step of an attempt is
# watched only on a node that stepped in an earlier attempt, and never shorter than a
# load (the attempt may resume) (hpclaunch.node.hangs).
STRETCH_FLOOR_S = 300.0
STRETCH_MULTIPLE = 10.0
LOAD_MULTIPLE = 2 * STRETCH_MULTIPLE
UNSEEN_SAVE_S = 1800.0
PAUSE_S = 3600.0


class TimeoutField(enum.Enum):
    """The watch's timeouts, each by the spec's field (the option is its --dashed name)."""

    HANG = "hang_timeout"
    CHECKPOINT = "checkpoint_timeout"
    PAUSE = "pause_timeout"
    FIRST_STEP = "first_step_timeout"


# What each option's auto means, for its error message.
_AUTO_MEANS = {
    TimeoutField.HANG: "a multiple of the slowest step, with a floor",
    TimeoutField.CHECKPOINT: "a multiple of the job's slowest recent save, with a floor",
    TimeoutField.PAUSE: f"{PAUSE_S:g} s",
    TimeoutField.FIRST_STEP: "once the node has stepped, a multiple of the longest start "
    "seen, at least the load's bound",
}


def parse_hang_timeout(text: str | float) -> str:
    """``auto``, ``off`` or seconds above 0, as the agent's option writes it. Raises SpecError."""
    return parse_timeout(text, TimeoutField.HANG)


def parse_checkpoint_timeout(text: str | float) -> str:
    """``--checkpoint-timeout``: as ``parse_timeout``. Raises SpecError."""
    return parse_timeout(text, TimeoutField.CHECKPOINT)


def parse_pause_timeout(text: str | float) -> str:
    """``--pause-timeout``: as ``parse_timeout``. Raises SpecError."""
    return parse_timeout(text, TimeoutField.PAUSE)


def parse_first_step_timeout(text: str | float) -> str:
    """``--first-step-timeout``: as ``parse_timeout``. Raises SpecError."""
    return parse_timeout(text, TimeoutField.FIRST_STEP)


def parse_timeout(text: str | float, field: TimeoutField) -> str:
    """A watch's timeout for the option of ``field`` (one of the hang and stretch timeouts):
    ``auto``, ``off`` or seconds, at least MIN_HANG_TIMEOUT_S, as the agent's option writes
    it. Raises SpecError naming the option."""
    value = str(text).strip().lower()
    if value in (HANG_AUTO, HANG_OFF):
        return value
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not MIN_HANG_TIMEOUT_S <= seconds < float("inf"):
        what = "without progress" if field is TimeoutField.HANG else "it may last"
        raise SpecError(
            field.value,
            f"{text!r} is not a {field.value.replace('_', ' ')}; give seconds {what} (at least "
            f"{MIN_HANG_TIMEOUT_S:g}), {HANG_AUTO!r} ({_AUTO_MEANS[field]}) or {HANG_OFF!r}",
        )
    return f"{seconds:f}".rstrip("0").rstrip(".")


def parse_endpoints(text: str) -> tuple[str, ...]:
    """Parse ``host:port[,host:port...]``. Raises SpecError."""
    endpoints = tuple(part.strip() for part in text.split(",") if part.strip())
    if not endpoints:
        raise SpecError(
            "etcd_endpoint", f"{text!r} names no endpoint; write host:port[,host:port...]"
        )
    return endpoints


def agent_grace_for(signal_lead_s: float) -> int:
    """How long each agent gives its workers after passing a signal on: three quarters
    of the signal lead, so that a checkpoint written after the time-limit warning is
    done before SLURM's limit."""
    return max(1, int(signal_lead_s) * 3 // 4)
