"""What every worker rank of an ``hpclaunch.Executor`` job runs:
``python -m hpclaunch.executor.worker FOLDER``.

It loads the call submitit pickled into FOLDER and makes it on this rank, with
torchrun's environment already set by the agent. Global rank 0 saves the
return value where submitit's ``job.result()`` reads it. A raised exception
goes to torch's error file (``@record``), from which the supervisor and
``job.result()`` name the first failing rank.

Stop signals (preemption, the time-limit warning, ``scontrol requeue``,
``scancel``, and the agent stopping the group to restart it) end a rank that
did not install its own ``hpclaunch.checkpoint.Preemption`` flag. On rank 0, a
callable with submitit's ``checkpoint()`` method is then asked for its
checkpoint (outside the signal handler), and what it returns replaces the
pickled call for the next run, in place or after a requeue. A stopped rank
leaves no result: the job runs again.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from hpclaunch import checkpoint
from hpclaunch.contract import worker_env
from hpclaunch.executor import sources
from hpclaunch.jobdir.layout import JOB_DIR_VAR, ExecutorFolder

log = logging.getLogger("hpclaunch.executor")

# How long a rank waits for submitit to move the pickle into place: sbatch
# returns the job id before submitit renames the pickle, and a job may start first.
PICKLE_WAIT_S = 60.0


class Stopped(BaseException):
    """Raised inside the function by a stop signal it did not handle itself."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while not path.exists():
        if time.monotonic() > deadline:
            raise FileNotFoundError(
                f"the job's pickled call {path} did not appear within {timeout_s:.0f} s; "
                "the folder given to hpclaunch.Executor must be shared by the submitting "
                "machine and every node"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    raw = (json.dumps(data, indent=2) + "\n").encode()
    checkpoint.write_atomic(path, lambda handle: handle.write(raw), replace=True)


def _install_stop() -> None:
    """Stop signals end the call by raising ``Stopped`` in it. The handler does
    nothing else: the checkpoint is taken once the call has unwound (see ``run``).

    Only rank 0 of a callable with ``checkpoint()`` needs this. Every other rank
    keeps the default disposition and dies of the signal at once: a Python handler
    runs only between bytecodes, so a rank blocked in a collective (waiting for a
    peer that failed) would otherwise sit out the agent's whole grace period."""

    def stop(signum: int, _frame: FrameType | None) -> None:
        for sig in checkpoint.STOP_SIGNALS:  # one signal is enough; more must not interrupt
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    for sig in checkpoint.STOP_SIGNALS:
        signal.signal(sig, stop)


def _checkpoint(delayed: Any, pickle_path: Path, signum: int) -> None:
    """submitit's protocol: the callable's ``checkpoint()`` gives the call the next run
    makes (None keeps the current one)."""
    log.info("%s: calling the function's checkpoint()", signal.Signals(signum).name)
    renewed = delayed._checkpoint_function()
    if renewed is not None:
        renewed.set_timeout(delayed._timeout_min, delayed._timeout_countdown)
        sources.carry(delayed, renewed)
        _dump(renewed, pickle_path)


def _dump(delayed: Any, path: Path) -> None:
    """Replace the pickled call atomically (the next run loads it)."""
    import cloudpickle  # type: ignore[import-untyped]

    checkpoint.write_atomic(path, lambda handle: cloudpickle.dump(delayed, handle), replace=True)


def run(folder: Path, env: Mapping[str, str] | None = None) -> int:
    """Make this rank's call; returns the exit status."""
    from submitit import JobEnvironment
    from submitit.core.utils import DelayedSubmission, JobPaths
    from torch.distributed.elastic.multiprocessing.errors import record

    environ = os.environ if env is None else env
    rank = int(environ["RANK"])
    job_id = JobEnvironment().job_id
    paths = JobPaths(folder, job_id=job_id, task_id=0)
    if rank == 0:
        _write_json(
            ExecutorFolder(folder).info(job_id),
            {
                "slurm_job_id": environ.get("SLURM_JOB_ID"),
                "job_dir": environ.get(JOB_DIR_VAR),
                "requeue": int(environ.get(worker_env.REQUEUE_COUNT) or 0),
            },
        )
    _wait_for(paths.submitted_pickle, PICKLE_WAIT_S)
    delayed = DelayedSubmission.load(paths.submitted_pickle)
    sources.restore(delayed)
    checkpointable = rank == 0 and hasattr(delayed.function, "checkpoint")
    if checkpointable:
        _install_stop()
    try:
        result = record(delayed.result)()
        if checkpoint.stop_received() is not None:
            log.info("rank %d: returned after a stop signal; no result", rank)
            return 0
        finished = ExecutorFolder(folder).finished(job_id, environ)
        finished.mkdir(parents=True, exist_ok=True)
        record(_dump_value)(finished / f"value-{rank}.pkl", result, rank)
        _mark_finished(finished, rank)
        if rank == 0:
            world = int(environ["WORLD_SIZE"])
            if not _all_finished(finished, world):
                log.info("rank 0: stopped while waiting for the other ranks; no result")
                return 0
            values = [(finished / f"value-{r}.pkl").read_bytes() for r in range(world)]
            _write_bytes(ExecutorFolder(folder).every_result(job_id), _pickled_list(values))
            # The markers go first: once the result is there, the job is done.
            shutil.rmtree(ExecutorFolder(folder).finished_root(job_id), ignore_errors=True)
            record(_dump_result)(paths.result_pickle, result)
    except Stopped as stopped:
        log.info("rank %d: stopped by %s; no result", rank, stopped)
        if checkpointable:
            record(_checkpoint)(delayed, paths.submitted_pickle, stopped.signum)
    return 0


def _mark_finished(finished: Path, rank: int) -> None:
    """This rank's call returned, and its value is in ``finished``."""
    (finished / f"rank-{rank}").touch()


def _all_finished(finished: Path, world_size: int) -> bool:
    """Rank 0 saves its value only once every rank's call has returned: a rank that
    raises fails the job even after rank 0 is done. If one fails, the agent stops
    rank 0 here. Returns False when a stop signal came meanwhile."""
    delay = 0.01
    while sum(1 for _ in finished.glob("rank-*")) < world_size:
        if checkpoint.stop_received() is not None:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.25)
    return True


