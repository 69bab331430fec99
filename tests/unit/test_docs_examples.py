"""The console examples in ``docs/*.md`` print what the CLI prints today.

What is checked, and how:

* **Examples.** Every fenced block tagged ``console`` is a transcript: a line starting
  with ``$ `` is a command (a command line ending in ``\\`` continues on the next line),
  and the lines after it, up to the next ``$ `` line or the end of the block, are its
  expected output. Fences may be indented (inside a list item); the fence's indentation
  is removed from the block's lines.
* **Which blocks run.** Every console block runs, except one whose fence is directly
  preceded by a ``<!-- no-check: REASON -->`` line: that is how a page marks a command
  that cannot run offline (a real submission, a shell pipeline into other programs).
  A console block that runs may hold only these commands, so a parser slip or a new kind
  of example fails instead of being skipped:

  - ``hpclaunch ARGS...``, with an optional trailing ``# comment`` and an optional
    ``| head -N`` (the first N lines of stdout; stderr must then be empty);
  - ``echo $?``, whose expected output is the exit status of the command before it.

  Anything else, or a console block without any ``$ `` line, fails
  ``test_every_console_block_runs_or_is_marked``. ``test_enough_examples_are_checked``
  asserts a minimum number of examples per page, so the check cannot become vacuous.
* **How a command runs.** In-process, through click's CliRunner: the line is split with
  ``shlex.split`` and the leading ``hpclaunch`` dropped. SLURM's commands are absent
  (``FakeRunner({})``: submitting gives "sbatch is not on PATH"). HOME is a fresh
  temporary folder, shown in the docs as ``/home/me``; the command runs in
  ``HOME/project`` (``/home/me/project``), which holds an empty ``train.py``. Before the
  comparison every occurrence of the temporary HOME path in the output is replaced by
  ``/home/me``.
* **What is compared.** The output as a terminal shows it: stdout and stderr interleaved
  (click's ``Result.output``), byte for byte, against the expected lines joined with line
  breaks. The exit status must be the one an ``echo $?`` after the command shows; without
  one it must be non-zero when the expected output has an ``Error: `` line, and 0 otherwise.
* **Files an example needs.** A fenced block (of any language) directly preceded by a
  ``<!-- file: PATH -->`` line is written to PATH, verbatim, for the examples that follow
  it on the same page; a later block for the same PATH replaces it. PATH is relative to
  the project folder (``hpclaunch.toml``, ``site.sh.j2``), or starts with ``~/`` for one
  under HOME (``~/.config/hpclaunch/config.toml``). Scripts other than ``train.py`` are
  provided the same way.

Each example is one test, with the id ``PAGE-N`` (the N-th command on the page).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

import pytest
from click.testing import CliRunner

from hpclaunch.cli import CliContext, main
from hpclaunch.slurm.commands import FakeRunner, Slurm

DOCS = Path(__file__).resolve().parents[2] / "docs"
SHOWN_HOME = "/home/me"
PROJECT = "project"
SCRIPT = "train.py"

# Commands checked per page, at least: lower a number only when removing an example.
MINIMUM_EXAMPLES = {"cli.md": 9, "profiles.md": 5, "templates.md": 2}

_FENCE = re.compile(r"(?P<indent>[ \t]*)(?P<fence>```+)[ \t]*(?P<info>[^`\s]*)[^`]*\Z")
_FILE_MARK = re.compile(r"<!--\s*file:\s*(?P<path>\S+)\s*-->\Z")
_NO_CHECK_MARK = re.compile(r"<!--\s*no-check:\s*(?P<reason>\S.*?)\s*-->\Z")
_HEAD = re.compile(r"-(?P<n>\d+)\Z")
_SHELL_OPERATORS = {"|", "||", "&", "&&", ";", ">", ">>", "<", "2>", "2>&1"}


@dataclass(frozen=True)
class Block:
    """A fenced block: where it starts, its info string, the marker line before it."""

    page: str
    line: int  # 1-based line of the opening fence
    info: str
    marker: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Example:
    """One ``$ hpclaunch ...`` command of a page, with what it must print."""

    page: str
    index: int
    line: int  # 1-based line of the ``$ `` prompt
    command: str
    argv: tuple[str, ...]  # after ``hpclaunch``
    head: int | None
    output: str
    status: int | None  # from a following ``echo $?``
    files: tuple[tuple[str, str], ...]  # (PATH as marked, content), in page order

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def fenced_blocks(page: str, text: str) -> list[Block]:
    """The fenced blocks of a Markdown page, with the fence's indentation removed."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.fullmatch(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            line = lines[j]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            j += 1
        if j == len(lines):
            raise ValueError(f"docs/{page}:{i + 1}: the fence opened here is never closed")
        marker = lines[i - 1].strip() if i > 0 else ""
        blocks.append(Block(page, i + 1, opening["info"], marker, tuple(body)))
        i = j + 1
    return blocks


