"""This node's folder in node memory: the node-local checkpoint copies and the hang
watch's progress files, for one agent's life.

Node memory (``/dev/shm``) outlives jobs and is shared by every job and user on the
node, and on some sites by several clusters whose job ids overlap. So the folder is
named by a key no other job shares (``LocalKey``: the owner's uid, the cluster, the
job id, the submission's stamp, the run and the node), made afresh by its agent
(owner-only, whatever the umask) and never reused: files already under that name are
from an earlier agent of the very same job and run, and are removed, not read.

A live agent holds an exclusive lock (``flock``) on ``NAME.lock`` beside its folder
for as long as it runs. Any folder of this user's and this node's with the prefix and
no live lock is a leftover (an agent SLURM killed after KillWait cannot remove its
own) and is cleared by the next agent that starts on the node, holding the lock while
it does. Another user's files are never
touched; the lock is all that is read of another job's.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpclaunch import procs
from hpclaunch.contract.worker_env import SUBMITTED as SUBMITTED_VAR
from hpclaunch.errors import HpclaunchError
from hpclaunch.slurm.env import NodeContext

log = logging.getLogger(__name__)

# SUBMITTED_VAR: set by ``hpclaunch sbatch`` in sbatch's environment, which SLURM passes
# on to the job: the submission's time in nanoseconds. Slurm 22.05 sets no submit or
# start time in a job's environment, and asking the controller from every node would
# load it at every start.
CLUSTER_VAR = "SLURM_CLUSTER_NAME"
LOCK_SUFFIX = ".lock"
FOLDER_MODE = 0o700
# How long a new agent tries for its lock: another agent clearing leftovers may hold it
# for as long as it takes to remove one folder; a live agent holds it for good.
CLAIM_WAIT_S = 5.0
_CLAIM_POLL_S = 0.05


@dataclass(frozen=True)
class LocalKey:
    """What tells this agent's node-local folder apart from every other job's."""

    uid: int
    cluster: str  # SLURM_CLUSTER_NAME; "nocluster" where SLURM does not say
    job_id: int
    submitted: str  # HPCLAUNCH_SUBMITTED, else this agent's own process stamp
    requeue: int
    host: str

    @property
    def name(self) -> str:
        return _safe(
            f"{prefix(self.uid)}{self.cluster}-{self.job_id}-{self.submitted}-"
            f"{self.requeue}-{self.host}"
        )


def prefix(uid: int) -> str:
    """The start of every node-local folder name of user ``uid``."""
    return f"hpclaunch-u{uid}-"


def key(ctx: NodeContext, env: Mapping[str, str], uid: int, own_stamp: str) -> LocalKey:
    """The key of this node's folder. ``own_stamp`` stands in for the submission's
    stamp when the job was not submitted by ``hpclaunch sbatch`` (a script of one's
    own, ``sbatch --export=NONE``): unique to this agent's process on this node."""
    return LocalKey(
        uid=uid,
        cluster=env.get(CLUSTER_VAR, "").strip() or "nocluster",
        job_id=ctx.job_id,
        submitted=env.get(SUBMITTED_VAR, "").strip() or own_stamp,
        requeue=ctx.restart_count,
        host=ctx.hostname,
    )


def own_stamp() -> str:
    """This process's pid and start time: no other live or earlier process on this
    node since boot (when node memory is emptied) has both."""
    me = procs.Tracked.of(os.getpid())
    return f"p{me.pid}.{me.start_time}"


def base_folder() -> Path:
    """Node memory where there is some, else the temporary folder."""
    return Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())


def path_of(local: LocalKey, base: Path | None = None) -> Path:
    return (base if base is not None else base_folder()) / local.name


