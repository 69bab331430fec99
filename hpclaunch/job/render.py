"""``JobSpec`` → sbatch script text, through Jinja.

Quoting is the default: every ``{{ expression }}`` a template prints is
shell-quoted unless its value is a ``Shell`` (deliberate shell text, built
here or marked with the ``shell`` filter). ``--setup`` lines are the only user
values passed as shell. Values bound for ``#SBATCH`` lines are quoted for
sbatch's own directive parser (``sbatch_quote``), which is not a shell.
Undefined variables are errors. Apart from reading the template files this
module does no I/O.
"""

from __future__ import annotations

import contextlib
import enum
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePath
from typing import Any

from hpclaunch._version import __version__
from hpclaunch.contract import job_folder, worker_env
from hpclaunch.contract.agent import AgentSettings
from hpclaunch.contract.supervisor import SupervisorSettings
from hpclaunch.errors import TemplateError
from hpclaunch.job.spec import GpuDirective, JobSpec
from hpclaunch.job.values import format_time

DEFAULT_TEMPLATE = "sbatch.sh.j2"
BUILTIN_PREFIX = "hpclaunch/"
# Words that read literally to sbatch's directive parser and to a human
# (hostlists keep their brackets); anything else is quoted.
_PLAIN = re.compile(r"[A-Za-z0-9@%+=:,./_\[\]-]+\Z")


class Shell(str):
    """Text a template prints as it is: deliberate shell, never user input
    unless the user asked for shell (``--setup``)."""


def shell_quote(value: object) -> Shell:
    """Quote ``value`` as one shell word."""
    return Shell(shlex.quote(_text(value)))


def sbatch_quote(value: object) -> Shell:
    """Quote ``value`` for an ``#SBATCH`` line. Raises TemplateError on a line break.

    sbatch splits directive lines itself: it strips ``'``/``"`` quotes and
    treats a backslash as an escape even inside quotes, and a line ends at the
    newline (JobSpec rejects line breaks in the values it puts there).
    """
    value = _text(value)
    if any(c in value for c in "\n\r\0"):
        raise TemplateError(f"{value!r} cannot go into an #SBATCH line: it has a line break")
    if _PLAIN.match(value):
        return Shell(value)
    return Shell('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')


def words(*parts: str | Iterable[str]) -> Shell:
    """Join words into a command line: ``Shell`` parts stay, others are quoted."""
    out: list[str] = []
    for part in parts:
        items = [part] if isinstance(part, str) else list(part)
        out.extend(item if isinstance(item, Shell) else shlex.quote(item) for item in items)
    return Shell(" ".join(out))


def _text(value: object) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _finalize(value: object) -> str:
    if isinstance(value, Shell):
        return value
    if value is None:
        raise TemplateError(
            "a template expression printed None (an unset optional value); "
            "guard it with {% if ... %}"
        )
    return shell_quote(value)


def _block_context() -> type[Any]:
    """A Jinja context whose ``super()`` renders as deliberate shell: a parent
    block is template text, not a value to quote."""
    import jinja2.runtime

    class BlockShell:
        def __init__(self, ref: jinja2.runtime.BlockReference) -> None:
            self._ref = ref

        def __call__(self) -> Shell:
            return Shell(self._ref())

    class Context(jinja2.runtime.Context):
        def super(self, name: str, current: Any) -> Any:
            ref = jinja2.runtime.Context.super(self, name, current)
            return BlockShell(ref) if isinstance(ref, jinja2.runtime.BlockReference) else ref

    return Context


def templates_dir() -> Path:
    """The built-in templates, shipped inside the package beside this module."""
    return Path(__file__).parent / "templates"


def _runtime_path(path: str) -> Shell:
    """A path as the job sees it: relative paths are taken from the submit
    folder, so ``cd`` in a setup line does not move them."""
    if PurePath(path).is_absolute():
        return shell_quote(path)
    return Shell('"$SLURM_SUBMIT_DIR"/' + shlex.quote(path))


def _log_dir(spec: JobSpec) -> str:
    return spec.log_dir.rstrip("/") or "/"


def _option(key: str, value: str | None, quote: Any) -> Shell:
    return Shell(f"--{key}") if value is None else Shell(f"--{key}={quote(value)}")