def transcript(block: Block) -> list[tuple[int, str, list[str]]]:
    """A console block as (line of the prompt, command, output lines), continuations joined."""
    out: list[tuple[int, str, list[str]]] = []
    lines = list(block.lines)
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            if not out:
                raise ValueError(f"line {line!r} comes before any '$ ' command")
            out[-1][2].append(line)
            i += 1
            continue
        start = block.line + 1 + i
        command = line[2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1] + lines[i]
        out.append((start, command, []))
        i += 1
    return out


def split_command(command: str) -> tuple[tuple[str, ...], int | None]:
    """``hpclaunch ARGS... [| head -N]`` → (ARGS, N). Raises ValueError for anything else."""
    words = shlex.split(command, comments=True)
    head = None
    if "|" in words:
        pipe = words.index("|")
        match = _HEAD.fullmatch(words[-1]) if len(words) == pipe + 3 else None
        if words[pipe + 1 : pipe + 2] != ["head"] or match is None:
            raise ValueError("the only pipe a checked command may have is '| head -N'")
        words, head = words[:pipe], int(match["n"])
    if not words or words[0] != "hpclaunch":
        raise ValueError("a checked command must be 'hpclaunch ...' or 'echo $?'")
    operators = _SHELL_OPERATORS.intersection(words)
    if operators:
        raise ValueError(f"shell operator {sorted(operators)[0]!r} in a checked command")
    return tuple(words[1:]), head


def page_examples(page: str, text: str) -> tuple[list[Example], list[str]]:
    """The examples of one page, and the problems that keep a block from being checked."""
    examples: list[Example] = []
    problems: list[str] = []
    files: dict[str, str] = {}
    for block in fenced_blocks(page, text):
        where = f"docs/{page}:{block.line}"
        file_mark = _FILE_MARK.fullmatch(block.marker)
        if file_mark is not None:
            path = PurePosixPath(file_mark["path"].removeprefix("~/"))
            if path.is_absolute() or ".." in path.parts:
                problems.append(f"{where}: file path {file_mark['path']!r} leaves the folders")
            else:
                files[file_mark["path"]] = "".join(line + "\n" for line in block.lines)
            continue
        if block.info != "console" or _NO_CHECK_MARK.fullmatch(block.marker):
            continue
        if block.marker.startswith("<!--"):
            problems.append(f"{where}: unknown marker {block.marker!r}")
        try:
            commands = transcript(block)
            if not commands:
                raise ValueError("no '$ ' command in a console block")
            for line, command, output in commands:
                if shlex.split(command, comments=True) == ["echo", "$?"]:
                    previous = examples[-1] if examples and examples[-1].line < line else None
                    if previous is None or previous.line < block.line or len(output) != 1:
                        raise ValueError("'echo $?' must follow a command, and show one number")
                    examples[-1] = replace(previous, status=int(output[0]))
                    continue
                argv, head = split_command(command)
                examples.append(
                    Example(
                        page=page,
                        index=len(examples) + 1,
                        line=line,
                        command=command,
                        argv=argv,
                        head=head,
                        output="".join(text + "\n" for text in output),
                        status=None,
                        files=tuple(files.items()),
                    )
                )
        except ValueError as exc:
            problems.append(
                f"{where}: {exc}; make the block a plain transcript of hpclaunch commands, "
                "or put '<!-- no-check: REASON -->' on the line before its fence"
            )
    return examples, problems