class LocalFolder:
    """This agent's node-local folder, made and locked by ``open``, removed by ``close``."""

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path, self._lock_fd = path, lock_fd

    @classmethod
    def open(cls, local: LocalKey, base: Path | None = None) -> LocalFolder:
        """Lock the key's name, clear what was left under it and make the folder
        (mode 0700). Raises HpclaunchError: the name is held by another live agent,
        or by something of another user's, or node memory cannot be written."""
        path = path_of(local, base)
        try:
            fd = _lock(Path(f"{path}{LOCK_SUFFIX}"), local.uid, wait_s=CLAIM_WAIT_S)
        except OSError as exc:
            raise _cannot(path, exc) from None
        if fd is None:
            raise HpclaunchError(
                f"this node's node-local folder {path} is held by another live agent of job "
                f"{local.job_id}, run {local.requeue}: start one agent per node "
                "(srun --ntasks-per-node=1)"
            )
        try:
            _remove_own(path, local.uid)  # an earlier agent of this very job, run and node
            os.mkdir(path, FOLDER_MODE)
            os.chmod(path, FOLDER_MODE)  # the umask may have taken bits away, never added
        except OSError as exc:
            os.close(fd)
            raise _cannot(path, exc) from None
        except HpclaunchError:
            os.close(fd)
            raise
        return cls(path, fd)

    def close(self) -> None:
        """Remove the folder, then its lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        Path(f"{self.path}{LOCK_SUFFIX}").unlink(missing_ok=True)
        os.close(self._lock_fd)


def clear_stale(base: Path, uid: int, keep: str, host: str) -> list[Path]:
    """Remove user ``uid``'s node-local folders of node ``host`` under ``base`` that no
    live agent holds, but ``keep`` (a name); return what was removed. Another user's
    files, folders of live agents (other jobs of this user's) and folders of other
    nodes stay: where ``base`` is a shared file system ($TMPDIR on NFS), a lock may be
    seen on its own node only, so another node's folder cannot be told from a
    leftover."""
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError as exc:
        log.warning("cannot list %s for leftover node-local folders: %s", base, exc)
        return []
    names = {e.name.removesuffix(LOCK_SUFFIX) for e in entries if is_of(e.name, uid, host)}
    for name in sorted(names - {keep}):
        folder = base / name
        lock = Path(f"{folder}{LOCK_SUFFIX}")
        try:
            # Made when missing, so that while this process clears the name no new
            # agent of it can make its folder (it waits for the lock, then locks anew).
            fd = _lock(lock, uid, wait_s=0.0)
        except (OSError, HpclaunchError) as exc:
            log.warning("leftover node-local folder %s kept: %s", folder, exc)
            continue
        if fd is None:  # a live agent's, or made anew by one since it was listed
            continue
        try:
            if _remove_own(folder, uid):
                removed.append(folder)
        except (OSError, HpclaunchError) as exc:
            log.warning("leftover node-local folder %s kept: %s", folder, exc)
        finally:
            lock.unlink(missing_ok=True)  # held here: no live agent's
            os.close(fd)
    return removed


def is_of(name: str, uid: int, host: str) -> bool:
    """Whether ``name`` (a folder's or its lock's) is a node-local name of user
    ``uid`` on node ``host``: the prefix, then anything, then ``-REQUEUE-HOST``."""
    name = name.removesuffix(LOCK_SUFFIX)
    return name.startswith(prefix(uid)) and (
        re.search(rf"-\d+-{re.escape(_safe(host))}$", name[len(prefix(uid)) :]) is not None
    )


def _lock(path: Path, uid: int, *, wait_s: float) -> int | None:
    """An exclusive lock on the lock file ``path`` (made 0600 when missing): its
    descriptor; None when another process holds it, or holds a lock file made anew
    under that name, for ``wait_s``. Raises HpclaunchError (a lock file of another
    user's) or OSError."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CREAT, 0o600)
        except PermissionError as exc:
            raise _denied(path, exc, _lstat(path), uid) from None
        locked = _claim(fd, path, uid)
        if locked is not None or time.monotonic() >= deadline:
            return locked
        time.sleep(_CLAIM_POLL_S)  # a clearing agent's, for a moment, or a live one's


def _claim(fd: int, path: Path, uid: int) -> int | None:
    """Lock ``fd``, open on the lock file ``path``: ``fd`` when this process now holds
    the lock of the file that is at ``path``; else None, ``fd`` closed. None also when
    the file at ``path`` is no longer the one ``fd`` is open on: a clearing agent
    unlinked it between our open and our lock, and a new agent of that name may hold
    the new one, so what the old one guarded is not ours to remove. Raises
    HpclaunchError (a lock file of another user's) or OSError."""
    try:
        held = os.fstat(fd)
        if held.st_uid != uid:
            raise _not_ours(path, "a file", held.st_uid, uid)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            now = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            now = None
    except BaseException:
        os.close(fd)
        raise
    if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
        return fd
    os.close(fd)
    return None


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _denied(path: Path, exc: OSError, found: os.stat_result | None, uid: int) -> Exception:
    """What to raise when opening the lock file ``path`` was refused (``exc``):
    ``found`` is its lstat, if any. Another user's file: not ours (a one-line
    HpclaunchError); otherwise ``exc`` itself."""
    if found is not None and found.st_uid != uid:
        return _not_ours(path, "a file", found.st_uid, uid)
    return exc


def _remove_own(path: Path, uid: int) -> bool:
    """Remove ``path`` (a folder of user ``uid``'s, or nothing); True if it was there.
    Raises HpclaunchError when it is something else: another user's, or a link."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != uid:
        what = "a folder" if stat.S_ISDIR(found.st_mode) else "not a folder"
        raise _not_ours(path, what, found.st_uid, uid)
    shutil.rmtree(path)
    return True


def _not_ours(path: Path, what: str, owner: int, uid: int) -> HpclaunchError:
    return HpclaunchError(
        f"the node-local path {path} exists and is {what} of uid {owner}, not a folder of "
        f"this user's (uid {uid}); it was not made by this job, so it is neither read nor "
        "removed: ask the node's administrator to remove it"
    )


def _cannot(path: Path, exc: OSError) -> HpclaunchError:
    return HpclaunchError(
        f"cannot make this node's node-local folder {path}: {exc.strerror or exc}; "
        "node memory (/dev/shm, else $TMPDIR) must be writable by the job"
    )


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
