"""What every command shares: the context object tests replace, the one
"print the error, exit with its code" helper, and the parameter types that parse
flag values with hpclaunch's own parsers."""

from __future__ import annotations

import enum
import functools
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from hpclaunch.cli.spellings import alias_decls
from hpclaunch.contract import table
from hpclaunch.contract.agent import EntryKind
from hpclaunch.contract.values import (
    parse_checkpoint_timeout,
    parse_endpoints,
    parse_first_step_timeout,
    parse_hang_timeout,
    parse_nodes,
    parse_pause_timeout,
)
from hpclaunch.errors import HpclaunchError, SpecError
from hpclaunch.job.values import (
    parse_dependency,
    parse_env,
    parse_mem,
    parse_sbatch_option,
    parse_time,
)

if TYPE_CHECKING:
    from hpclaunch.slurm.commands import Slurm


class CliContext:
    """What commands need from the outside world; tests pass their own. SLURM's
    command layer is loaded when a command first uses it (``sbatch --dry-run`` never)."""

    def __init__(
        self,
        slurm: Slurm | None = None,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._slurm = slurm
        self.cwd = Path.cwd() if cwd is None else cwd
        self.env: Mapping[str, str] = dict(os.environ) if env is None else env

    @property
    def slurm(self) -> Slurm:
        if self._slurm is None:
            from hpclaunch.slurm.commands import Slurm

            self._slurm = Slurm()
        return self._slurm


def fail(exc: HpclaunchError) -> NoReturn:
    """Print ``exc`` as the one error paragraph and exit with its code."""
    click.echo(f"Error: {exc}", err=True)
    sys.exit(int(exc.exit_code))


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
    return {
        "nodes": SpecParam("N|MIN:MAX", parse_nodes),
        "time": SpecParam("TIME", parse_time),
        "mem": SpecParam("SIZE", parse_mem),
        "env": SpecParam("KEY=VALUE", parse_env),
        "option": SpecParam("KEY[=VALUE]", parse_sbatch_option),
        "endpoints": SpecParam("HOST:PORT[,...]", parse_endpoints),
        "hang_timeout": SpecParam("SECONDS|auto|off", parse_hang_timeout),
        "checkpoint_timeout": SpecParam("SECONDS|auto|off", parse_checkpoint_timeout),
        "pause_timeout": SpecParam("SECONDS|auto|off", parse_pause_timeout),
        "first_step_timeout": SpecParam("SECONDS|auto|off", parse_first_step_timeout),
        "dependency": SpecParam("SPEC", parse_dependency),
    }


TYPES = _types()


class EnumChoice(click.Choice):  # type: ignore[type-arg]
    """One of an enum's values on the command line, the enum member in the program."""

    def __init__(self, kind: type[enum.Enum]) -> None:
        super().__init__([member.value for member in kind])
        self._kind = kind

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, self._kind):
            return value
        return self._kind(super().convert(value, param, ctx))


def _param_type(kind: table.Kind) -> Any:
    """The click type that parses (and bounds) a value of ``kind``."""
    if isinstance(kind, table.Number):
        if kind.min is None and kind.max is None:
            return click.INT if kind.type is int else click.FLOAT
        bounded = click.IntRange if kind.type is int else click.FloatRange
        return bounded(kind.min, kind.max)
    if isinstance(kind, table.Choice):
        return EnumChoice(kind.enum)
    if isinstance(kind, table.Name):
        return click.Choice(list(kind.choices))
    if isinstance(kind, table.Folder):
        return click.Path(file_okay=False, path_type=Path)
    if isinstance(kind, table.Parsed):
        return TYPES[kind.type_name]
    return None  # Text, Texts: click's default, a string (each)


def _member_param(decls: tuple[str, ...]) -> str:
    return decls[-1].lstrip("-").replace("-", "_")


def _options(row: table.Row, default: Any) -> list[Callable[[Any], Any]]:
    """The click option(s) of one settings row."""
    kind, help_text = row.setting.kind, row.setting.help
    if isinstance(kind, table.Flags):
        return [
            click.option(*decls, _member_param(decls), is_flag=True, help=text)
            for decls, text in kind.members.values()
        ]
    if isinstance(default, enum.Enum):
        default = default.value  # click shows and converts the value, as typed
    shown = default not in (None, (), False)
    if isinstance(kind, table.Flag):
        decl = f"{row.setting.option}/{kind.off}" if kind.off else row.setting.option
        flag = click.option(
            decl, row.name, is_flag=True, default=default, show_default=shown, help=help_text
        )
        return [flag]
    return [
        click.option(
            *alias_decls(row.setting.option),
            row.name,
            type=_param_type(kind),
            default=default,
            show_default=shown,
            help=help_text,
            multiple=isinstance(kind, table.Texts),
        )
    ]


def settings_options(cls: type[Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Generate the click options of settings dataclass ``cls`` from its table
    (hpclaunch.contract.table). The command gets their values as one ``values``
    mapping by field name, ready for ``table.from_values``; a choice made by
    several flags (``-m``/``--no-python``) exits 2 when more than one is given."""
    rows = table.table(cls)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            values = {row.name: _take(row, kwargs) for row in rows}
            return fn(*args, values=values, **kwargs)

        for row in reversed(rows):
            for option in reversed(_options(row, row.default)):
                command = option(command)
        return command

    return decorate


def _take(row: table.Row, kwargs: dict[str, Any]) -> Any:
    """The value of ``row`` among a command's keyword arguments (removed from them)."""
    kind = row.setting.kind
    if not isinstance(kind, table.Flags):
        return kwargs.pop(row.name)
    given = [(m, d) for m, (d, _) in kind.members.items() if kwargs.pop(_member_param(d))]
    if len(given) > 1:
        names = " and ".join("/".join(decls) for _, decls in given)
        fail(SpecError(row.name, f"{names} exclude each other; give one"))
    return given[0][0] if given else row.default


def etcd_access_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """TLS and user options for an etcd of your own, as ``hpclaunch sbatch`` takes them:
    the agent's own rows, without defaults (a profile may give them). No password
    option: it would land in the script and in ps."""
    from hpclaunch.contract.agent import AgentSettings

    access = ("etcd_binary", "etcd_cacert", "etcd_cert", "etcd_key", "etcd_user")
    rows = [
        r
        for r in table.table(AgentSettings)
        if r.name in (*access, "etcd_password_file", "etcd_outage_timeout")
    ]
    for row in reversed(rows):
        fn = _options(row, None)[0](fn)
    return fn
