"""The CLI reference (``docs/cli-reference.md``), generated from the click commands
themselves: ``python -m hpclaunch.cli.reference > docs/cli-reference.md``.

tests/unit/test_cli_reference.py regenerates it and fails when the file differs,
so an option added, renamed or documented anew shows up in the docs in the same
change; it also fails on an option without help text.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import click

HEADER = """# CLI reference

Every `hpclaunch` command and option, generated from the commands themselves by
`python -m hpclaunch.cli.reference > docs/cli-reference.md` (a test keeps it in sync).
The guides explain them in context: [sbatch](cli.md), [agent](agent.md),
[operating jobs](operating.md), [sandbox](sandbox.md).
"""


def commands(
    group: click.Group, ctx: click.Context
) -> Iterator[tuple[click.Command, click.Context]]:
    """Every command under ``group``, depth first, in name order."""
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        sub = click.Context(command, info_name=name, parent=ctx, **command.context_settings)
        yield command, sub
        if isinstance(command, click.Group):
            yield from commands(command, sub)


def undocumented(command: click.Command, ctx: click.Context) -> list[str]:
    """The options of ``command`` that have no help text."""
    return [
        "/".join(param.opts)
        for param in command.get_params(ctx)
        if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip()
    ]


def _section(command: click.Command, ctx: click.Context) -> list[str]:
    path = ctx.command_path
    lines = [f"## `{path}`", ""]
    pieces = command.collect_usage_pieces(ctx)
    lines += ["```text", f"Usage: {path} {' '.join(pieces)}".rstrip(), "```", ""]
    text = (command.help or "").strip()
    if text:
        lines += [_plain(text), ""]
    rows = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        opts, help_text = record
        rows.append(f"| `{_cell(opts)}` | {_cell(help_text)} |")
    if rows:
        lines += ["| Option | Meaning |", "|---|---|", *rows, ""]
    if isinstance(command, click.Group):
        subs = [
            f"- `{path} {name}`: {_cell(sub.get_short_help_str(limit=120))}"
            for name in command.list_commands(ctx)
            if (sub := command.get_command(ctx, name)) is not None and not sub.hidden
        ]
        lines += ["Commands:", "", *subs, ""]
    return lines


def _plain(text: str) -> str:
    """click's help text as Markdown: paragraphs kept, click's \\b markers dropped."""
    return "\n".join(line for line in text.splitlines() if line.strip() != "\b")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def root_context(main: click.Group) -> click.Context:
    """The context ``hpclaunch`` runs in, with its settings (``-h`` for help)."""
    return click.Context(main, info_name="hpclaunch", **main.context_settings)


def reference(main: click.Group) -> str:
    """The whole reference as Markdown."""
    root = root_context(main)
    lines = [HEADER, *_section(main, root)]
    for command, ctx in commands(main, root):
        lines += _section(command, ctx)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    from hpclaunch.cli import main as cli

    sys.stdout.write(reference(cli))
    return 0


if __name__ == "__main__":
    sys.exit(main())