def directives(spec: JobSpec) -> list[Shell]:
    """The ``#SBATCH`` options, without the ``#SBATCH`` prefix."""
    out = [
        _option("job-name", spec.effective_job_name, sbatch_quote),
        _option("nodes", spec.nodes.sbatch, sbatch_quote),
    ]
    if not spec.nodes.is_elastic:
        # With a range SLURM would size the job by its tasks (one per node: MIN nodes);
        # without it, it gives as many nodes of the range as it can. The agents' srun
        # step sets one task per node itself.
        out.append(_option("ntasks-per-node", "1", sbatch_quote))
    if spec.gpus_per_node:
        if spec.gpu_directive is GpuDirective.GRES:
            out.append(_option("gres", f"gpu:{spec.gpus_per_node}", sbatch_quote))
        else:
            out.append(_option("gpus-per-node", str(spec.gpus_per_node), sbatch_quote))
    optional = {
        "cpus-per-task": spec.cpus_per_task,
        "mem": spec.mem,
        "time": format_time(spec.time_limit) if spec.time_limit is not None else None,
        "partition": spec.partition,
        "account": spec.account,
        "qos": spec.qos,
        "constraint": spec.constraint,
        "exclude": spec.exclude,
    }
    out += [_option(k, str(v), sbatch_quote) for k, v in optional.items() if v is not None]
    out += [
        Shell("--requeue"),
        *([Shell("--no-kill")] if spec.no_kill else []),
        Shell("--open-mode=append"),
        _option("signal", f"B:USR1@{spec.signal_lead_s}", sbatch_quote),
        # %% keeps a '%' of the folder name from being read as a SLURM pattern.
        _option(
            "output",
            f"{_log_dir(spec).replace('%', '%%')}/{job_folder.BATCH_LOG_PATTERN}",
            sbatch_quote,
        ),
    ]
    out += [_option(k, v, sbatch_quote) for k, v in spec.sbatch_options]
    return out


def agent_settings(spec: JobSpec, *, supervised: bool = False) -> AgentSettings:
    """The settings the rendered script gives every node's agent for ``spec``;
    ``supervised``: the step runs under ``hpclaunch supervise``."""
    # The spec's rendezvous settings are read here and nowhere else in the script.
    return AgentSettings(
        entrypoint=spec.entrypoint,
        args=spec.args,
        entry_kind=spec.entry_kind,
        nnodes=spec.nodes,
        nproc_per_node=spec.effective_nproc_per_node,
        rdzv=spec.rdzv.name,
        max_restarts=spec.max_restarts,
        grace_period_s=spec.agent_grace_s,
        hang_timeout=spec.hang_timeout,
        checkpoint_timeout=spec.checkpoint_timeout,
        pause_timeout=spec.pause_timeout,
        first_step_timeout=spec.first_step_timeout,
        node_multiple=spec.node_multiple,
        master_port=spec.master_port,
        supervised=supervised,
        no_kill=spec.no_kill,
        etcd_endpoints=spec.etcd_endpoints,
        etcd_sidecar=spec.etcd_sidecar,
        etcd_binary=spec.etcd_binary,
        etcd_cacert=spec.etcd_cacert,
        etcd_cert=spec.etcd_cert,
        etcd_key=spec.etcd_key,
        etcd_user=spec.etcd_user,
        etcd_password_file=spec.etcd_password_file,
        etcd_outage_timeout=spec.etcd_outage_timeout,
    )


def supervisor_settings(spec: JobSpec) -> SupervisorSettings:
    """The settings the rendered script gives the supervisor for ``spec``: the step
    gets the whole signal lead to end after SLURM's warning."""
    return SupervisorSettings(
        max_requeues=spec.max_requeues,
        grace_period_s=spec.signal_lead_s,
        max_failure_requeues=spec.max_failure_requeues,
        adopt_checkpoints=spec.adopt_checkpoints,
        slurm_patience_s=float(spec.slurm_patience_s),
        watch_timeout_s=float(spec.watch_timeout_s),
        checkpoint_patterns=spec.checkpoint_patterns,
    )


def agent_argv(spec: JobSpec, *, supervised: bool = False) -> list[str]:
    """``hpclaunch agent ...`` as run on each node, up to the training command: the
    agent's settings for ``spec``, written by their own table. ``supervised``: the
    step runs under ``hpclaunch supervise`` (the launch line), and the agents are told."""
    settings = agent_settings(spec, supervised=supervised)
    return [*spec.launcher, "agent", *settings.to_argv()]


def supervisor_argv(spec: JobSpec) -> list[str]:
    """``hpclaunch supervise ...`` up to the step, but --job-dir (shell, added by context)."""
    return ["hpclaunch", "supervise", *supervisor_settings(spec).to_argv()]


def context(spec: JobSpec) -> dict[str, Any]:
    """The variables every template gets; docs/templates.md lists them."""
    job_dir = Shell(_runtime_path(_log_dir(spec)) + '/"$SLURM_JOB_ID"')
    checkpoint_dir = (
        _runtime_path(spec.checkpoint_dir)
        if spec.checkpoint_dir is not None
        else Shell(f'"${worker_env.JOB_DIR}"/{job_folder.CHECKPOINTS}')
    )
    supervisor = words(supervisor_argv(spec), "--job-dir", Shell(f'"${worker_env.JOB_DIR}"'), "--")
    srun = words(
        "srun",
        Shell('--nodes="$SLURM_JOB_NUM_NODES"'),
        Shell('--ntasks="$SLURM_JOB_NUM_NODES"'),
        "--ntasks-per-node=1",
        # --no-kill: the step goes on without a lost node; the agents rendezvous again.
        ["--no-kill", "--kill-on-bad-exit=0"] if spec.no_kill else ["--kill-on-bad-exit=1"],
        [f"--cpus-per-task={spec.cpus_per_task}"] if spec.cpus_per_task else [],
        [_option(k, v, shlex.quote) for k, v in spec.srun_options],
    )
    agent = words(agent_argv(spec))
    supervised_agent = words(agent_argv(spec, supervised=True))
    training = words(spec.entrypoint, spec.args)
    return {
        "spec": spec,
        "hpclaunch_version": __version__,
        "job_name": spec.effective_job_name,
        "directives": directives(spec),
        "setup": [Shell(line) for line in spec.setup],
        "exports": [Shell(f"export {key}={shlex.quote(value)}") for key, value in spec.env],
        "job_dir": job_dir,
        "checkpoint_dir": checkpoint_dir,
        "supervisor_command": supervisor,
        "srun_command": srun,
        "agent_command": agent,
        "training_command": training,
        "launch_command": Shell(
            f"{supervisor} \\\n    {srun} \\\n    {supervised_agent} -- \\\n    {training}"
        ),
    }


