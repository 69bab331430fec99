"""Python API parameters → JobSpec: the same keys and converters as profiles."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from hpclaunch.config import Profile
from hpclaunch.errors import SpecError
from hpclaunch.executor.params import WORKER_MODULE, ParameterError, convert, job_spec
from hpclaunch.render import render
from hpclaunch.spec import EntryKind, Rendezvous
from hpclaunch.values import NodeRange

FOLDER = Path("/shared/runs/sweep 1")


def spec_of(profile: Profile | None = None, path: str | None = None, **params: object):  # type: ignore[no-untyped-def]
    return job_spec(FOLDER, convert(params), profile, path)


def test_profile_keys_are_the_parameters() -> None:
    spec = spec_of(nodes="2:4", nproc_per_node=4, gpus_per_node=4, time="04:00:00",
                   partition="gpu", rdzv="etcd", etcd_sidecar=True, no_kill=True,
                   env={"NCCL_DEBUG": "INFO"}, sbatch_options={"reservation": "r1"})  # fmt: skip
    assert spec.nodes == NodeRange(2, 4)
    assert spec.effective_nproc_per_node == 4 and spec.gpus_per_node == 4
    assert spec.time_limit == timedelta(hours=4)
    assert spec.partition == "gpu" and spec.rdzv is Rendezvous.ETCD and spec.etcd_sidecar
    assert ("NCCL_DEBUG", "INFO") in spec.env
    assert ("reservation", "r1") in spec.sbatch_options


def test_submitits_names_are_accepted_in_its_units() -> None:
    spec = spec_of(timeout_min=90.5, mem_gb=2, tasks_per_node=8, name="sweep",
                   slurm_partition="debug", slurm_account="ml")  # fmt: skip
    assert spec.time_limit == timedelta(minutes=91)  # SLURM counts whole minutes
    assert spec.mem == "2048M"
    assert spec.nproc_per_node == 8
    assert spec.job_name == "sweep" and spec.partition == "debug" and spec.account == "ml"


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
        ({"timeout_min": "60"}, "update_parameters(timeout_min='60'): give a number"),
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
