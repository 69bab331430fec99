"""Parsers for the values users type on the login node (``04:00:00``, ``64G``, ``K=V``,
a dependency, a checkpoint pattern).

Shared by the CLI's parameter types and the profile loader, so a value means
the same wherever it is written. Each raises SpecError naming the option. The values
that the script also passes on to the agent (a node range, a hang timeout, etcd
endpoints) are parsed in ``hpclaunch.contract.values``.
"""

from __future__ import annotations

import re
from datetime import timedelta

from hpclaunch.errors import SpecError

# Patterns are compiled on first use (re's own cache): a command pays only for the
# values it is given.
_DIGITS = r"[0-9]+\Z"
_MEM = r"(?i)([0-9]+)([KMGT]?)\Z"
_UNLIMITED_WORDS = frozenset({"unlimited", "infinite"})
# SLURM keeps time limits as 32-bit minute counts.
MAX_TIME_S = 0xFFFFFFFE * 60
UNLIMITED = timedelta.max
"""The time limit ``UNLIMITED``; ``None`` in a JobSpec means no limit was asked
for (the partition's default applies)."""


def parse_time(text: str) -> timedelta:
    """Parse a SLURM time limit (``UNLIMITED`` for none). Raises SpecError.

    Accepted forms are SLURM's: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
    ``D-H:M:S``, and ``UNLIMITED``/``INFINITE``.
    """
    raw = text
    text = text.strip()
    if text.lower() in _UNLIMITED_WORDS:
        return UNLIMITED
    days = 0
    rest = text
    if "-" in text:
        day_text, _, rest = text.partition("-")
        if not re.match(_DIGITS, day_text):
            rest = ""  # forces the error below
        else:
            days = int(day_text)
    fields = rest.split(":")
    if not rest or len(fields) > 3 or not all(re.match(_DIGITS, f) for f in fields):
        raise SpecError(
            "time",
            f"{raw!r} is not a SLURM time limit; use one of M, M:S, H:M:S, D-H, D-H:M, "
            "D-H:M:S (e.g. 30, 04:00:00, 2-12) or UNLIMITED",
        )
    nums = [int(f) for f in fields]
    if "-" in text:  # D-H, D-H:M, D-H:M:S
        nums += [0] * (3 - len(nums))
        hours, minutes, seconds = nums
    elif len(nums) == 1:  # M
        hours, minutes, seconds = 0, nums[0], 0
    elif len(nums) == 2:  # M:S
        hours, minutes, seconds = 0, nums[0], nums[1]
    else:  # H:M:S
        hours, minutes, seconds = nums
    total_s = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total_s <= 0:
        raise SpecError("time", f"time limit {raw!r} is zero; give a positive limit or UNLIMITED")
    if total_s > MAX_TIME_S:
        raise SpecError("time", f"time limit {raw!r} is longer than SLURM can store; use UNLIMITED")
    return timedelta(seconds=total_s)


def format_time(limit: timedelta) -> str:
    """SLURM's ``D-HH:MM:SS`` (or ``UNLIMITED``)."""
    if limit == UNLIMITED:
        return "UNLIMITED"
    total = int(limit.total_seconds())
    days, rem = divmod(total, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, seconds = divmod(rem, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}"


def parse_mem(text: str) -> str:
    """Validate SLURM's ``--mem`` form (``64G``, ``500M``, ``0`` = all). Raises SpecError."""
    match = re.fullmatch(_MEM, text.strip())
    if not match:
        raise SpecError(
            "mem",
            f"{text!r} is not a memory size; use a whole number with an optional unit "
            "K, M, G or T, e.g. 64G (0 asks for all of a node's memory)",
        )
    return match.group(1) + match.group(2).upper()


def parse_env(text: str) -> tuple[str, str]:
    """Parse one ``--env KEY=VALUE``. Raises SpecError."""
    key, sep, value = text.partition("=")
    if not sep:
        raise SpecError("env", f"{text!r} has no '='; write KEY=VALUE, e.g. --env NCCL_DEBUG=INFO")
    return key, value


def parse_sbatch_option(text: str) -> tuple[str, str | None]:
    """Parse ``KEY=VALUE`` or a bare flag ``KEY`` (e.g. ``exclusive``)."""
    key, sep, value = text.partition("=")
    return key.lstrip("-"), (value if sep else None)


def check_checkpoint_pattern(pattern: str) -> None:
    """Reject a ``--checkpoint-pattern`` glob that can never name a checkpoint file:
    empty, ``**`` inside a name, or one folder named outright. Raises SpecError."""
    # Imported here: the patterns' reader says what a wildcard is, and the login node
    # loads it only for a job that gives patterns.
    from hpclaunch.jobdir.found_checkpoints import has_wildcard

    field = "checkpoint_patterns"
    if not pattern.strip():
        raise SpecError(
            field, f"{pattern!r} is empty; give a glob such as 'snapshot.pt' or 'ckpt/*.ckpt'"
        )
    if any("**" in part and part != "**" for part in pattern.split("/")):
        raise SpecError(
            field,
            f"{pattern!r} has '**' inside a name; '**' stands for any folders only as a "
            "whole part of the path, as in 'ckpt/**/*.pt': write it so, or use '*'",
        )
    if pattern.endswith("/") and not has_wildcard(pattern):
        raise SpecError(field, folder_pattern(pattern))


def folder_pattern(pattern: str) -> str:
    """Why a pattern without a wildcard that names a folder is refused, and the fix."""
    folder = pattern.rstrip("/") or "/"
    return (
        f"{pattern!r} names the folder {folder!r}, not checkpoint files, so status would "
        f"show the folder itself; give '{folder.rstrip('/')}/*' for the newest file or "
        "folder in it"
    )


# sbatch's --dependency: TYPE:JOBID[+MINUTES][:JOBID...] parts (singleton alone), joined by
# "," (all must hold) or "?" (any may); SLURM 22.05's types.
DEPENDENCY_TYPES = ("after", "afterany", "afterburstbuffer", "aftercorr", "afternotok", "afterok")
_DEPENDENCY_PART = (
    rf"(?:{'|'.join(DEPENDENCY_TYPES)})(?::[0-9]+(?:_[0-9]+)?(?:\+[0-9]+)?)+\Z|singleton\Z"
)


def parse_dependency(text: str) -> str:
    """Check sbatch's ``--dependency`` value; returns it unchanged. Raises SpecError."""
    joins = [sep for sep in ",?" if sep in text]
    parts = re.split(r"[,?]", text)
    bad = [part for part in parts if not re.match(_DEPENDENCY_PART, part)]
    if len(joins) > 1 or bad or not text:
        what = f"{bad[0]!r} in " if bad and bad[0] != text else ""
        raise SpecError(
            "dependency",
            f"{what}{text!r} is not a SLURM dependency; write TYPE:JOBID[:JOBID...] with TYPE "
            f"one of {', '.join(DEPENDENCY_TYPES)}, or singleton; join parts with ',' (all "
            "must hold) or '?' (any may), not both; e.g. afterok:1234",
        )
    return text


def after_dependency(job_ids: tuple[int, ...]) -> str:
    """``--after JOBID``'s dependency: start once each job has completed successfully
    (afterok; a requeued job keeps its id, so this waits through its requeues)."""
    for job_id in job_ids:
        if job_id < 1:
            raise SpecError("after", f"--after {job_id}: a job id is a positive number")
    return "afterok:" + ":".join(str(job_id) for job_id in job_ids)
