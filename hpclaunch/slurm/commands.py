"""The one place that runs SLURM commands.

Every call goes through a ``Runner``: argv lists (never a shell), a timeout on
every call, and typed errors carrying argv, exit code and stderr. The real
runner uses ``subprocess``; ``FakeRunner`` answers from Python for unit tests
(the integration tier runs the real commands on the sandbox). Parsers of
command output are pure functions.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from hpclaunch.errors import SlurmError, SlurmNotFound

if TYPE_CHECKING:  # loaded by the lookups that build records; sbatch needs none
    from hpclaunch.slurm.states import SlurmRecord

DEFAULT_TIMEOUT_S = 60.0
# scontrol's answer for a job it no longer remembers (ended longer ago than MinJobAge).
INVALID_JOB = "Invalid job id"


@dataclass(frozen=True)
class CommandResult:
    """What a finished command left behind."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""


class Runner(Protocol):
    """Runs argv and returns its result; raises SlurmNotFound or SlurmError on
    a missing command or a time-out (a non-zero exit is a result, not an error)."""

    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult: ...


def subprocess_runner(
    argv: Sequence[str],
    *,
    timeout_s: float,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> CommandResult:
    """The real runner; ``env`` (None: this process's) is the command's whole environment."""
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except FileNotFoundError:
        raise not_found(argv) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(
            argv,
            None,
            "",
            f"{' '.join(argv)} did not finish within {timeout_s:g} s; the SLURM controller "
            "may be down or overloaded (check `scontrol ping`) — try again later",
        ) from None
    return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


def not_found(argv: Sequence[str]) -> SlurmNotFound:
    """The error for a SLURM command missing from PATH."""
    return SlurmNotFound(
        argv,
        None,
        "",
        f"{argv[0]} is not on PATH: this does not look like a SLURM login node. "
        "Run this where SLURM's commands are installed, or add --dry-run to print "
        "the script without submitting it",
    )


@dataclass
class FakeRunner:
    """A scripted stand-in for SLURM's commands, for unit tests.

    ``handlers`` maps a command name (``"sbatch"``) to a function of argv
    returning a CommandResult; commands without a handler behave as if absent
    from PATH. Every call is recorded in ``calls``.
    """

    handlers: Mapping[str, Callable[[tuple[str, ...]], CommandResult]]
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        handler = self.handlers.get(argv[0])
        if handler is None:
            raise not_found(argv)
        return handler(argv)


@dataclass(frozen=True)
class SubmittedJob:
    """A job sbatch accepted."""

    job_id: int
    cluster: str | None = None


def parse_sbatch_parsable(stdout: str) -> SubmittedJob:
    """Parse ``sbatch --parsable`` output: ``JOBID`` or ``JOBID;CLUSTER``.

    Raises ValueError when the output holds no job id.
    """
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("sbatch printed no job id")
    job_text, _, cluster = lines[-1].partition(";")
    if not job_text.isdigit():
        raise ValueError(f"sbatch printed {lines[-1]!r}, not a job id")
    return SubmittedJob(int(job_text), cluster or None)


@dataclass(frozen=True)
class JobLookup:
    """SLURM's answer about one job: its record, or why there is none."""

    record: SlurmRecord | None
    forgotten: bool = False  # scontrol: "Invalid job id", and sacct had no record
    not_on_path: bool = False  # SLURM's commands are not installed here
    scontrol_error: str | None = None  # the first line of what it printed
    sacct_error: str | None = None  # None: sacct answered (or was not asked)

    @property
    def unreachable(self) -> bool:
        """Whether SLURM could not be asked: no commands, or neither command answered
        and scontrol did not say that it forgot the job."""
        return self.not_on_path or (self.sacct_error is not None and not self.forgotten)


# SLURM 22.05's words when a command has no configuration: no SLURM_CONF and no slurmctld
# announced in DNS ("DNS SRV lookup failed"), or a file it cannot read or parse.
NO_CONFIG = "Could not establish a configuration source"
CONF_UNREADABLE = "Unable to process configuration file"


def config_problem(stderr: str, env: Mapping[str, str]) -> str | None:
    """The error to give when SLURM's command ``stderr`` says it found no configuration
    (``env``: the command's environment); None when it says something else."""
    conf = env.get("SLURM_CONF")
    fix = (
        "the cluster's slurm.conf (as your site documents, often /etc/slurm/slurm.conf; "
        'for the sandbox: eval "$(hpclaunch sandbox env)")'
    )
    if NO_CONFIG in stderr and not conf:
        return (
            "SLURM's commands found no configuration: SLURM_CONF is not set and no "
            f"slurmctld is announced in DNS; set SLURM_CONF to {fix}"
        )
    if CONF_UNREADABLE in stderr or NO_CONFIG in stderr:
        said = next((line.strip() for line in stderr.splitlines() if "error:" in line), "")
        return (
            f"SLURM's commands cannot read their configuration: SLURM_CONF={conf} "
            f"is not a readable slurm.conf{f' ({said})' if said else ''}; point "
            f"SLURM_CONF at {fix}"
        )
    return None


def _first_line(exc: SlurmError) -> str:
    if config_problem(exc.stderr, {}) is not None or exc.returncode is None:
        return str(exc)
    text = (exc.stderr.strip() or str(exc)).splitlines()
    return text[0] if text else "no answer"


@dataclass(frozen=True)
class Slurm:
    """SLURM's commands, run through ``runner``."""

    runner: Runner = subprocess_runner
    timeout_s: float = DEFAULT_TIMEOUT_S
    env: Mapping[str, str] | None = None  # None: this process's environment

    def _run(self, argv: Sequence[str], cwd: Path | None = None) -> CommandResult:
        env = os.environ if self.env is None else self.env
        conf = env.get("SLURM_CONF")
        if conf and not Path(conf).is_file():  # SLURM would retry it for a minute
            raise SlurmError(argv, None, "", config_problem(CONF_UNREADABLE, env) or "")
        result = self.runner(argv, timeout_s=self.timeout_s, cwd=cwd, env=self.env)
        if result.returncode != 0:
            detail = result.stderr.strip() or result.stdout.strip() or "(no output)"
            problem = config_problem(result.stderr, env)
            if problem is not None:
                raise SlurmError(argv, result.returncode, result.stderr, problem)
            raise SlurmError(
                argv,
                result.returncode,
                result.stderr,
                f"{argv[0]} failed (exit {result.returncode}):\n{detail}",
            )
        return result

    def sbatch(self, script: Path, *, cwd: Path | None = None) -> SubmittedJob:
        """Submit ``script``. Raises SlurmNotFound, or SlurmError with sbatch's stderr
        (for a partition that does not exist, with the ones that do)."""
        argv = ("sbatch", "--parsable", str(script))
        try:
            result = self._run(argv, cwd=cwd)
        except SlurmError as exc:
            if INVALID_PARTITION not in exc.stderr:
                raise
            raise SlurmError(argv, exc.returncode, exc.stderr, self._partition_error(exc)) from None
        try:
            return parse_sbatch_parsable(result.stdout)
        except ValueError as exc:
            raise SlurmError(argv, result.returncode, result.stderr, str(exc)) from None

    def _partition_error(self, exc: SlurmError) -> str:
        asked = exc.stderr.partition("invalid partition specified:")[2].split()
        try:
            listed = parse_partitions(self._run(PARTITIONS).stdout)
        except SlurmError as sinfo:
            listed = f"(sinfo could not list them: {_first_line(sinfo)})"
        named, said = f" {asked[0]!r}" if asked else "", exc.stderr.strip().splitlines()[0]
        return (
            f"sbatch refused the partition{named}: it does not exist ({said}). "
            f"Partitions here: {listed}; give one with --partition (or partition = "
            "in a profile), or leave it out for the default"
        )

    def partition_fields(self, name: str) -> dict[str, str]:
        """``scontrol show partition NAME`` as KEY=VALUE pairs. Raises SlurmError."""
        return parse_show_job(self._run(("scontrol", "show", "partition", name)).stdout)

    def ping(self) -> bool:
        """Whether slurmctld answers."""
        try:
            return "is UP" in self._run(("scontrol", "ping")).stdout
        except SlurmError:
            return False

    def node_states(self) -> dict[str, NodeState]:
        """Every node's state, from sinfo."""
        result = self._run(("sinfo", "--Node", "--noheader", "--format=%N %T"))
        return parse_sinfo_nodes(result.stdout)

    def node_addr(self, name: str) -> str:
        """The node's NodeAddr from ``scontrol show node``. Raises SlurmError."""
        argv = ("scontrol", "show", "node", name)
        text = self._run(argv).stdout
        for word in text.split():
            if word.startswith("NodeAddr="):
                return word.split("=", 1)[1]
        raise SlurmError(argv, 0, "", f"scontrol show node {name} printed no NodeAddr")

    def node_fields(self, name: str) -> dict[str, str]:
        """``scontrol show node NAME`` as KEY=VALUE pairs. Raises SlurmError."""
        return parse_show_job(self._run(("scontrol", "show", "node", name)).stdout)

    def config(self) -> str:
        """``scontrol show config`` as printed (``KEY = VALUE`` lines). Raises SlurmError."""
        return self._run(("scontrol", "show", "config")).stdout

    def topology(self) -> str:
        """``scontrol show topology`` as printed (see context.parse_topology)."""
        return self._run(("scontrol", "show", "topology")).stdout

    def job_fields(self, job_id: int | str) -> dict[str, str]:
        """``scontrol show job JOBID`` as KEY=VALUE pairs. Raises SlurmError."""
        return parse_show_job(self._run(("scontrol", "show", "job", str(job_id))).stdout)

    def accounted_job(self, job_id: int | str) -> SlurmRecord | None:
        """The job's State, NodeList and ExitCode from ``sacct`` (None when sacct does not
        know it). Raises SlurmError, also where there is no accounting database."""
        argv = (
            "sacct",
            "--noheader",
            "--allocations",
            "--parsable2",
            "--format=State,NodeList,ExitCode",
            f"--jobs={job_id}",
        )
        lines = [line for line in self._run(argv).stdout.splitlines() if line.strip()]
        from hpclaunch.slurm.states import SlurmRecord

        return SlurmRecord.from_sacct(lines[-1], str(job_id)) if lines else None

    def lookup(self, job_id: int | str) -> JobLookup:
        """What SLURM says of the job: ``scontrol show job`` while slurmctld remembers
        it, else ``sacct``. Raises nothing: what could not be asked is in the answer."""
        try:
            from hpclaunch.slurm.states import SlurmRecord

            return JobLookup(SlurmRecord.from_scontrol(self.job_fields(job_id)))
        except SlurmNotFound:
            return JobLookup(None, not_on_path=True)
        except SlurmError as exc:
            scontrol = exc
        forgotten = INVALID_JOB in scontrol.stderr
        try:
            record = self.accounted_job(job_id)
        except SlurmError as sacct:
            return JobLookup(
                None,
                forgotten,
                scontrol_error=_first_line(scontrol),
                sacct_error=_first_line(sacct),
            )
        return JobLookup(record, forgotten and record is None, scontrol_error=_first_line(scontrol))

    def cancel(self, job_id: int) -> None:
        """``scancel JOBID``: SLURM stops every process of the job. Raises SlurmError."""
        self._run(("scancel", str(job_id)))

    def requeue(self, job_id: int) -> None:
        """``scontrol requeue JOBID``: SLURM stops every process of the job and queues it
        again (same job id, SLURM_RESTART_COUNT one higher). Raises SlurmError."""
        self._run(("scontrol", "requeue", str(job_id)))

    def exclude_nodes(self, job_id: int, nodes: Sequence[str]) -> None:
        """``scontrol update JobId=JOBID ExcNodeList=...``: keep ``nodes`` out of the
        job's next allocation (while it is pending). Raises SlurmError."""
        self._run(("scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}"))

    def update_node(self, name: str, state: str, reason: str | None = None) -> None:
        """``scontrol update NodeName=NAME State=STATE [Reason=...]``. Raises SlurmError."""
        argv = ["scontrol", "update", f"NodeName={name}", f"State={state}"]
        if reason is not None:
            argv.append(f"Reason={reason}")
        self._run(argv)


# sbatch's stderr for a --partition that does not exist (SLURM 22.05).
INVALID_PARTITION = "Invalid partition name specified"
PARTITIONS = ("sinfo", "--noheader", "--format=%P %D %a")


def parse_partitions(stdout: str) -> str:
    """``sinfo --noheader --format='%P %D %a'`` as one phrase: ``low (default, 4 nodes),
    high (4 nodes, down)``."""
    out = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        name, count, avail = parts
        notes = ["default"] if name.endswith("*") else []
        notes.append(f"{count} node{'s' if count != '1' else ''}")
        notes += [] if avail == "up" else [avail]
        out.append(f"{name.rstrip('*')} ({', '.join(notes)})")
    return ", ".join(out) or "none"


def parse_show_job(text: str) -> dict[str, str]:
    """The KEY=VALUE words of ``scontrol show job`` (values with spaces, such as
    Command, keep only their first word)."""
    fields: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key and key not in fields:
            fields[key] = value
    return fields


@dataclass(frozen=True)
class NodeState:
    """A node's state as sinfo reports it: the base state and whether the
    controller has heard from it (a trailing ``*`` means it has not)."""

    state: str  # e.g. "idle", "allocated", "down", "drained", "mixed"
    responding: bool = True

    @property
    def lost(self) -> bool:
        """Down, failed or not responding: a node the job has lost."""
        return not self.responding or self.state in ("down", "fail", "failing")


# sinfo marks states with one trailing flag character; "*" is "not responding".
_STATE_FLAGS = "*~#!%$@^-"


def parse_sinfo_nodes(stdout: str) -> dict[str, NodeState]:
    """Parse ``sinfo --Node --noheader --format='%N %T'``; a node listed in several
    partitions appears once."""
    out: dict[str, NodeState] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        name, raw = parts
        out[name] = NodeState(raw.rstrip(_STATE_FLAGS).lower(), not raw.endswith("*"))
    return out
