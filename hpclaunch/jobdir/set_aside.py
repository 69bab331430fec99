"""The checkpoints ``load_latest`` set aside, and why: global rank 0 appends one JSON
line per checkpoint it renamed out of the committed set to the job folder's
``checkpoints-set-aside.jsonl`` (hpclaunch.checkpoint.loading); ``hpclaunch status``
names each one. No torch."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from hpclaunch.jobdir import typed
from hpclaunch.jobdir.atomic import append_line


@dataclass(frozen=True)
class SetAside:
    step: int
    problem: str  # hpclaunch.checkpoint.manifest.Problem's value: "checksum mismatch"
    file: str | None  # the file it was found in; None: the checkpoint as a whole
    reason: str  # the error's line
    renamed_to: str  # the path it has now
    ended: float  # when it was set aside (seconds since the epoch)

    def describe(self) -> str:
        """As ``hpclaunch status`` says it: ``checkpoint step 15 set aside: checksum
        mismatch in __1_0.distcp (now /ckpt/step-000000000015.damaged)``."""
        where = f" in {self.file}" if self.file else ""
        return (
            f"checkpoint step {self.step} set aside: {self.problem}{where} (now {self.renamed_to})"
        )


def append(path: Path, record: SetAside) -> None:
    """One line, appended in one write (O_APPEND): a reader sees whole lines."""
    append_line(path, json.dumps(asdict(record), sort_keys=True) + "\n")


def parse(lines: Iterable[str]) -> list[SetAside]:
    """The records among ``lines``, oldest first; a torn or foreign line is skipped."""
    found = []
    for line in lines:
        try:
            found.append(typed.load(SetAside, json.loads(line)))
        except ValueError:
            continue
    return found


def read(path: Path) -> list[SetAside]:
    """Every readable record in ``path``; none when it cannot be read."""
    try:
        return parse(path.read_text(errors="replace").splitlines())
    except OSError:
        return []
