"""Python API parameters → JobSpec: the same keys and converters as profiles."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from hpclaunch.contract.agent import EntryKind
from hpclaunch.contract.rendezvous import EtcdRdzv
from hpclaunch.contract.values import NodeRange
from hpclaunch.errors import SpecError
from hpclaunch.executor.local_settings import LocalSettings
from hpclaunch.executor.params import (
    WORKER_MODULE,
    ParameterError,
    convert,
    executor_folder,
    job_spec,
    local_conflicts,
)
from hpclaunch.job.profiles import Profile
from hpclaunch.job.render import render
from hpclaunch.jobdir.layout import ExecutorFolder

FOLDER = Path("/shared/runs/sweep 1")


def spec_of(profile: Profile | None = None, path: str | None = None, **params: object):  # type: ignore[no-untyped-def]
    return job_spec(FOLDER, convert(params), profile, path)


def test_profile_keys_are_the_parameters() -> None:
    spec = spec_of(
        nodes="2:4",
        nproc_per_node=4,
        gpus_per_node=4,
        time="04:00:00",
        partition="gpu",
        rdzv="etcd",
        etcd_sidecar=True,
        no_kill=True,
        env={"NCCL_DEBUG": "INFO"},
        sbatch_options={"reservation": "r1"},
    )
    assert spec.nodes == NodeRange(2, 4)
    assert spec.effective_nproc_per_node == 4 and spec.gpus_per_node == 4
    assert spec.time_limit == timedelta(hours=4)
    assert spec.partition == "gpu" and spec.rdzv == EtcdRdzv(sidecar=True)
    assert ("NCCL_DEBUG", "INFO") in spec.env
    assert ("reservation", "r1") in spec.sbatch_options


def test_max_failure_requeues_is_a_parameter() -> None:
    assert spec_of().max_failure_requeues == 2
    assert spec_of(max_failure_requeues=0).max_failure_requeues == 0
    assert spec_of(slurm_max_failure_requeues=5).max_failure_requeues == 5
    with pytest.raises(SpecError) as raised:
        spec_of(max_failure_requeues=-1)
    assert str(raised.value).startswith(
        "update_parameters(max_failure_requeues=...): -1 is below the minimum of 0"
    )
    with pytest.raises(ParameterError, match=r"max_failure_requeues='2'\): the value is not a"):
        convert({"max_failure_requeues": "2"})


def test_submitits_names_are_accepted_in_its_units() -> None:
    spec = spec_of(
        timeout_min=90.5,
        mem_gb=2,
        tasks_per_node=8,
        name="sweep",
        slurm_partition="debug",
        slurm_account="ml",
    )
    assert spec.time_limit == timedelta(minutes=91)  # SLURM counts whole minutes
    assert spec.mem == "2048M"
    assert spec.nproc_per_node == 8
    assert spec.job_name == "sweep" and spec.partition == "debug" and spec.account == "ml"


def test_submitits_max_num_timeout_is_the_requeue_budget() -> None:
    assert spec_of(slurm_max_num_timeout=7).max_requeues == 7
    assert spec_of(max_num_timeout=0).max_requeues == 0


@pytest.mark.parametrize(
    ("given", "folder"),
    [
        ("log", "log"),
        ("log/%j", "log"),
        ("runs/exp1/%j", "runs/exp1"),
        ("%j", "."),
        ("log/%A_%a", "log"),
    ],
)
def test_submitits_one_folder_per_job_is_the_folder(given: str, folder: str) -> None:
    assert executor_folder(given) == Path(folder)


@pytest.mark.parametrize("given", ["log_%j", "log/%j/out", "%x/%j"])
def test_another_pattern_in_the_folder_is_refused_with_the_mapping(given: str) -> None:
    with pytest.raises(SpecError, match="'log/%j' is taken as 'log'"):
        executor_folder(given)


def test_every_rank_runs_the_worker_module_on_the_folder() -> None:
    spec = spec_of()
    assert spec.entry_kind is EntryKind.MODULE
    assert (spec.entrypoint, spec.args) == (WORKER_MODULE, (str(FOLDER),))
    assert spec.log_dir == str(FOLDER)
    assert ("SUBMITIT_EXECUTOR", "slurm") in spec.env
    script = render(spec)
    assert f"--module -- \\\n    {WORKER_MODULE} '{FOLDER}'\n" in script  # quoted once
    assert "export SUBMITIT_EXECUTOR=slurm\n" in script


def test_a_log_dir_from_the_profile_or_the_parameters_wins() -> None:
    profile = Profile("default", Path("/p/hpclaunch.toml"), {"log_dir": "/logs"})
    assert spec_of(profile).log_dir == "/logs"
    assert spec_of(profile, log_dir="/mine").log_dir == "/mine"


def test_path_is_set_unless_the_user_sets_it() -> None:
    assert ("PATH", "/venv/bin:/usr/bin") in spec_of(path="/venv/bin:/usr/bin").env
    spec = spec_of(path="/venv/bin:/usr/bin", env={"PATH": "/opt/bin"})
    assert [v for k, v in spec.env if k == "PATH"] == ["/opt/bin"]


def test_later_parameters_merge_into_earlier_ones() -> None:
    first = convert({"nodes": 2, "partition": "a"})
    second = convert({"partition": "b", "array_parallelism": 3}, first)
    spec = job_spec(FOLDER, second, None)
    assert spec.nodes == NodeRange(2, 2) and spec.partition == "b"
    assert second.array_parallelism == 3 and first.fields["partition"] == "a"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"nodez": 2}, "unknown parameter 'nodez'; did you mean 'nodes'?"),
        ({"nodes": 2.5}, "update_parameters(nodes=2.5): the value is not a number or a string"),
        ({"nodes": "4-8"}, "update_parameters(nodes=...): '4-8'"),
        ({"time": "soon"}, "update_parameters(time=...)"),
        ({"timeout_min": "60"}, "update_parameters(timeout_min='60'): give a positive number"),
        ({"timeout_min": -5}, "update_parameters(timeout_min=-5): give a positive number"),
        ({"mem_gb": 0}, "update_parameters(mem_gb=0): give a positive number"),
        ({"array_parallelism": 0}, "update_parameters(array_parallelism=0): give a whole number"),
        ({"rdzv": "zookeeper"}, "the value is not one of 'static', 'c10d', 'etcd'"),
    ],
)
def test_a_bad_parameter_is_named_with_its_fix(params: dict[str, object], message: str) -> None:
    with pytest.raises(ParameterError) as raised:
        convert(params)
    assert message in str(raised.value)


def test_a_rule_between_values_names_the_parameters_as_typed() -> None:
    with pytest.raises(SpecError) as raised:
        spec_of(tasks_per_node=0)
    assert str(raised.value).startswith("update_parameters(tasks_per_node=...): 0 is below")
    with pytest.raises(SpecError) as raised:
        spec_of(rdzv="static", nodes="2:4")
    assert str(raised.value).startswith(
        "update_parameters(rdzv=...) and update_parameters(nodes=...): static rendezvous"
    )


def test_the_array_option_belongs_to_map_array() -> None:
    with pytest.raises(ParameterError, match="use map_array"):
        spec_of(sbatch_options={"array": "0-9"})


def test_a_tiny_memory_rounds_up_to_slurms_smallest_unit() -> None:
    assert spec_of(mem_gb=0.0001).mem == "1M"
    assert spec_of(mem_gb=1.5).mem == "1536M"


def test_a_short_time_limit_gets_its_warning_half_way() -> None:
    assert spec_of(timeout_min=2).signal_lead_s == 60
    assert spec_of(timeout_min=1).signal_lead_s == 30
    assert spec_of(timeout_min=60).signal_lead_s == 120  # the default lead fits
    profile = Profile("default", Path("/p/hpclaunch.toml"), {"time_limit": timedelta(minutes=1)})
    assert spec_of(profile).signal_lead_s == 30
    with pytest.raises(SpecError, match="signal_lead"):  # one the user set is checked
        spec_of(timeout_min=1, signal_lead=90)


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"nodes": 2}, "update_parameters(nodes=...): cluster='local' runs one node, not 2"),
        ({"slurm_nodes": "1:3"}, "update_parameters(slurm_nodes=...): cluster='local'"),
        ({"rdzv": "etcd", "etcd_sidecar": True}, "update_parameters(rdzv=...): cluster='local'"),
    ],
)
def test_local_refuses_what_one_machine_cannot_do(params: dict[str, object], named: str) -> None:
    converted = convert(params)
    with pytest.raises(ParameterError) as raised:
        local_conflicts(job_spec(FOLDER, converted, None), converted)
    assert str(raised.value).startswith(named)


def test_local_keeps_scheduling_settings_unused() -> None:
    converted = convert({"partition": "gpu", "mem_gb": 4, "nproc_per_node": 2})
    local_conflicts(job_spec(FOLDER, converted, None), converted)  # no error


def test_local_settings_carry_what_one_node_uses() -> None:
    spec = spec_of(
        nproc_per_node=3,
        max_restarts=2,
        max_requeues=9,
        log_dir="logs",
        checkpoint_dir="~/ckpt",
        env={"SEED": "7"},
        path="/venv/bin:/usr/bin",
    )
    settings = LocalSettings.of(spec, Path("/home/u/project"))
    assert (settings.nproc_per_node, settings.max_restarts) == (3, 2)
    assert settings.max_requeues == 5  # submitit's controller runs a task 6 times at most
    assert settings.log_dir == "/home/u/project/logs"
    assert settings.checkpoint_dir is not None and settings.checkpoint_dir.endswith("/ckpt")
    assert not settings.checkpoint_dir.startswith("/home/u/project")  # ~ is expanded
    assert settings.env == {"SEED": "7", "PATH": "/venv/bin:/usr/bin"}  # not SUBMITIT_EXECUTOR


def test_every_node_names_a_run_alike() -> None:
    node_a = {
        "HPCLAUNCH_REQUEUE_COUNT": "1",
        "SLURM_STEP_ID": "0",
        "HPCLAUNCH_ATTEMPT": "2",
        "TORCHELASTIC_RESTART_COUNT": "1",
    }
    node_b = {**node_a, "TORCHELASTIC_RESTART_COUNT": "0"}  # per agent: differs
    finished_dir = ExecutorFolder(FOLDER).finished
    assert finished_dir("7", node_a) == finished_dir("7", node_b)
    assert finished_dir("7", node_a).name == "1-0-2"
    later = {**node_a, "HPCLAUNCH_ATTEMPT": "3"}
    assert finished_dir("7", later) != finished_dir("7", node_a)
