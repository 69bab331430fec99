"""The sbatch options that JobSpec fields own: given through ``--sbatch-option`` (or a
profile's ``sbatch_options``, or the Executor's ``slurm_KEY``) they would silently
contradict the rendered directives, so they are refused with what to use instead."""

from __future__ import annotations

from collections.abc import Mapping

_ONE_AGENT = (
    "it runs one agent task per node; use --nproc-per-node for each node's workers "
    "and --nodes for the node count"
)
_GPUS = "it asks for GPUs per node; use --gpus-per-node G (one worker per GPU) instead"
_LOG = "the batch log is LOG_DIR/NAME-JOBID.out; use --log-dir instead"
_CHDIR = "the job starts in the submit folder; use a --setup line with cd instead"
# Not here: ``array``, which the Executor's map_array sets; the CLI refuses it
# (hpclaunch.cli.sbatch), since its list, status and logs see one job per id.


def _use(option: str) -> str:
    return f"use {option} instead"


# sbatch option (long or short name) -> what to do instead, a clause that completes
# "'KEY' is set by hpclaunch itself; ...".
MANAGED_SBATCH_OPTIONS: Mapping[str, str] = {
    "nodes": _use("--nodes"),
    "N": _use("--nodes"),
    "ntasks-per-node": _ONE_AGENT,
    "ntasks": _ONE_AGENT,
    "n": _ONE_AGENT,
    "gpus-per-node": _use("--gpus-per-node"),
    "gpus": _GPUS,
    "G": _GPUS,
    "gpus-per-task": _GPUS,
    "gres": _use("--gpus-per-node (and gpu_directive = 'gres' in a profile)"),
    "time": _use("--time"),
    "t": _use("--time"),
    "partition": _use("--partition"),
    "p": _use("--partition"),
    "account": _use("--account"),
    "A": _use("--account"),
    "qos": _use("--qos"),
    "q": _use("--qos"),
    "constraint": _use("--constraint"),
    "C": _use("--constraint"),
    "exclude": _use("--exclude"),
    "x": _use("--exclude"),
    "mem": _use("--mem"),
    "cpus-per-task": _use("--cpus-per-task"),
    "c": _use("--cpus-per-task"),
    "job-name": _use("--job-name"),
    "J": _use("--job-name"),
    "output": _LOG,
    "o": _LOG,
    "error": _LOG,
    "e": _LOG,
    "open-mode": "it appends, so that a requeued job keeps one log; leave it out",
    "requeue": "every job is requeueable; leave it out",
    "no-requeue": _use("--max-requeues 0"),
    "signal": _use("--signal-lead"),
    "chdir": _CHDIR,
    "D": _CHDIR,
}
