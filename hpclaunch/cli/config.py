"""``hpclaunch config show`` and ``hpclaunch init``: the effective settings with their
sources, and a commented profile file to start from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from hpclaunch.cli.context import CliContext, entry_kind, fail
from hpclaunch.cli.sbatch import sbatch as _sbatch
from hpclaunch.errors import ConfigError, HpclaunchError

# config show takes sbatch's options, so it answers for exactly the flags sbatch gets;
# these are sbatch's own doings, not settings.
_NOT_SETTINGS = ("dry_run", "as_json", "follow_job", "script", "args")
SBATCH_PARAMS = [p for p in _sbatch.params if p.name not in _NOT_SETTINGS]


@click.group()
def config() -> None:
    """The settings hpclaunch sbatch uses."""


def _show(
    obj: CliContext,
    /,
    script: str | None,
    args: tuple[str, ...],
    profile: str | None,
    module: bool,
    no_python: bool,
    as_json: bool,
    **flags: Any,
) -> None:
    from hpclaunch.cli.sbatch import resolve_job
    from hpclaunch.job.profiles import profile_files
    from hpclaunch.ops import settings

    kind = entry_kind(module, no_python)
    try:
        resolved = resolve_job(obj, script, args, kind, profile, flags)
    except HpclaunchError as exc:
        fail(exc)
    rows = settings.settings(resolved, obj.env, script_named=script is not None)
    found = resolved.profile
    searched = [str(path) for path in profile_files(obj.cwd, obj.env)]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "profile": None
                    if found is None
                    else {"name": found.name, "path": str(found.path)},
                    "searched": searched,
                    "settings": settings.as_json(rows),
                    "warnings": settings.warnings(rows, obj.env),
                },
                indent=2,
            )
        )
        return
    if found is None:
        click.echo(f"profile: none (searched {' and '.join(searched)})")
    else:
        click.echo(f"profile: {found.name!r} from {found.path}")
    click.echo(settings.table(rows))
    for warning in settings.warnings(rows, obj.env):
        click.echo(f"hpclaunch: warning: {warning}", err=True)


show = click.Command(
    "show",
    callback=click.pass_obj(_show),
    params=[
        *SBATCH_PARAMS,
        click.Option(
            ["--json", "as_json"],
            is_flag=True,
            help="Print the settings as JSON: value, from and source of each.",
        ),
        click.Argument(["script"], required=False),
        click.Argument(["args"], nargs=-1, type=click.UNPROCESSED),
    ],
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    help="Print the settings `hpclaunch sbatch` would use with these options, each with "
    "its source: the built-in default, a profile (file and key), a flag, or one of SLURM's "
    "SBATCH_* environment variables, which override the script's #SBATCH lines. Takes "
    "every option of `hpclaunch sbatch`; SCRIPT is optional (it names the job).",
)
config.add_command(show)


@click.command()
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option(
    "--profile",
    "name",
    default="default",
    show_default=True,
    help="The name of the profile table the file holds.",
)
@click.option("--force", is_flag=True, help="Replace an existing file.")
@click.pass_obj
def init(obj: CliContext, /, path: Path | None, name: str, force: bool) -> None:
    """Write a commented profile file to PATH [default: ./hpclaunch.toml]: every key
    profiles accept, commented out, with its default or an example."""
    from hpclaunch.job.profiles import PROJECT_FILE
    from hpclaunch.ops import profile_file

    target = obj.cwd / (path if path is not None else PROJECT_FILE)
    if not name.replace("_", "").replace("-", "").isalnum():
        fail(
            ConfigError(
                f"profile name {name!r} (from --profile) is not a bare TOML key; "
                "use letters, digits, '-' and '_'"
            )
        )
    if target.exists() and not force:
        fail(ConfigError(f"{target} exists; give --force to replace it, or another PATH"))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(profile_file.text(name))
    except OSError as exc:
        fail(ConfigError(f"cannot write {target}: {exc.strerror}"))
    click.echo(
        f"wrote {target} (profile {name!r}); check it with `hpclaunch config show"
        f"{'' if name == 'default' else ' --profile ' + name}`"
    )
