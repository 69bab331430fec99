"""Checking a checkpoint folder at submit and taking it at start: the folder's marker
(``hpclaunch.checkpoint.owner``), what SLURM (or this machine, for a local job) says
of the job it names, and the rule (``hpclaunch.checkpoint.sharing``). No torch.
"""

from __future__ import annotations

import errno
import getpass
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hpclaunch import procs
from hpclaunch.checkpoint import owner as marker
from hpclaunch.checkpoint import store
from hpclaunch.checkpoint.owner import Kind, MarkerError, Owner
from hpclaunch.checkpoint.sharing import (
    ANYWHERE,
    Decision,
    Holder,
    Liveness,
    Situation,
    Spelling,
    Stage,
    Verdict,
    decide,
)
from hpclaunch.errors import ExitCode, HpclaunchError
from hpclaunch.jobdir import modes
from hpclaunch.slurm.states import JobState

if TYPE_CHECKING:
    from hpclaunch.slurm.commands import JobLookup, Slurm

# How long a holder that SLURM says is COMPLETING is waited for: SLURM starts a job
# that waits for it (--dependency=afterany) while it is still completing.
COMPLETING_WAIT_S = 60.0
# Takes lost to other jobs starting at the same moment before giving up: after a lost
# take the winner's marker is there, and the job is refused by it.
_TRIES = 3


class FolderTaken(HpclaunchError):
    """The checkpoint folder is another job's, or holds checkpoints this job was not
    told to continue from; the message names the folder, the job and the fixes."""

    def __init__(self, decision: Decision, holder: Holder | None = None) -> None:
        super().__init__(decision.message)
        self.decision = decision
        asked_slurm = holder is not None and holder.owner.kind is Kind.SLURM
        if decision.verdict is Verdict.UNKNOWN and asked_slurm:
            self.exit_code = ExitCode.SLURM


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no name for this uid
        return None


def slurm_job(env: Mapping[str, str]) -> Owner:
    """This SLURM job, from its batch step's environment."""
    return Owner(
        Kind.SLURM,
        env["SLURM_JOB_ID"],
        env.get("SLURM_JOB_NAME"),
        env.get("SLURM_JOB_USER") or _user(),
        env.get("SLURM_SUBMIT_HOST"),
        time.time(),
        cluster=env.get("SLURM_CLUSTER_NAME") or None,
    )


def local_job(job_id: str, name: str | None = None) -> Owner:
    """A job of ``hpclaunch.Executor(cluster="local")``: ``job_id`` is the pid of
    submitit's controller on this machine, which lives as long as the job."""
    found = procs.proc(int(job_id)) if job_id.isdigit() else None
    start = str(found.start_time) if found is not None else None
    return Owner(Kind.LOCAL, job_id, name, _user(), socket.gethostname(), time.time(), start)


def holder(
    owner: Owner,
    slurm: Slurm | None,
    *,
    cluster: str | None = None,
    completing_wait_s: float = COMPLETING_WAIT_S,
    poll_s: float = 1.0,
) -> Holder:
    """Whether the job ``owner`` names is still active; ``cluster`` is the cluster
    this runs on, when known. A SLURM job that is COMPLETING (its processes being
    ended, its epilog running) is asked about again until it has ended, for
    ``completing_wait_s`` at most. Raises nothing: what cannot be told is UNKNOWN,
    with why."""
    if owner.kind is Kind.LOCAL:
        return _local_holder(owner)
    if slurm is None:
        return Holder(owner, Liveness.UNKNOWN, "SLURM cannot be asked from here")
    if owner.cluster and cluster and owner.cluster != cluster:
        return Holder(
            owner,
            Liveness.UNKNOWN,
            f"it ran on cluster {owner.cluster}, and "
            f"hpclaunch asks only this cluster's ({cluster}) SLURM; if it is over, "
            f"remove the {marker.MARKERS} marker from the folder",
        )
    answer = slurm.lookup(owner.job_id)
    deadline = time.monotonic() + completing_wait_s
    while _completing(answer) and time.monotonic() < deadline:
        time.sleep(poll_s)
        answer = slurm.lookup(owner.job_id)
    record = answer.record
    if record is not None:
        state = record.job_state
        if state is None:
            unknown = f"SLURM says {record.state!r}, a state this hpclaunch does not know"
            return Holder(owner, Liveness.UNKNOWN, unknown)
        return Holder(owner, Liveness.ENDED if state.final else Liveness.ACTIVE, state.value)
    if answer.forgotten:
        return _forgotten(owner)
    if answer.not_on_path:
        return Holder(owner, Liveness.UNKNOWN, "SLURM's commands are not on PATH here")
    said = "; ".join(filter(None, (answer.scontrol_error, answer.sacct_error)))
    return Holder(owner, Liveness.UNKNOWN, f"SLURM did not answer: {said or 'no answer'}")


def _process_alive(pid: int, start: str | None) -> bool:
    """Whether process ``pid`` runs on this machine and is the one that started at
    ``start`` (when known: a pid can be reused). Zombies count as gone."""
    found = procs.proc(pid)
    if found is not None:
        return not found.zombie and (start is None or str(found.start_time) == start)
    try:  # gone, or /proc does not show it (none, or hidepid): kill(0) is all there is
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's: it exists
    return True


