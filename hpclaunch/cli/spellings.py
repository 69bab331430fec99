"""The names users bring from torchrun and sbatch.

Where such a name means exactly what one of ours does (torchrun's ``--nnodes``,
sbatch's ``-p``), it is declared on our option as an alias (``ALIASES`` for the
agent's generated options; ``hpclaunch sbatch`` declares its own). Where it means
something else or has no counterpart, ``check_script`` refuses it with the option to
use: ``hpclaunch sbatch`` and ``hpclaunch agent`` let unknown options through to the
training script (``ignore_unknown_options``), so such a name arrives as SCRIPT. Also
the job's dependency, from sbatch's ``--dependency`` or our ``--after`` (``with_dependency``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import click

from hpclaunch.errors import SpecError

# Our option -> the other tools' spellings of it, for the agent's generated options.
ALIASES: Mapping[str, tuple[str, ...]] = {
    "--nproc-per-node": ("--nproc_per_node",),
    "--max-restarts": ("--max_restarts",),
    "--master-addr": ("--master_addr",),
    "--master-port": ("--master_port",),
}

_TEE = (
    "every rank's output goes to its own log (`hpclaunch logs JOBID --rank R`) and is "
    "copied to the batch log, each line prefixed [rankN]: leave it out"
)
_PER_NODE = "hpclaunch runs one agent task per node: use --nproc-per-node P for each node's workers"
_GPUS = "hpclaunch asks for GPUs per node: use --gpus-per-node G (one worker per GPU)"
_LOG = "the batch log is LOG_DIR/NAME-JOBID.out: use --log-dir"
ARRAY_REFUSED = (
    "`hpclaunch list/status/logs` would see only one task of a job array: submit one "
    "job per task, or use hpclaunch.Executor.map_array from Python"
)
_RDZV = {
    "--rdzv-backend": "torchrun's name: use --rdzv static|c10d|etcd",
    "--rdzv-endpoint": "torchrun's: the endpoint is the first node and --master-port "
    "(--etcd-endpoint HOST:PORT for --rdzv etcd)",
    "--rdzv-id": "torchrun's: the rendezvous id is the job id, set for you",
    "--standalone": "torchrun's: a one-node job is --nodes 1, rendezvous on that node",
    "--redirects": "torchrun's: " + _TEE,
    "--tee": "torchrun's: " + _TEE,
    "--node-rank": "torchrun's: each node's rank comes from SLURM, set for you",
}
SBATCH_REFUSED: Mapping[str, str] = {
    "--gpus": "sbatch's GPU count for the whole job; " + _GPUS,
    "-G": "sbatch's GPU count for the whole job; " + _GPUS,
    "--gpus-per-task": "sbatch's; " + _GPUS,
    "--gres": "sbatch's; " + _GPUS + " (gpu_directive = 'gres' in a profile renders --gres)",
    "--ntasks-per-node": "sbatch's; " + _PER_NODE,
    "--ntasks": "sbatch's; " + _PER_NODE + ", and --nodes N for the node count",
    "-n": "sbatch's task count; " + _PER_NODE + ", and --nodes N for the node count",
    "--output": "sbatch's; " + _LOG,
    "-o": "sbatch's --output; " + _LOG,
    "--error": "sbatch's; " + _LOG,
    "-e": "sbatch's --error; " + _LOG,
    "--array": "sbatch's; " + ARRAY_REFUSED,
    "-a": "sbatch's --array; " + ARRAY_REFUSED,
    "--signal": "sbatch's; use --signal-lead SECONDS (hpclaunch handles the signal)",
    "--master-addr": "torchrun's: the first node of the allocation is the master; "
    "--master-port sets the port",
    **_RDZV,
}
AGENT_REFUSED: Mapping[str, str] = {
    **_RDZV,
    "--rdzv-endpoint": "torchrun's: use --master-addr and --master-port "
    "(--etcd-endpoint HOST:PORT for --rdzv etcd)",
    "--log-dir": "torchrun's: use --job-dir (rank logs go to its logs/)",
}

# What torchrun and sbatch put after their own flags, mistaken for SCRIPT after ours;
# compiled on first use (re's own cache), not by every command.
_BARE_VALUE = r"(?i)(\d+(:\d+)?(,\d+:\d+)*|true|false|yes|no|on|off)\Z"
RAW_ARGS = "hpclaunch.raw_args"


class ScriptCommand(click.Command):
    """A command of SCRIPT [ARGS]...: keeps the command line as typed (``RAW_ARGS`` in
    the context's meta) so that ``check_script`` can see the token before SCRIPT."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[RAW_ARGS] = list(args)
        return super().parse_args(ctx, args)


def refused(name: str, table: Mapping[str, str]) -> str | None:
    """Why option ``name`` is refused and what to use, or None. torchrun accepts
    ``--rdzv_backend`` for ``--rdzv-backend``: both are looked up."""
    return table.get(name) or table.get(name.replace("_", "-"))


def check_script(script: str, args: Sequence[str], table: Mapping[str, str]) -> None:
    """Refuse a SCRIPT that is an option (one of another tool's, from ``table``, with
    ours to use; else click's "No such option") or a bare value left after a flag
    of ours (torchrun's ``--tee 3``). Raises click.UsageError (exit 2)."""
    ctx = click.get_current_context()
    if script.startswith("-") and script != "-":
        name = script.split("=")[0]
        why = refused(name, table)
        if why is not None:
            raise click.UsageError(f"{name} is {why}", ctx)
        # torchrun's underscore spellings would only repeat ours in the suggestions
        known = [opt for param in ctx.command.params for opt in param.opts if "_" not in opt]
        raise click.NoSuchOption(name, possibilities=known, ctx=ctx)
    flag = _flag_before(ctx, args)
    if flag is not None and re.match(_BARE_VALUE, script):
        tee = " (torchrun's --tee 3 is --tee here, the default)" if flag == "--tee" else ""
        raise click.UsageError(
            f"{flag} takes no value, so {script!r} after it would be taken as SCRIPT; "
            f"write {flag} alone{tee}, then SCRIPT",
            ctx,
        )


def _flag_before(ctx: click.Context, args: Sequence[str]) -> str | None:
    """The flag (an option that takes no value) typed just before SCRIPT, if any."""
    raw: list[str] = ctx.meta.get(RAW_ARGS, [])
    at = len(raw) - len(args) - 2  # SCRIPT and ARGS end the command line
    if at < 0:
        return None
    flags: set[str] = set()
    for param in ctx.command.params:
        if isinstance(param, click.Option) and param.is_flag:
            flags.update([*param.opts, *param.secondary_opts])
    flags -= {"-m", "--module", "--no-python"}  # they say what SCRIPT is: `--no-python true`
    return raw[at] if raw[at] in flags else None


def alias_decls(option: str) -> tuple[str, ...]:
    """``option`` and its aliases, for click.option."""
    return (option, *ALIASES.get(option, ()))


def with_dependency(flags: dict[str, Any]) -> tuple[tuple[str, str | None], ...]:
    """The extra sbatch options, with --dependency or --after's as sbatch's ``dependency``
    (one source only). Raises SpecError."""
    from hpclaunch.job.values import after_dependency, parse_dependency

    options = tuple(flags["sbatch_options"])
    given = [key for key, _ in options if key in ("dependency", "d")]
    for key, value in options:
        if key in ("dependency", "d"):
            try:
                parse_dependency(value or "")
            except SpecError as exc:
                raise SpecError("sbatch_options", f"--sbatch-option {key}: {exc}") from None
    spec, after = flags.pop("dependency"), flags.pop("after")
    asked = [name for name, value in (("--dependency", spec), ("--after", after)) if value]
    if given:
        asked.append(f"--sbatch-option {given[0]}")
    if len(asked) > 1:
        raise SpecError(
            "dependency",
            f"{' and '.join(asked)} each set the job's dependency; "
            "give one (join several in one --dependency SPEC, e.g. "
            "afterok:12,afterany:13)",
        )
    if after:
        return (*options, ("dependency", after_dependency(after)))
    return (*options, ("dependency", spec)) if spec else options
