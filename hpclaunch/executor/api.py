"""``hpclaunch.Executor``: submitit's executor interface, hpclaunch's jobs underneath.

Each submitted call becomes one hpclaunch job: the rendered sbatch script (the
supervisor, one agent per node, torch's elastic agent) whose workers all run
the call with torchrun's environment. submitit pickles the call and gives back
its ``Job``; hpclaunch's ``Job`` adds the rank logs and the root cause.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import uuid
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar, cast

from submitit.core import utils
from submitit.local.local import LocalExecutor
from submitit.slurm.slurm import SlurmExecutor

from hpclaunch.errors import HpclaunchError, SlurmError, SpecError
from hpclaunch.executor import params as parameters
from hpclaunch.executor import sources
from hpclaunch.executor.jobs import AnyJob, Job, LocalJob, attach
from hpclaunch.executor.local_settings import LocalSettings
from hpclaunch.job.profiles import load_profile
from hpclaunch.job.render import render
from hpclaunch.job.spec import JobSpec

R = TypeVar("R")
# submitit's local controller ends a job after its timeout: "no limit" is a year.
LOCAL_NO_LIMIT_MIN = 365 * 24 * 60


class ExecutorError(HpclaunchError):
    """The executor cannot be set up or cannot submit; the message says why and the fix."""


def run_script(path: str, args: Sequence[str]) -> None:
    """What ``submit_script`` runs on every rank: ``path`` as ``__main__`` with ``args``.
    ``sys.exit(0)`` is success; any other exit status fails the rank."""
    import runpy

    sys.argv = [path, *args]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise RuntimeError(f"{path} exited with status {exc.code!r}") from exc


class _SlurmBackend(SlurmExecutor):
    """submitit's SlurmExecutor, submitting hpclaunch's rendered script."""

    job_class = Job

    def __init__(self, folder: Path, spec: Callable[[], JobSpec]) -> None:
        super().__init__(folder)
        self._spec = spec
        self.parallelism: int | None = None  # the array's concurrency limit
        self.array: tuple[int, int | None] | None = None  # (tasks, parallelism) being submitted
        self._text = ""
        self.job_name: str | None = None  # the submitted function's, for the job name

    def job_spec(self) -> JobSpec:
        """The JobSpec of the submission being made: the executor's, named after the
        function (unless job_name is set), with the array directive of a map_array."""
        spec = self._spec()
        if spec.job_name is None and self.job_name is not None:
            spec = replace(spec, job_name=self.job_name)
        if self.array is None:
            return spec
        count, parallelism = self.array
        value = f"0-{count - 1}" + (f"%{parallelism}" if parallelism else "")
        return replace(spec, sbatch_options=(*spec.sbatch_options, ("array", value)))

    def prepare(self) -> None:
        """Render the script and make the log folder (SLURM does not create it)
        before anything is written or submitted."""
        spec = self.job_spec()
        _check_path_lengths(spec)
        text = render(spec)
        if spec.checkpoint_dir is not None:
            _check_checkpoints(Path.cwd() / spec.checkpoint_dir, spec, self.array)
        _make_folder(Path(spec.log_dir), "log_dir")
        self._text = text

    def discard(self) -> None:
        """Nothing to remove: the log folder may be shared with other jobs."""

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._text

    def _num_tasks(self) -> int:
        return 1  # one result, global rank 0's

    def _submit_command(self, command: str) -> Any:
        before = set(self.folder.glob(".submission_file_*"))
        try:
            return super()._submit_command(command)
        except utils.FailedJobError as exc:
            for path in set(self.folder.glob(".submission_file_*")) - before:
                path.unlink(missing_ok=True)
            raise SlurmError(("sbatch",), 1, str(exc), f"sbatch refused the job: {exc}") from None

    def _internal_process_submissions(
        self, delayed_submissions: list[utils.DelayedSubmission]
    ) -> list[Any]:
        return _submit_pickled(self, delayed_submissions)


class _LocalBackend(LocalExecutor):
    """submitit's LocalExecutor, running one hpclaunch node on this machine."""

    def __init__(self, folder: Path, spec: Callable[[], JobSpec]) -> None:
        super().__init__(folder)
        self._spec = spec
        self.parallelism: int | None = None  # unused: the jobs of a map_array run at once
        self.array: tuple[int, int | None] | None = None
        self._settings: Path | None = None

    def job_spec(self) -> JobSpec:
        return self._spec()

    def prepare(self) -> None:
        spec = self._spec()
        settings = LocalSettings.of(spec, Path.cwd())
        if settings.checkpoint_dir is not None:
            _check_checkpoints(Path(settings.checkpoint_dir), spec, self.array)
        _make_folder(Path(settings.log_dir), "log_dir")
        if settings.checkpoint_dir is not None:
            _make_folder(Path(settings.checkpoint_dir), "checkpoint_dir")
        path = self.folder / f".{uuid.uuid4().hex}_local.json"
        settings.write(path)
        self._settings = path

    def discard(self) -> None:
        """Remove what ``prepare`` wrote (the submission failed)."""
        if self._settings is not None:
            self._settings.unlink(missing_ok=True)

    @property
    def _submitit_command_str(self) -> str:
        return shlex.join(
            [
                sys.executable,
                "-u",
                "-m",
                "hpclaunch.executor.local_node",
                str(self.folder),
                str(self._settings),
            ]
        )

    def _num_tasks(self) -> int:
        return 1

    def _submit_command(self, command: str) -> Any:
        spec = self._spec()
        limit = spec.time_limit.total_seconds() / 60 if spec.time_limit else LOCAL_NO_LIMIT_MIN
        self.parameters.update(
            tasks_per_node=1,
            timeout_min=limit,
            signal_delay_s=spec.signal_lead_s,
            gpus_per_node=spec.gpus_per_node,
            stderr_to_stdout=True,
            setup=list(spec.setup),
        )
        started: Any = super()._submit_command(command)
        return LocalJob(self.folder, started.job_id, tasks=[0], process=started._process)

    def _internal_process_submissions(
        self, delayed_submissions: list[utils.DelayedSubmission]
    ) -> list[Any]:
        if len(delayed_submissions) > 1:  # one folder for them all: refused before any starts
            spec = self._spec()
            folder = LocalSettings.of(spec, Path.cwd()).checkpoint_dir
            if folder is not None:
                _check_checkpoints(Path(folder), spec, (len(delayed_submissions), None))
        jobs = []
        for delayed in delayed_submissions:  # one controller (one job) per call
            jobs += _submit_pickled(self, [delayed])
        return jobs


