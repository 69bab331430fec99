"""``hpclaunch doctor``: runs the checks of hpclaunch.ops.doctor against the real
cluster, in order; a check whose ground is missing (no controller) is skipped."""

from __future__ import annotations

import secrets
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from hpclaunch._version import __version__
from hpclaunch.errors import HpclaunchError, SlurmError
from hpclaunch.job.profiles import Resolved
from hpclaunch.ops import doctor
from hpclaunch.ops.doctor import Finding, Verdict
from hpclaunch.slurm.commands import CommandResult, Slurm

PROBE_TIMEOUT_S = 120.0
IMMEDIATE_S = 60  # srun --immediate: give up on a node after this long
MARKER = ".hpclaunch-doctor"


def _ask(
    slurm: Slurm, argv: Sequence[str], cwd: Path | None = None, timeout_s: float | None = None
) -> CommandResult:
    """Run a SLURM command; a non-zero exit is an answer. Raises SlurmError (timeout)."""
    return slurm.runner(argv, timeout_s=timeout_s or slurm.timeout_s, cwd=cwd, env=slurm.env)


def run(
    slurm: Slurm, env: dict[str, str], cwd: Path, resolved: Resolved, allocate: bool
) -> Iterator[Finding]:
    """Every check's finding, in order."""
    path = env.get("PATH", "")
    found = {name: shutil.which(name, path=path) for name in doctor.COMMANDS}
    yield (first := doctor.commands(found))
    conf = env.get("SLURM_CONF")
    bad_conf = doctor.slurm_conf(conf, conf is None or Path(conf).is_file())
    if first.verdict is Verdict.PROBLEM or bad_conf is not None:
        yield bad_conf or Finding("controller", Verdict.SKIPPED, "needs SLURM's commands")
        return
    try:
        ping = _ask(slurm, ("scontrol", "ping"))
    except SlurmError as exc:
        yield Finding("controller", Verdict.PROBLEM, str(exc))
        return
    yield (alive := doctor.controller(conf, ping.returncode, ping.stdout, ping.stderr))
    if alive.verdict is Verdict.PROBLEM:
        return
    try:
        cluster = list(_cluster(slurm, cwd, resolved))
    except SlurmError as exc:  # a command that did not answer in time
        yield Finding("cluster", Verdict.PROBLEM, str(exc))
        return
    yield from cluster
    placed = cluster[0].verdict is not Verdict.PROBLEM  # no node of a bad partition
    yield from _node(slurm, cwd, resolved, allocate and placed)


def _cluster(slurm: Slurm, cwd: Path, resolved: Resolved) -> Iterator[Finding]:
    spec = resolved.spec
    parts = _ask(slurm, ("scontrol", "show", "partition", "--oneliner")).stdout
    yield doctor.partition(spec.partition, parts, spec.nodes.min)
    yield _test_only(slurm, cwd, resolved)
    fields = doctor.parse_partitions(parts)
    name = spec.partition or next((n for n, f in fields.items() if f.get("Default") == "YES"), None)
    config = _ask(slurm, ("scontrol", "show", "config")).stdout
    yield doctor.requeue(config, fields.get(name or "", {}), spec.max_requeues)


def _test_only(slurm: Slurm, cwd: Path, resolved: Resolved) -> Finding:
    """``sbatch --test-only`` of the script ``hpclaunch sbatch`` would submit."""
    from hpclaunch.job.render import render

    spec = resolved.spec
    try:
        text = render(spec)
    except HpclaunchError as exc:
        return Finding("job script", Verdict.PROBLEM, f"it does not render: {exc}")
    with tempfile.TemporaryDirectory(prefix="hpclaunch-doctor-") as folder:
        script = Path(folder) / "job.sh"
        script.write_text(text)
        done = _ask(slurm, ("sbatch", "--test-only", str(script)), cwd=cwd)
    return doctor.test_only(
        done.returncode, done.stderr, spec.gpus_per_node, spec.gpu_directive.value
    )


def _node(slurm: Slurm, cwd: Path, resolved: Resolved, allocate: bool) -> Iterator[Finding]:
    """What one node sees: hpclaunch on its PATH, and the log folder."""
    spec = resolved.spec
    folder = cwd / spec.log_dir
    try:
        folder.mkdir(parents=True, exist_ok=True)  # hpclaunch sbatch makes it too
    except OSError as exc:
        yield Finding(
            "log folder",
            Verdict.PROBLEM,
            f"cannot create {folder}: {exc.strerror}",
            "give --log-dir (or log_dir) a folder you can write",
        )
        return
    fs = _fs_type(folder)
    if not allocate:
        yield Finding("hpclaunch on nodes", Verdict.SKIPPED, "no node asked for")
        yield doctor.filesystem(str(folder), fs)
        return
    marker = secrets.token_hex(8)
    try:
        (folder / MARKER).write_text(marker + "\n")
    except OSError as exc:
        yield Finding(
            "log folder",
            Verdict.PROBLEM,
            f"cannot write in {folder}: {exc.strerror}",
            "give --log-dir (or log_dir) a folder you can write",
        )
        return
    try:
        done = _ask(slurm, _srun(resolved, folder / MARKER), cwd=cwd, timeout_s=PROBE_TIMEOUT_S)
    except SlurmError as exc:
        yield Finding("nodes", Verdict.WARN, str(exc))
        return
    finally:
        (folder / MARKER).unlink(missing_ok=True)
    no_node = doctor.allocation(done.returncode, done.stderr)
    if no_node is not None:
        yield no_node
        yield doctor.filesystem(str(folder), fs)
        return
    probe = doctor.sections(done.stdout)
    yield doctor.on_nodes(probe, spec.launcher, __version__)
    yield doctor.shared(str(folder), marker, probe)


def _fs_type(folder: Path) -> str:
    """The filesystem type of ``folder`` (``stat -f``); "" when stat cannot tell."""
    try:
        done = subprocess.run(
            ["stat", "-f", "-c", "%T", str(folder)],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip()


def _srun(resolved: Resolved, marker: Path) -> list[str]:
    """One task on one node, running the job's setup lines first, as the job would."""
    spec = resolved.spec
    launcher = shlex.join(spec.launcher)
    script = "\n".join(
        [
            *spec.setup,
            "echo @@host; hostname",
            "echo @@which; command -v hpclaunch",
            f"echo @@version; {launcher} --version 2>&1",
            f"echo @@marker; cat -- {shlex.quote(str(marker))} 2>&1",
            f"echo @@fs; stat -f -c %T -- {shlex.quote(str(marker.parent))}",
            "exit 0",
        ]
    )
    argv = [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        f"--immediate={IMMEDIATE_S}",
        "--time=2",
        "--job-name=hpclaunch-doctor",
    ]
    for option, value in (
        ("partition", spec.partition),
        ("account", spec.account),
        ("qos", spec.qos),
        ("constraint", spec.constraint),
    ):
        if value is not None:
            argv.append(f"--{option}={value}")
    return [*argv, "bash", "-c", script]
