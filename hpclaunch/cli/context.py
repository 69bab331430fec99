"""What every command shares: the context object tests replace, the one
"print the error, exit with its code" helper, and the parameter types that parse
flag values with hpclaunch's own parsers."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import click

from hpclaunch.errors import HpclaunchError, SpecError
from hpclaunch.job.spec import EntryKind
from hpclaunch.slurm.commands import Slurm


@dataclass
class CliContext:
    """What commands need from the outside world; tests pass their own."""

    slurm: Slurm = field(default_factory=Slurm)
    cwd: Path = field(default_factory=Path.cwd)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def fail(exc: HpclaunchError) -> NoReturn:
    """Print ``exc`` as the one error paragraph and exit with its code."""
    click.echo(f"Error: {exc}", err=True)
    sys.exit(int(exc.exit_code))


def refuse_option_as_script(script: str) -> None:
    """ignore_unknown_options (which lets SCRIPT's own options through) would also
    take a mistyped hpclaunch option for SCRIPT: report it as click would."""
    if script.startswith("-") and script != "-":
        ctx = click.get_current_context()
        known = [opt for param in ctx.command.params for opt in param.opts]
        raise click.NoSuchOption(script.split("=")[0], possibilities=known, ctx=ctx)


def entry_kind(module: bool, no_python: bool) -> EntryKind:
    """What SCRIPT is, from -m/--module and --no-python (exits 2 when both are given)."""
    if module and no_python:
        fail(SpecError("module", "-m/--module and --no-python exclude each other; give one"))
    return EntryKind.MODULE if module else EntryKind.EXECUTABLE if no_python else EntryKind.SCRIPT


class BadValue(click.BadParameter):
    """A bad flag value: one ``Error:`` paragraph, like every other hpclaunch error
    (click's default would add the usage lines first)."""

    def show(self, file: Any = None) -> None:
        click.echo(f"Error: {self.format_message()}", err=True)


class SpecParam(click.ParamType):  # type: ignore[type-arg]
    """A flag value parsed by one of hpclaunch.job.spec's parsers."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self._parse(value)
        except SpecError as exc:
            raise BadValue(exc.message, ctx, param) from None


def _types() -> dict[str, SpecParam]:
    from hpclaunch.job import values

    return {
        "nodes": SpecParam("N|MIN:MAX", values.parse_nodes),
        "time": SpecParam("TIME", values.parse_time),
        "mem": SpecParam("SIZE", values.parse_mem),
        "env": SpecParam("KEY=VALUE", values.parse_env),
        "option": SpecParam("KEY[=VALUE]", values.parse_sbatch_option),
        "endpoints": SpecParam("HOST:PORT[,...]", values.parse_endpoints),
    }


TYPES = _types()


def etcd_access_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """TLS and user options for an etcd of your own, shared by sbatch and agent.
    No password option: it would land in the script and in ps."""
    options = [
        click.option(
            "--etcd-binary", help="The etcd server for --etcd-sidecar. [default: etcd on PATH]"
        ),
        click.option("--etcd-cacert", help="CA certificate of the etcd server (turns on TLS)."),
        click.option("--etcd-cert", help="Client certificate for etcd (with --etcd-key)."),
        click.option("--etcd-key", help="Client certificate key for etcd."),
        click.option("--etcd-user", help="etcd user; the password comes from --etcd-password-file "
                     "or $HPCLAUNCH_ETCD_PASSWORD."),
        click.option("--etcd-password-file", help="File whose first line is the etcd password."),
    ]  # fmt: skip
    for option in reversed(options):
        fn = option(fn)
    return fn
