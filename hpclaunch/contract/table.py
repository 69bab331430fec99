"""The settings table: the contract between the rendered script and a command it runs
(``hpclaunch agent``, ``hpclaunch supervise``) is one frozen settings dataclass per
command (``hpclaunch.contract.agent``, ``hpclaunch.contract.supervisor``), whose fields
carry their own row of the table.

A row (``setting(...)`` as a field's metadata) gives the option's name, its kind
(which is its parser and its validation), its help and whether the script passes
it; the field's default is the one default. From the same rows the CLI generates
the command's click options (``hpclaunch.cli.context.settings_options``) and
``to_argv`` writes the options into the script, so a value is written and read
back by one parser. Pure: no click, no I/O.

The kinds and rows are NamedTuples (immutable, typed) rather than frozen dataclasses:
``hpclaunch sbatch`` loads this module on every call, and a frozen dataclass costs
about half a millisecond to define (bench/cli.py).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")

_ROW = "hpclaunch.setting"


class Script(enum.Enum):
    """Whether the rendered script writes a setting into the command line."""

    ALWAYS = "always"  # every script says it, default or not
    WHEN_SET = "when-set"  # only when it differs from the default
    NEVER = "never"  # given by hand (or by the script in its own way), never by to_argv


class Number(NamedTuple):
    """A whole number (``int``) or a number of seconds (``float``), within bounds."""

    type: type[int] | type[float] = int
    min: int | None = None
    max: int | None = None

    def words(self, value: Any) -> list[str]:
        # 90.0 is written 90: the script reads as the user wrote it.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return [str(value)]


class Choice(NamedTuple):
    """One member of an enum, written and typed as its value."""

    enum: type[enum.Enum]

    def words(self, value: Any) -> list[str]:
        return [value.value]


class Name(NamedTuple):
    """One of a fixed set of names (a table's keys, such as the rendezvous backends)."""

    choices: tuple[str, ...]

    def words(self, value: Any) -> list[str]:
        return [str(value)]


class Text(NamedTuple):
    """A string as given (a host name, a file on the node)."""

    def words(self, value: Any) -> list[str]:
        return [str(value)]


class Texts(NamedTuple):
    """Strings, each given by one more use of the option (a tuple; ``()`` for none)."""

    def words(self, value: Any) -> list[str]:
        return [str(value)]


class Folder(NamedTuple):
    """A folder path (``pathlib.Path``)."""

    def words(self, value: Any) -> list[str]:
        return [str(value)]


class Parsed(NamedTuple):
    """A value read by one of hpclaunch.contract.values' parsers, through the CLI's
    parameter type of that name (``hpclaunch.cli.context.TYPES``); ``write`` gives
    the text that parser reads back."""

    type_name: str
    write: Callable[[Any], str] = str

    def words(self, value: Any) -> list[str]:
        return [self.write(value)]


class Flag(NamedTuple):
    """A boolean: ``--x`` alone, or ``--x/--no-x`` when ``off`` names the second flag."""

    off: str | None = None

    def words(self, value: Any) -> list[str]:
        return []  # the option name says it all (see Setting.argv)


class Flags(NamedTuple):
    """An enum chosen by one flag per member that is not the default
    (``-m/--module`` or ``--no-python`` for what SCRIPT is)."""

    members: Mapping[Any, tuple[tuple[str, ...], str]]  # member -> (flag names, help)

    def words(self, value: Any) -> list[str]:
        return []


Kind = Number | Choice | Name | Text | Texts | Folder | Parsed | Flag | Flags


class Setting(NamedTuple):
    """One row of a settings table: a field of a settings dataclass as an option."""

    option: str  # "--nnodes"; for Flags the member flags are the options
    kind: Kind
    help: str
    script: Script = Script.WHEN_SET

    def argv(self, value: Any, default: Any) -> list[str]:
        """The words that pass ``value`` on, or none when the script leaves it out."""
        if self.script is Script.NEVER:
            return []
        if self.script is Script.WHEN_SET and value == default:
            return []
        if value is None:
            return []
        if isinstance(self.kind, Flags):
            return [self.kind.members[value][0][-1]]
        if isinstance(self.kind, Flag):
            if value:
                return [self.option]
            return [self.kind.off] if self.kind.off else []
        if isinstance(self.kind, Texts):
            return [word for one in value for word in (self.option, *self.kind.words(one))]
        return [self.option, *self.kind.words(value)]


def setting(default: T, option: str, kind: Kind, help: str, script: Script = Script.WHEN_SET) -> T:
    """A dataclass field carrying its row of the settings table."""
    row = Setting(option, kind, help, script)
    return dataclasses.field(default=default, metadata={_ROW: row})


class Row(NamedTuple):
    """A settings table row with the field it belongs to and that field's default."""

    name: str
    default: Any
    setting: Setting


def table(cls: type[Any]) -> tuple[Row, ...]:
    """The rows of settings dataclass ``cls``, in field order (fields without a row,
    such as the training command, are not options)."""
    return tuple(
        Row(f.name, f.default, f.metadata[_ROW])
        for f in dataclasses.fields(cls)
        if _ROW in f.metadata
    )


def to_argv(settings: Any) -> list[str]:
    """The options that pass ``settings`` on, in table order, as the script writes them."""
    out: list[str] = []
    for row in table(type(settings)):
        out += row.setting.argv(getattr(settings, row.name), row.default)
    return out


def from_values(cls: type[T], values: Mapping[str, Any], **fixed: Any) -> T:
    """An instance of ``cls`` from parsed option values keyed by field name (as the
    generated click options give them) and the ``fixed`` fields that are not options."""
    given = {row.name: values[row.name] for row in table(cls) if row.name in values}
    return cls(**given, **fixed)