def compiled_cache(env: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME/hpclaunch/templates``, by default
    ``~/.cache/hpclaunch/templates``: where ``hpclaunch sbatch`` keeps compiled templates
    (compiling the built-in one takes about as long as the rest of a dry run)."""
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return Path(cache) / "hpclaunch" / "templates"


def _bytecode_cache(folder: Path) -> Any:
    """Jinja's bytecode cache in ``folder`` (made private to this user), which never
    fails a render: a folder that cannot be made or written only costs a compile. The
    cache holds code this process runs: a folder that another user owns or may write to
    is not used (None)."""
    import stat

    import jinja2

    class Quiet(jinja2.FileSystemBytecodeCache):
        def load_bytecode(self, bucket: Any) -> None:
            try:
                super().load_bytecode(bucket)
            except (OSError, ValueError, EOFError):  # unreadable or torn: compile again
                bucket.reset()

        def dump_bytecode(self, bucket: Any) -> None:
            with contextlib.suppress(OSError):  # a read-only home: compiled next time too
                super().dump_bytecode(bucket)

    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = folder.stat()
    except OSError:
        return None
    if mode.st_uid != os.getuid() or mode.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    return Quiet(str(folder))


def render(spec: JobSpec, *, compiled: Path | None = None) -> str:
    """Render ``spec`` through its template (``spec.template`` or the built-in one).
    ``compiled``: a folder of this user's where the templates' compiled form is kept
    between runs (Jinja's bytecode cache, checked against the template's source; the
    login node's CLI passes one, see ``compiled_cache``); None compiles them each time.

    Raises TemplateError for a missing or broken template or an undefined variable.
    """
    import jinja2  # imported here: only rendering needs it

    builtin = jinja2.FileSystemLoader(templates_dir())
    loaders: list[jinja2.BaseLoader] = [jinja2.PrefixLoader({BUILTIN_PREFIX.rstrip("/"): builtin})]
    if spec.template is None:
        name = BUILTIN_PREFIX + DEFAULT_TEMPLATE
        source = "the built-in template"
    else:
        path = Path(spec.template)
        if not path.is_file():
            raise TemplateError(
                f"template {spec.template!r} (from --template or a profile) is not a file; "
                "give the path of a Jinja template, or leave it out for the built-in one"
            )
        loaders.insert(0, jinja2.FileSystemLoader(path.parent))
        name, source = path.name, f"template {spec.template!r}"
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        bytecode_cache=_bytecode_cache(compiled) if compiled is not None else None,
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.context_class = _block_context()
    env.filters["q"] = shell_quote
    env.filters["shell"] = Shell
    env.filters["sbatch_quote"] = sbatch_quote
    env.filters["shjoin"] = lambda items: words([_text(i) for i in items])
    variables = context(spec)
    try:
        return env.get_template(name).render(variables)
    except TemplateError as exc:  # raised by _finalize or sbatch_quote
        raise TemplateError(f"{source}{_where(exc)}: {exc}") from exc
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"{source} has a syntax error at {exc.filename or exc.name}:{exc.lineno}: "
            f"{exc.message}; fix the template"
        ) from exc
    except jinja2.UndefinedError as exc:
        raise TemplateError(
            f"{source}{_where(exc)} uses an undefined variable: {exc.message}; the variables "
            "a template gets are listed in docs/templates.md"
        ) from exc
    except jinja2.TemplateNotFound as exc:
        raise TemplateError(
            f"{source} includes or extends {exc.name!r}, which does not exist; built-in "
            f"templates are named {BUILTIN_PREFIX}NAME, e.g. {BUILTIN_PREFIX}{DEFAULT_TEMPLATE}"
        ) from exc
    except Exception as exc:  # anything else a template can do wrong: 1/0, bad types, bad bytes
        raise TemplateError(
            f"{source}{_where(exc)} failed: {type(exc).__name__}: {exc}; fix the template"
        ) from exc


def _where(exc: BaseException) -> str:
    """`` at FILE:LINE`` of the template line that raised, if Jinja recorded one."""
    import traceback  # only for an error: a render that works does not load it

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.endswith(".py")]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