def collect() -> tuple[list[Example], list[str]]:
    examples: list[Example] = []
    problems: list[str] = []
    for path in sorted(DOCS.glob("*.md")):
        found, trouble = page_examples(path.name, path.read_text(encoding="utf-8"))
        examples += found
        problems += trouble
    return examples, problems


EXAMPLES, PROBLEMS = collect()


def run_example(example: Example, home: Path) -> tuple[str, int]:
    """Run ``example`` with ``home`` as HOME; return (output as the docs show it, status)."""
    project = home / PROJECT
    project.mkdir()
    (project / SCRIPT).write_text("")
    for name, content in example.files:
        target = home / name[2:] if name.startswith("~/") else project / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    obj = CliContext(slurm=Slurm(FakeRunner({})), cwd=project, env={"HOME": str(home)})
    result = CliRunner().invoke(main, list(example.argv), obj=obj, prog_name="hpclaunch")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    if example.head is None:
        output = result.output
    else:
        assert result.stderr == "", f"{example.where}: stderr is not piped to head"
        output = "".join(result.stdout.splitlines(keepends=True)[: example.head])
    return output.replace(str(home), SHOWN_HOME), result.exit_code


@pytest.mark.parametrize(
    "example", EXAMPLES, ids=[f"{example.page}-{example.index}" for example in EXAMPLES]
)
def test_doc_example(example: Example, tmp_path: Path) -> None:
    output, status = run_example(example, tmp_path)
    assert output == example.output, (
        f"{example.where}: `$ {example.command}` prints something else now; "
        "update the doc from the real CLI"
    )
    if example.status is not None:
        assert status == example.status, f"{example.where}: exit status {status}"
    elif any(line.startswith("Error: ") for line in example.output.splitlines()):
        assert status != 0, f"{example.where}: the doc shows an error, but the exit status is 0"
    else:
        assert status == 0, f"{example.where}: exit status {status}"


def test_every_console_block_runs_or_is_marked() -> None:
    assert PROBLEMS == []


def test_enough_examples_are_checked() -> None:
    counts = {page: 0 for page in MINIMUM_EXAMPLES}
    for example in EXAMPLES:
        counts[example.page] = counts.get(example.page, 0) + 1
    short = {page: n for page, n in counts.items() if n < MINIMUM_EXAMPLES.get(page, 0)}
    assert not short, f"fewer examples found than expected: {short}, minimum {MINIMUM_EXAMPLES}"


def test_parser_reads_a_transcript() -> None:
    page = "\n".join(
        [
            "<!-- file: ~/x.toml -->",
            "```toml",
            "a = 1",
            "```",
            "- item",
            "",
            "  ```console",
            "  $ hpclaunch sbatch --dry-run \\",
            "      --nodes 2 train.py | head -2   # note",
            "  #!/bin/bash",
            "  #SBATCH --job-name=train",
            "  $ echo $?",
            "  0",
            "  $ hpclaunch sbatch --bad",
            "  Error: x \\",
            "  ```",
            "<!-- no-check: submits -->",
            "```console",
            "$ jobid=$(hpclaunch sbatch train.py)",
            "```",
            "```console",
            "$ hpclaunch sbatch x > y",
            "```",
        ]
    )
    examples, problems = page_examples("p.md", page)
    assert [(e.line, e.argv, e.head, e.output, e.status) for e in examples] == [
        (
            8,
            ("sbatch", "--dry-run", "--nodes", "2", "train.py"),
            2,
            "#!/bin/bash\n#SBATCH --job-name=train\n",
            0,
        ),
        (14, ("sbatch", "--bad"), None, "Error: x \\\n", None),
    ]
    assert examples[0].files == (("~/x.toml", "a = 1\n"),)
    assert len(problems) == 1 and "docs/p.md:21: shell operator '>'" in problems[0]
