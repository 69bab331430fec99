"""docs/cli-reference.md is generated from the click commands: an option added or
changed without regenerating it (or without help text) fails here."""

from __future__ import annotations

from pathlib import Path

import click

from hpclaunch.cli import main
from hpclaunch.cli.reference import commands, reference, root_context, undocumented

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "cli-reference.md"


def test_every_option_has_help_text() -> None:
    root = root_context(main)
    missing = {
        ctx.command_path: names
        for command, ctx in commands(main, root)
        if (names := undocumented(command, ctx))
    }
    assert missing == {}, f"options without help=...: {missing}"


def test_the_reference_matches_the_commands() -> None:
    assert REFERENCE.read_text() == reference(main), (
        "docs/cli-reference.md is out of date: run "
        "`python -m hpclaunch.cli.reference > docs/cli-reference.md` and commit it"
    )


def test_the_reference_names_every_command_and_option() -> None:
    text = REFERENCE.read_text()
    root = root_context(main)
    for command, ctx in commands(main, root):
        assert f"## `{ctx.command_path}`" in text
        for param in command.get_params(ctx):
            if isinstance(param, click.Option) and not param.hidden:
                assert param.opts[0] in text, (ctx.command_path, param.opts)


def test_an_option_added_without_docs_is_caught() -> None:
    root = root_context(main)
    command = main.get_command(root, "status")
    assert command is not None
    added = click.Option(["--brand-new"], is_flag=True)  # no help text
    command.params.append(added)
    try:
        assert reference(main) != REFERENCE.read_text()  # the sync test fails
        ctx = click.Context(command, info_name="status", parent=root)
        assert undocumented(command, ctx) == ["--brand-new"]  # and so does the help test
    finally:
        command.params.remove(added)
    assert reference(main) == REFERENCE.read_text()
