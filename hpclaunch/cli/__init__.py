"""The ``hpclaunch`` command: a thin click layer over the library.

Each command lives in a module of its own here and is imported only when it runs,
so that ``hpclaunch sbatch`` pays for nothing else; none imports torch (the login
node must answer in a fraction of a second).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import click

from hpclaunch._version import __version__
from hpclaunch.cli.context import CliContext

__all__ = ["CliContext", "main"]


class _Commands(click.Group):
    """The group, importing the commands that live in other modules only when used,
    so that ``hpclaunch sbatch`` does not pay for them."""

    LAZY: Mapping[str, tuple[str, str]] = {
        "agent": ("hpclaunch.cli.agent", "agent"),
        "cancel": ("hpclaunch.cli.jobs", "cancel"),
        "config": ("hpclaunch.cli.config", "config"),
        "doctor": ("hpclaunch.cli.doctor", "doctor"),
        "init": ("hpclaunch.cli.config", "init"),
        "list": ("hpclaunch.cli.jobs", "list_jobs"),
        "logs": ("hpclaunch.cli.jobs", "logs"),
        "report": ("hpclaunch.cli.report", "report_command"),
        "sandbox": ("hpclaunch.sandbox.cli", "sandbox"),
        "sbatch": ("hpclaunch.cli.sbatch", "sbatch"),
        "stacks": ("hpclaunch.cli.jobs", "stacks"),
        "status": ("hpclaunch.cli.jobs", "status"),
        "supervise": ("hpclaunch.cli.supervise", "supervise"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY:
            import importlib

            module, name = self.LAZY[cmd_name]
            command: click.Command = getattr(importlib.import_module(module), name)
            return command
        return super().get_command(ctx, cmd_name)


def configure_logging() -> None:
    """Library warnings on stderr, each line as ``hpclaunch: MESSAGE``."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="hpclaunch: %(message)s")


def _print_version(ctx: click.Context, _: click.Parameter, asked: bool) -> None:
    if asked and not ctx.resilient_parsing:
        click.echo(f"hpclaunch, version {__version__}")
        ctx.exit()


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
# click.version_option's message is translated when the command is defined (gettext
# searches for catalogues then, on every call): plain text costs nothing until asked.
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)
@click.pass_context
def main(ctx: click.Context) -> None:
    """Launch distributed PyTorch jobs on SLURM: render, submit, supervise."""
    # `hpclaunch sbatch` logs nothing until it submits (which calls configure_logging):
    # a dry run does not pay for importing logging, a tenth of its start-up.
    if ctx.invoked_subcommand != "sbatch" or "logging" in sys.modules:
        configure_logging()
    if ctx.obj is None:
        ctx.obj = CliContext()
