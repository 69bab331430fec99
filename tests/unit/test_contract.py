"""The step contracts: what render writes into the script is what the commands on the
nodes parse back, through options generated from the same settings table."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import click
import pytest
from click.testing import CliRunner

from hpclaunch.cli.context import TYPES, settings_options
from hpclaunch.contract import rendezvous
from hpclaunch.contract.agent import AgentSettings, EntryKind
from hpclaunch.contract.rendezvous import EtcdRdzv, StaticRdzv
from hpclaunch.contract.supervisor import SupervisorSettings
from hpclaunch.contract.table import Number, Script, Setting, from_values, table, to_argv
from hpclaunch.contract.values import NodeRange
from hpclaunch.job.render import agent_settings, supervisor_settings
from hpclaunch.job.spec import JobSpec
from hpclaunch.rendezvous.backends import BACKENDS

T = TypeVar("T")


def parse(cls: type[T], argv: list[str], **fixed: Any) -> T:
    """``argv`` read by click options generated from ``cls``'s table, as the commands do."""
    got: dict[str, Any] = {}

    @click.command()
    @settings_options(cls)
    def command(values: Mapping[str, Any]) -> None:
        got.update(values)

    result = CliRunner().invoke(command, argv)
    assert result.exit_code == 0, result.output
    return from_values(cls, got, **fixed)


SPECS = [
    JobSpec("train.py", args=("--lr", "3e-4")),
    JobSpec("train.py", nodes=NodeRange(2, 8), gpus_per_node=8, node_multiple=4, max_restarts=0),
    JobSpec(
        "pkg.train",
        entry_kind=EntryKind.MODULE,
        rdzv=StaticRdzv(),
        nodes=NodeRange(4, 4),
        signal_lead_s=7,
    ),
    JobSpec("./run", entry_kind=EntryKind.EXECUTABLE, max_requeues=0, max_failure_requeues=9),
    JobSpec(
        "t.py",
        rdzv=EtcdRdzv(
            endpoints=("e1:2379", "[::1]:2379"),
            cacert="/etc/my ca.pem",
            cert="/c.pem",
            key="/k.pem",
            user="trainer; rm -rf ~",
            password_file="$HOME/pw",
        ),
        nodes=NodeRange(1, 3),
    ),
    JobSpec("t.py", rdzv=EtcdRdzv(sidecar=True, binary="/opt/etcd")),
]


@pytest.mark.parametrize("spec", SPECS)
def test_the_agent_reads_back_what_the_script_says(spec: JobSpec) -> None:
    sent = agent_settings(spec, supervised=True)
    assert parse(AgentSettings, sent.to_argv(), entrypoint=spec.entrypoint, args=spec.args) == sent
    assert sent.nnodes == spec.nodes and sent.supervised
    assert sent.grace_period_s == spec.agent_grace_s


@pytest.mark.parametrize("spec", SPECS)
def test_the_supervisor_reads_back_what_the_script_says(spec: JobSpec) -> None:
    sent = supervisor_settings(spec)
    assert parse(SupervisorSettings, sent.to_argv()) == sent
    assert (sent.max_requeues, sent.max_failure_requeues) == (
        spec.max_requeues,
        spec.max_failure_requeues,
    )
    assert sent.grace_period_s == spec.signal_lead_s


def test_defaults_are_the_specs() -> None:
    """One default per value: a command given nothing means what a default spec means."""
    spec = JobSpec("t.py")
    supervisor, sent_s = parse(SupervisorSettings, []), supervisor_settings(spec)
    assert (supervisor.max_requeues, supervisor.max_failure_requeues) == (
        sent_s.max_requeues,
        sent_s.max_failure_requeues,
    )
    agent = parse(AgentSettings, [], entrypoint="t.py")
    sent = agent_settings(spec)
    assert (agent.rdzv, agent.max_restarts, agent.node_multiple, agent.entry_kind) == (
        sent.rdzv,
        sent.max_restarts,
        sent.node_multiple,
        sent.entry_kind,
    )


def test_what_the_script_leaves_out() -> None:
    argv = agent_settings(JobSpec("t.py")).to_argv()
    assert argv == [
        "--nnodes",
        "1",
        "--nproc-per-node",
        "1",
        "--rdzv",
        "c10d",
        "--max-restarts",
        "3",
        "--grace-period",
        "90",
    ]
    never = [
        row.setting.option for row in table(AgentSettings) if row.setting.script is Script.NEVER
    ]
    assert never == [
        "--master-addr",
        "--rank-order",
        "--job-dir",
        "--tee",
        "--worker-start",
    ]
    given = AgentSettings("t.py", master_port=99, tee=False, job_dir=Path("/j"))
    assert not {"--no-tee", "--job-dir"} & set(given.to_argv())
    # A port given to sbatch (or a profile) reaches every agent; none given, none written.
    assert given.to_argv()[-2:] == ["--master-port", "99"]
    assert agent_settings(JobSpec("t.py", master_port=29400)).to_argv()[-2:] == [
        "--master-port",
        "29400",
    ]
    assert SupervisorSettings(job_dir=Path("/j")).to_argv() == [
        "--max-requeues",
        "3",
        "--grace-period",
        "90",
    ]


def test_numbers_are_written_as_typed() -> None:
    row = Setting("--grace-period", Number(float, min=0), "", Script.ALWAYS)
    assert row.argv(90.0, 30) == ["--grace-period", "90"]
    assert row.argv(0.25, 30) == ["--grace-period", "0.25"]
    assert parse(AgentSettings, ["--grace-period", "0.25"], entrypoint="t").shutdown_timeout_s == 1
    assert to_argv(SupervisorSettings(grace_period_s=2.5)) == [
        "--max-requeues",
        "3",
        "--grace-period",
        "2.5",
    ]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--nnodes", "2-4"], "for a range write 2:4"),
        (["--rdzv", "zk"], "'zk' is not one of 'static', 'c10d', 'etcd'"),
        (["--grace-period", "-1"], "-1.0 is not in the range x>=0"),
        (["--max-restarts", "x"], "'x' is not a valid integer"),
        (["-m", "--no-python"], "-m/--module and --no-python exclude each other"),
    ],
)
def test_bad_values_are_refused_by_the_one_parser(argv: list[str], needle: str) -> None:
    @click.command()
    @settings_options(AgentSettings)
    def command(values: Mapping[str, Any]) -> None:
        pass

    result = CliRunner().invoke(command, argv)
    assert result.exit_code == 2 and needle in result.output, result.output


def test_nodes_are_parsed_by_one_type_on_both_sides() -> None:
    from hpclaunch.cli.agent import agent
    from hpclaunch.cli.sbatch import sbatch

    def nodes_type(command: click.Command, name: str) -> object:
        return next(p.type for p in command.params if p.name == name)

    assert nodes_type(agent, "nnodes") is nodes_type(sbatch, "nodes") is TYPES["nodes"]


def test_every_rendezvous_has_a_backend_and_the_table_is_pure() -> None:
    assert set(BACKENDS) == set(rendezvous.BACKENDS)
    code = (
        "import sys, hpclaunch.rendezvous.backends, hpclaunch.node.launch_plan; "
        "print(sorted(m for m in ('torch', 'click') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