def _forgotten(owner: Owner) -> Holder:
    """SLURM has no record of the job: it ended long ago, unless it is another user's
    and SLURM hides other users' jobs (PrivateData=jobs)."""
    me = _user()
    if owner.user and me and owner.user != me:
        return Holder(
            owner,
            Liveness.UNKNOWN,
            f"SLURM shows no record of it, and it is user "
            f"{owner.user}'s, whose jobs SLURM may not show to {me}, so hpclaunch "
            f"cannot see them; if it is over, remove the {marker.MARKERS} marker from "
            "the folder",
        )
    return Holder(owner, Liveness.ENDED, "SLURM no longer knows it")


def _completing(answer: JobLookup) -> bool:
    return answer.record is not None and answer.record.job_state is JobState.COMPLETING


def _local_holder(owner: Owner) -> Holder:
    if owner.host != socket.gethostname() or not owner.job_id.isdigit():
        return Holder(
            owner,
            Liveness.UNKNOWN,
            f"it runs on {owner.host}, whose processes this "
            f"machine cannot see; if it is over, remove the {marker.MARKERS} "
            "marker from the folder",
        )
    pid = int(owner.job_id)
    if _process_alive(pid, owner.pid_start):
        return Holder(owner, Liveness.ACTIVE, f"running (process {pid})")
    return Holder(owner, Liveness.ENDED, f"its process {pid} is gone")


def _latest(folder: Path) -> int | None:
    try:  # hpclaunch's own checkpoints and Lightning's (hpclaunch.frameworks.lightning)
        steps = [found.step for found in store.complete(folder)] + store.lightning_steps(folder)
    except OSError as exc:
        raise MarkerError(
            f"cannot list the checkpoint folder {folder}: {exc.strerror or exc}; give a "
            "--checkpoint-dir this user can read and write"
        ) from None
    return max(steps) if steps else None


def check_submit(
    folder: Path,
    *,
    adopt: bool,
    dependency: str | None,
    name: str | None,
    slurm: Slurm | None,
    spell: Spelling = ANYWHERE,
) -> Decision:
    """Whether a job about to be submitted may use ``folder`` (see sharing.decide).
    Writes nothing. Raises FolderTaken, MarkerError."""
    owner, _ = marker.read(folder)
    held = holder(owner, slurm) if owner is not None else None
    decision = decide(
        Situation(
            str(folder),
            Stage.SUBMIT,
            owner,
            held,
            _latest(folder),
            adopt,
            dependency=dependency,
            name=name,
            user=_user(),
            spell=spell,
        )
    )
    if not decision.allowed:
        raise FolderTaken(decision, held)
    return decision


# Errors of a folder that may be taken but cannot be written now (see ``take``).
UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES})


def claim_start(folder: Path, me: Owner, *, adopt: bool, slurm: Slurm | None) -> Decision:
    """Take ``folder`` for the starting job ``me``: its marker names ``me`` from now on
    (a requeue of ``me`` finds it so). A refusal writes nothing. Raises FolderTaken,
    MarkerError, OSError (the folder or the marker cannot be written)."""
    for _ in range(_TRIES):
        owner, seen = marker.read(folder)
        held = (
            None
            if owner is None or owner.same_job(me)
            else holder(owner, slurm, cluster=me.cluster)
        )
        decision = decide(
            Situation(str(folder), Stage.START, owner, held, _latest(folder), adopt, me=me)
        )
        if not decision.allowed:
            raise FolderTaken(decision, held)
        if decision.verdict is Verdict.OWN:
            return decision
        modes.make_dirs(folder, modes.folder_mode(os.environ))
        if marker.take(folder, seen, me):
            return decision
    raise FolderTaken(
        Decision(
            Verdict.IN_USE,
            f"checkpoint folder {folder} was taken by "
            f"other jobs starting at the same moment, {_TRIES} times; give "
            "this job another --checkpoint-dir",
        )
    )


def take(folder: Path, me: Owner, *, adopt: bool, slurm: Slurm | None) -> str | None:
    """``claim_start`` for the job's first process (the batch step's supervisor, a local
    node): the message to log, None when there is nothing to say. Raises FolderTaken,
    MarkerError (also when the folder or the marker cannot be written)."""
    try:
        decision = claim_start(folder, me, adopt=adopt, slurm=slurm)
    except OSError as exc:
        if exc.errno in UNWRITABLE:
            # Allowed, but full or read-only: no job can write there now, so none can
            # take it over either. The first save fails with the storage verdict, which
            # names the folder, the error and the fix; refusing here would say less.
            return (
                f"cannot mark the checkpoint folder {folder} as this job's: "
                f"{exc.strerror or exc}; going on without the mark (saves there will fail "
                "the same way, and the job will end saying so)"
            )
        raise MarkerError(
            f"cannot take the checkpoint folder {folder}: {exc.strerror or exc}; give a "
            "--checkpoint-dir this user can write"
        ) from None
    return decision.message if decision.verdict is Verdict.ADOPT else None
