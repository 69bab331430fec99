"""The ``hpclaunch`` command: a thin click layer over the library.

Each command lives in a module of its own here and is imported only when it runs,
so that ``hpclaunch sbatch`` pays for nothing else; none imports torch (the login
node must answer in a fraction of a second).
"""

from __future__ import annotations

import logging
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


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpclaunch")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Launch distributed PyTorch jobs on SLURM: render, submit, supervise."""
    logging.basicConfig(level=logging.WARNING, format="hpclaunch: %(message)s")
    if ctx.obj is None:
        ctx.obj = CliContext()