def _dump_value(path: Path, value: Any, rank: int) -> None:
    """This rank's return value, for ``job.results()``. Raises TypeError naming the rank
    when it cannot be pickled (submitit's tasks pickle theirs too)."""
    import cloudpickle

    try:
        raw = cloudpickle.dumps(value)
    except Exception as exc:
        raise TypeError(
            f"rank {rank}'s return value (a {type(value).__name__}) cannot be pickled: {exc}; "
            "return plain data (numbers, strings, lists, dicts, tensors) and save the rest "
            "to files"
        ) from exc
    _write_bytes(path, raw)


def _pickled_list(values: list[bytes]) -> bytes:
    """The list of the values pickled in ``values``, pickled."""
    import cloudpickle

    return bytes(cloudpickle.dumps([cloudpickle.loads(raw) for raw in values]))


def _write_bytes(path: Path, raw: bytes) -> None:
    checkpoint.write_atomic(path, lambda handle: handle.write(raw), replace=True)


def _dump_result(path: Path, result: Any) -> None:
    import cloudpickle

    try:
        raw = cloudpickle.dumps(("success", result))
    except Exception as exc:
        raise TypeError(
            f"rank 0's return value (a {type(result).__name__}) cannot be pickled: {exc}; "
            "return plain data (numbers, strings, lists, dicts, tensors) and save the rest "
            "to files"
        ) from exc
    checkpoint.write_atomic(path, lambda handle: handle.write(raw), replace=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hpclaunch.executor.worker FOLDER", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="hpclaunch worker: %(message)s")
    return run(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
