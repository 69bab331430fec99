"""docs/quickstart.md as a script: which of its commands run on the sandbox, in order,
and how the output the page shows is compared with what they print.

* **Which blocks run.** A ``console`` block whose fence is directly preceded by
  ``<!-- no-check: sandbox (...) -->`` runs on the sandbox (the offline check of
  tests/unit/test_docs_examples.py skips it, as it skips every no-check block). Every
  other console block of the page must carry a no-check reason listed in
  ``KEPT_OUT``: those need what a test cannot do (install packages); a block with any
  other reason, or none, is an error, so that no command slips out of the test unseen.
* **How they run.** In order, in one bash process (so that ``eval`` and ``job=$(...)``
  carry over), stdout and stderr together, in a folder that stands for the checkout's
  root (the page says to run from there).
* **What is compared.** The lines a command shows after it, in order, must each match a
  line of what it printed, later lines after earlier ones; lines it printed that the page
  does not show are allowed (the page shows what is worth reading). In a shown line,
  ``<JOBID>`` stands for a job id (digits) and ``...`` for any text; a shown line that is
  only ``...`` stands for any number of lines and is skipped. Every command must exit 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.unit.test_docs_examples import fenced_blocks, transcript

PAGE = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"
SANDBOX_MARK = re.compile(r"<!--\s*no-check:\s*sandbox\b.*-->\Z")
NO_CHECK = re.compile(r"<!--\s*no-check:\s*(?P<reason>\S.*?)\s*-->\Z")
KEPT_OUT = frozenset({"installs packages"})
PLACEHOLDERS = {"<JOBID>": r"\d+", "...": r".*"}
_PLACEHOLDER = re.compile("|".join(re.escape(key) for key in PLACEHOLDERS))


@dataclass(frozen=True)
class Step:
    """One ``$ `` command of the page that runs on the sandbox, with its shown lines."""

    line: int  # 1-based line of the prompt in the page
    command: str
    shown: tuple[str, ...]


def line_pattern(shown: str) -> re.Pattern[str]:
    """The regular expression a printed line must match in full for a shown line."""
    parts: list[str] = []
    at = 0
    for match in _PLACEHOLDER.finditer(shown):
        parts.append(re.escape(shown[at : match.start()]))
        parts.append(PLACEHOLDERS[match.group()])
        at = match.end()
    parts.append(re.escape(shown[at:]))
    return re.compile("".join(parts))


def missing(shown: tuple[str, ...], printed: list[str]) -> str | None:
    """The first shown line that the printed lines do not hold in order, or None."""
    at = 0
    for want in shown:
        if want.strip() == "...":
            continue
        pattern = line_pattern(want.rstrip())
        while at < len(printed) and not pattern.fullmatch(printed[at].rstrip()):
            at += 1
        if at == len(printed):
            return want
        at += 1
    return None


def steps(text: str) -> list[Step]:
    """The page's commands that run on the sandbox, in order. Raises ValueError for a
    console block that neither runs nor is kept out for a reason in KEPT_OUT."""
    out: list[Step] = []
    for block in fenced_blocks(PAGE.name, text):
        if block.info != "console":
            continue
        if SANDBOX_MARK.fullmatch(block.marker) is None:
            mark = NO_CHECK.fullmatch(block.marker)
            if mark is None or mark["reason"] not in KEPT_OUT:
                raise ValueError(
                    f"docs/{PAGE.name}:{block.line}: a console block must be marked "
                    f"'<!-- no-check: sandbox (...) -->' or kept out for one of {sorted(KEPT_OUT)}"
                )
            continue
        for line, command, shown in transcript(block):
            out.append(Step(line, command, tuple(shown)))
    return out


def script(commands: list[Step]) -> str:
    """A bash script running the commands in order, each framed by markers that
    ``split_output`` reads back: its number before, its exit status after."""
    lines = ["exec 2>&1"]
    for number, step in enumerate(commands):
        lines.append(f"printf '\\n@@step {number}@@\\n'")
        lines.append(step.command)
        lines.append("printf '\\n@@status %d@@\\n' $?")
    return "\n".join(lines) + "\n"


def split_output(output: str) -> dict[int, tuple[int | None, list[str]]]:
    """The script's output → {step number: (its exit status, the lines it printed)}.
    A step the script never finished has the status None."""
    found: dict[int, tuple[int | None, list[str]]] = {}
    number: int | None = None
    printed: list[str] = []
    for line in output.splitlines():
        start = re.fullmatch(r"@@step (\d+)@@", line)
        end = re.fullmatch(r"@@status (\d+)@@", line)
        if start:
            number, printed = int(start[1]), []
            found[number] = (None, printed)
        elif end and number is not None:
            found[number] = (int(end[1]), printed)
            number = None
        elif number is not None and line:
            printed.append(line)
    return found