def _job_name(call: utils.DelayedSubmission) -> str:
    """A SLURM job name from the submitted function's name, or the script's."""
    if call.function is run_script and call.args:
        name = Path(str(call.args[0])).stem
    else:
        name = getattr(call.function, "__name__", "") or type(call.function).__name__
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "", name)
    return cleaned or "hpclaunch"


def _check_path_lengths(spec: JobSpec) -> None:
    """The log and checkpoint folders' whole paths against PATH_MAX, from the working
    folder (hpclaunch.job.paths). Raises ExecutorError."""
    from hpclaunch.job.paths import check_lengths

    try:
        check_lengths(spec.log_dir, spec.checkpoint_dir, Path.cwd())
    except SpecError as exc:
        raise ExecutorError(
            f"{exc.field} (from update_parameters({exc.field}=...), a profile, or the "
            f"executor's folder): {exc.message}"
        ) from None


def _make_folder(path: Path, name: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExecutorError(
            f"{name} {str(path)!r} (from update_parameters({name}=...), a profile, or the "
            f"executor's folder) cannot be created: {exc.strerror or exc}; give a folder "
            "this user can write, on a filesystem the nodes share"
        ) from None


def _check_checkpoints(folder: Path, spec: JobSpec, array: tuple[int, int | None] | None) -> None:
    """Refuse a checkpoint folder another job uses, or one with checkpoints this job
    was not told to continue from (hpclaunch.checkpoint.sharing), and one folder for
    the jobs of a map_array. Raises ExecutorError, FolderTaken."""
    from hpclaunch.checkpoint.claim import check_submit
    from hpclaunch.checkpoint.sharing import EXECUTOR, dependency_of
    from hpclaunch.slurm.commands import Slurm

    if array is not None:
        raise ExecutorError(
            f"checkpoint_dir {str(folder)!r} (from update_parameters or a profile) would be "
            f"shared by the {array[0]} jobs of this map_array, which would train on each "
            "other's checkpoints; leave checkpoint_dir out (each job then gets its own "
            "folder), or submit the jobs one by one with a folder each"
        )
    dependency = dependency_of(spec.sbatch_options)
    check_submit(
        folder,
        adopt=spec.adopt_checkpoints,
        dependency=dependency,
        name=spec.effective_job_name,
        slurm=Slurm(),
        spell=EXECUTOR,
    )


def _submit_pickled(
    backend: _SlurmBackend | _LocalBackend, delayed: list[utils.DelayedSubmission]
) -> list[Any]:
    """Pickle the calls, submit them as one job (or one array), move each pickle to
    its job's name. If the submission fails, no pickle is left behind."""
    _make_folder(backend.folder, "folder")
    if isinstance(backend, _SlurmBackend):
        backend.job_name = _job_name(delayed[0])
    spec = backend.job_spec()
    minutes = int(spec.time_limit.total_seconds() // 60) if spec.time_limit else 0
    pickles = []
    if len(delayed) > 1:
        backend.array = (len(delayed), backend.parallelism)
    try:
        backend.prepare()
        for call in delayed:
            path = backend.folder / f".{uuid.uuid4().hex}.pkl"
            pickles.append(path)
            call.set_timeout(minutes, backend.max_num_timeout)
            sources.remember(call)
            call.dump(path)
        first = backend._submit_command(backend._submitit_command_str)
    except BaseException:
        for path in pickles:
            path.unlink(missing_ok=True)
        backend.discard()
        raise
    finally:
        backend.array = None
    if len(delayed) == 1:
        jobs = [first]
    else:
        jobs = [Job(backend.folder, f"{first.job_id}_{i}", tasks=[0]) for i in range(len(delayed))]
    log_dir = Path.cwd() / os.path.expanduser(spec.log_dir)
    for job, path in zip(jobs, pickles, strict=True):
        attach(job, log_dir, spec.effective_job_name)
        job.paths.move_temporary_file(path, "submitted_pickle")
    if isinstance(backend, _SlurmBackend) and len(jobs) == 1:
        _note_job(int(first.job_id), log_dir, spec.effective_job_name)
    return jobs


def _note_job(job_id: int, log_dir: Path, name: str) -> None:
    """Add a SLURM job to this user's job list, as ``hpclaunch sbatch`` does (an
    array's tasks get their own SLURM ids only when they start, so they are not)."""
    from hpclaunch.jobdir.layout import JobFolder
    from hpclaunch.ops import registry

    job_dir = JobFolder.of(log_dir, job_id).root
    problem = registry.note(os.environ, job_id, job_dir, name, Path.cwd())
    if problem is not None:
        warnings.warn(problem, stacklevel=3)


class Executor:
    """Submit Python calls as hpclaunch jobs, with submitit's interface.

    ``folder`` holds the pickles, results and (unless ``log_dir`` is given) the
    logs; it must be shared by this machine and every node. ``cluster`` is
    ``"slurm"`` (the default) or ``"local"`` (one node on this machine, no
    SLURM). ``profile`` names a profile as ``--profile`` does. The parameters
    are the profile keys (``nodes``, ``nproc_per_node``, ``gpus_per_node``,
    ``time``, ``partition``, ``checkpoint_dir``, ``max_requeues``, ...), also
    accepted later by ``update_parameters``.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        cluster: str = "slurm",
        profile: str | None = None,
        **params: Any,
    ) -> None:
        if not isinstance(folder, (str, os.PathLike)) or isinstance(os.fspath(folder), bytes):
            raise ExecutorError(
                f"folder {folder!r} (from hpclaunch.Executor) is not a path; give a str or "
                "a pathlib.Path"
            )
        try:
            folder = parameters.executor_folder(os.fspath(folder))
        except parameters.ParameterError as exc:
            raise ExecutorError(exc.message) from None
        if cluster not in parameters.CLUSTERS:
            raise ExecutorError(
                f"cluster {cluster!r} (from hpclaunch.Executor) is not one of "
                f"{', '.join(map(repr, parameters.CLUSTERS))}"
            )
        if cluster == "slurm" and shutil.which("sbatch") is None:
            raise ExecutorError(
                "cluster='slurm' (from hpclaunch.Executor), but there is no sbatch on PATH; "
                "run on a SLURM login node, or pass cluster='local' to run on this machine"
            )
        self.folder = Path(folder).expanduser().absolute()
        self.cluster = cluster
        self._profile = load_profile(profile, Path.cwd(), os.environ)
        self._params = parameters.convert(params)
        self.spec  # noqa: B018  (validates now: bad parameters fail here, not at submit)
        self._backend: _SlurmBackend | _LocalBackend
        backend = _SlurmBackend if cluster == "slurm" else _LocalBackend
        try:  # submitit makes the folder now
            self._backend = backend(self.folder, lambda: self.spec)
        except OSError as exc:
            raise ExecutorError(
                f"folder {str(self.folder)!r} (from hpclaunch.Executor) cannot be created: "
                f"{exc.strerror or exc}; give a folder this user can write, on a filesystem "
                "the nodes share"
            ) from None
        self._backend.parallelism = self._params.array_parallelism

    @property
    def spec(self) -> JobSpec:
        """The JobSpec a submission gets now. Raises SpecError naming the parameter."""
        bin_dir = Path(sys.executable).parent
        path = None
        if (bin_dir / "hpclaunch").exists():
            path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        spec = parameters.job_spec(self.folder, self._params, self._profile, path)
        if self.cluster == "local":
            parameters.local_conflicts(spec, self._params)
        return spec

    def update_parameters(self, **params: Any) -> None:
        """Change parameters for the next submissions; nothing changes if one is invalid."""
        before = self._params
        self._params = parameters.convert(params, before)
        try:
            self.spec  # noqa: B018
        except HpclaunchError:
            self._params = before
            raise
        self._backend.parallelism = self._params.array_parallelism

    def script(self) -> str:
        """The sbatch script a ``submit`` would send now (nothing is submitted)."""
        return render(self.spec)

    def submit(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> AnyJob[R]:
        """Run ``fn(*args, **kwargs)`` on every worker rank; ``job.result()`` is rank 0's."""
        return cast("AnyJob[R]", self._backend.submit(fn, *args, **kwargs))

    def submit_script(self, path: str | os.PathLike[str], args: Iterable[str] = ()) -> AnyJob[None]:
        """Run the Python script ``path`` with ``args`` on every worker rank."""
        if isinstance(args, (str, bytes)):
            raise ExecutorError(
                f"args {args!r} (from submit_script) is one string; give a list of "
                f"arguments, e.g. {args.split() if isinstance(args, str) else [args]!r}"
            )
        script = Path(path).expanduser().absolute()
        if not script.is_file():
            raise ExecutorError(
                f"script {os.fspath(path)!r} (from submit_script) is not a file; "
                "give the path of a Python script"
            )
        return self.submit(run_script, str(script), [str(arg) for arg in args])

    def map_array(self, fn: Callable[..., R], *iterables: Iterable[Any]) -> list[AnyJob[R]]:
        """One job per element (a SLURM job array; at most ``array_parallelism`` run
        at once), each on ``nodes`` nodes."""
        return cast("list[AnyJob[R]]", self._backend.map_array(fn, *iterables))
