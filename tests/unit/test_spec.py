"""JobSpec validation and the value parsers, on plain strings and values."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from hpclaunch.contract import rendezvous
from hpclaunch.contract.agent import EntryKind
from hpclaunch.contract.rendezvous import C10dRdzv, EtcdRdzv, StaticRdzv
from hpclaunch.contract.supervisor import DEFAULT_MAX_FAILURE_REQUEUES
from hpclaunch.contract.values import NodeRange, parse_endpoints, parse_nodes
from hpclaunch.errors import SpecError
from hpclaunch.job.render import render
from hpclaunch.job.spec import JobSpec
from hpclaunch.job.values import (
    UNLIMITED,
    format_time,
    parse_env,
    parse_mem,
    parse_sbatch_option,
    parse_time,
)


@pytest.mark.parametrize(
    ("text", "expected", "sbatch"),
    [
        ("1", NodeRange(1, 1), "1"),
        ("32", NodeRange(32, 32), "32"),
        ("2:4", NodeRange(2, 4), "2-4"),
        (" 3:3 ", NodeRange(3, 3), "3"),
    ],
)
def test_parse_nodes(text: str, expected: NodeRange, sbatch: str) -> None:
    nodes = parse_nodes(text)
    assert nodes == expected
    assert nodes.sbatch == sbatch


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("0", "not positive"),
        ("-2", "not positive"),
        ("four", "not a node count"),
        ("", "not a node count"),
        ("4:2", "MIN > MAX; write it as 2:4"),
        ("2-4", "for a range write 2:4"),
        ("1:2:3", "not a node count"),
        ("0:4", "not positive"),
        ("²", "not a node count"),
        ("٣", "not a node count"),
    ],
)
def test_parse_nodes_rejects(text: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle) as info:
        parse_nodes(text)
    assert info.value.field == "nodes"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30", timedelta(minutes=30)),
        ("90", timedelta(minutes=90)),
        ("5:30", timedelta(minutes=5, seconds=30)),
        ("04:00:00", timedelta(hours=4)),
        ("1:02:03", timedelta(hours=1, minutes=2, seconds=3)),
        ("2-12", timedelta(days=2, hours=12)),
        ("1-2:30", timedelta(days=1, hours=2, minutes=30)),
        ("1-02:03:04", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ("UNLIMITED", UNLIMITED),
        ("infinite", UNLIMITED),
    ],
)
def test_parse_time_accepts_slurm_forms(text: str, expected: timedelta) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "abc", "1:2:3:4", "1-", "-5", "x-1", "1-2-3", "1h", "0", "0:00:00", "1.5", "²", "1-²"],
)
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_time(text)
    assert info.value.field == "time"
    assert repr(text) in info.value.message or "zero" in info.value.message


def test_parse_time_refuses_what_slurm_cannot_store() -> None:
    with pytest.raises(SpecError, match="longer than SLURM can store; use UNLIMITED"):
        parse_time("99999999999999999999")
    assert parse_time("365-00:00:00") == timedelta(days=365)


def test_format_time_round_trips() -> None:
    assert format_time(parse_time("1-02:03:04")) == "1-02:03:04"
    assert format_time(parse_time("90")) == "0-01:30:00"
    assert format_time(UNLIMITED) == "UNLIMITED"


@pytest.mark.parametrize(
    ("text", "expected"), [("64G", "64G"), ("500m", "500M"), ("0", "0"), ("1024", "1024")]
)
def test_parse_mem(text: str, expected: str) -> None:
    assert parse_mem(text) == expected


@pytest.mark.parametrize("text", ["64GB", "-1G", "lots", "1.5G", ""])
def test_parse_mem_rejects(text: str) -> None:
    with pytest.raises(SpecError, match="not a memory size"):
        parse_mem(text)


def test_parse_env_keeps_everything_after_the_first_equals() -> None:
    assert parse_env("A=b=c") == ("A", "b=c")
    assert parse_env("EMPTY=") == ("EMPTY", "")
    with pytest.raises(SpecError, match="has no '='"):
        parse_env("NOEQUALS")


def test_parse_sbatch_option_flag_and_value() -> None:
    assert parse_sbatch_option("exclusive") == ("exclusive", None)
    assert parse_sbatch_option("--mail-type=END,FAIL") == ("mail-type", "END,FAIL")


def test_parse_endpoints() -> None:
    assert parse_endpoints("a:1, b:2") == ("a:1", "b:2")
    with pytest.raises(SpecError):
        parse_endpoints(" , ")


def spec(**changes: object) -> JobSpec:
    return JobSpec("train.py").replace(**changes)


def test_defaults() -> None:
    job = JobSpec("train.py", args=("--lr", "3e-4"))
    assert job.nodes == NodeRange(1, 1)
    assert job.effective_nproc_per_node == 1
    assert job.effective_job_name == "train"
    assert job.rdzv == C10dRdzv() and str(job.rdzv) == "c10d"
    assert job.max_failure_requeues == DEFAULT_MAX_FAILURE_REQUEUES == 2
    assert job.signal_lead_s == 120
    assert job.log_dir == "hpclaunch-logs"


def test_nproc_defaults_to_gpus() -> None:
    assert spec(gpus_per_node=8).effective_nproc_per_node == 8
    assert spec(gpus_per_node=8, nproc_per_node=2).effective_nproc_per_node == 2


def test_job_name_from_module_and_executable() -> None:
    assert JobSpec("pkg.train", entry_kind=EntryKind.MODULE).effective_job_name == "pkg.train"
    assert (
        JobSpec("/opt/bin/run-me", entry_kind=EntryKind.EXECUTABLE).effective_job_name == "run-me"
    )
    assert JobSpec("dir/odd\nname.py").effective_job_name == "odd_name"


@pytest.mark.parametrize(
    ("changes", "field", "needle"),
    [
        ({"gpus_per_node": -1}, "gpus_per_node", "below the minimum of 0"),
        ({"nproc_per_node": 0}, "nproc_per_node", "below the minimum of 1"),
        ({"cpus_per_task": 0}, "cpus_per_task", "below the minimum of 1"),
        ({"max_restarts": -1}, "max_restarts", "below the minimum"),
        ({"signal_lead_s": 0}, "signal_lead", "below the minimum of 1"),
        ({"signal_lead_s": 70000}, "signal_lead", "maximum of 65535"),
        (
            {"signal_lead_s": 600, "time_limit": timedelta(minutes=10)},
            "signal_lead",
            "lower --signal",
        ),
        ({"job_name": "a\nb"}, "job_name", "line break"),
        ({"partition": ""}, "partition", "empty"),
        ({"log_dir": "logs\n"}, "log_dir", "one line"),
        ({"args": ("a\0b",)}, "args", "NUL"),
        ({"env": (("1BAD", "x"),)}, "env", "not a valid environment variable name"),
        ({"env": (("HPCLAUNCH_CHECKPOINT_DIR", "x"),)}, "env", "--checkpoint-dir"),
        ({"sbatch_options": (("nodes", "3"),)}, "sbatch_options", "use --nodes"),
        ({"sbatch_options": (("mail type", "x"),)}, "sbatch_options", "not an option name"),
        ({"sbatch_options": (("comment", "a\nb"),)}, "sbatch_options", "line break"),
        ({"rdzv": StaticRdzv(), "nodes": NodeRange(2, 4)}, "rdzv", "fixed node count"),
        ({"rdzv": "etcd"}, "rdzv", "not rendezvous settings; give StaticRdzv()"),
        ({"max_failure_requeues": -1}, "max_failure_requeues", "below the minimum of 0"),
        ({"no_kill": True}, "no_kill", "give a range MIN:MAX"),
        ({"node_multiple": 0}, "node_multiple", "below the minimum of 1"),
        ({"node_multiple": 4, "nodes": NodeRange(5, 7)}, "node_multiple", "no node count"),
        ({"node_multiple": 2, "rdzv": StaticRdzv()}, "node_multiple", "c10d or etcd, not static"),
        ({"master_port": 0}, "master_port", "below the minimum of 1"),
        ({"master_port": 65536}, "master_port", "above 65535; give a free TCP port"),
        ({"launcher": ()}, "launcher", "empty"),
        ({"srun_options": (("ntasks", "4"),)}, "srun_options", "leave it out"),
        ({"mem": "64GB"}, "mem", "not a memory size"),
    ],
)
def test_invalid_specs(changes: dict[str, object], field: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle) as info:
        spec(**changes)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("name", "given", "field", "needle"),
    [
        ("etcd", {}, "rdzv", "--rdzv etcd needs --etcd-endpoint HOST:PORT or --etcd-sidecar"),
        ("c10d", {"etcd_sidecar": True}, "rdzv", "etcd settings are given but --rdzv is c10d; add"),
        ("etcd", {"etcd_endpoint": ("h:99999",)}, "etcd_endpoint", "port from 1"),
        ("etcd", {"etcd_endpoint": ("h",)}, "etcd_endpoint", "not host:port"),
        ("etcd", {"etcd_endpoint": "h:1"}, "etcd_endpoint", "not a tuple"),
        (
            "etcd",
            {"etcd_endpoint": ("h:1",), "etcd_sidecar": True},
            "etcd_sidecar",
            "exclude each other",
        ),
        ("static", {"etcd_user": "u"}, "rdzv", "add --rdzv etcd"),
        (
            "etcd",
            {"etcd_endpoint": ("h:1",), "etcd_cert": "/c.pem"},
            "etcd_cert",
            "needs both --etcd-cert and --etcd-key",
        ),
        ("etcd", {"etcd_endpoint": ("h:1",), "etcd_key": "/k.pem"}, "etcd_key", "needs both"),
        (
            "etcd",
            {"etcd_endpoint": ("h:1",), "etcd_password_file": "/p"},
            "etcd_password_file",
            "needs --etcd-user",
        ),
        (
            "etcd",
            {"etcd_sidecar": True, "etcd_cacert": "/ca.pem"},
            "etcd_sidecar",
            "an etcd of your own",
        ),
        ("zookeeper", {}, "rdzv", "'zookeeper' is not one of 'static', 'c10d', 'etcd'"),
    ],
)
def test_invalid_rendezvous(name: str, given: dict[str, object], field: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle) as info:
        rendezvous.build(name, given)
    assert info.value.field == field


def test_rendezvous_settings_nest_by_backend() -> None:
    assert list(rendezvous.BACKENDS) == ["static", "c10d", "etcd"]
    assert rendezvous.choices() == "'static', 'c10d', 'etcd'"
    assert rendezvous.elastic_names() == "c10d or etcd"
    assert rendezvous.build("static", {}) == StaticRdzv()
    # Not given: None, False and () (what an unset flag holds).
    assert rendezvous.build("c10d", {"etcd_sidecar": False, "etcd_user": None}) == C10dRdzv()
    etcd = rendezvous.build(
        "etcd", {"etcd_endpoint": ("e1:2379", "[::1]:2379"), "etcd_user": "u", "etcd_key": None}
    )
    assert etcd == EtcdRdzv(endpoints=("e1:2379", "[::1]:2379"), user="u")
    # The agent ignores the settings of a backend it does not run, as it always has.
    assert rendezvous.build("c10d", {"etcd_user": "u"}, others=True) == C10dRdzv()
    with pytest.raises(SpecError) as info:
        rendezvous.build("c10d", {"etcd_user": "u", "etcd_endpoint": ("h:1",)})
    assert info.value.fields == ("rdzv", "etcd_endpoint", "etcd_user")  # profile keys


def test_flat_etcd_names_and_the_backend_name_stay_readable(tmp_path: Path) -> None:
    """Templates read spec.rdzv (printed), spec.rdzv.value and the flat etcd_* names."""
    template = tmp_path / "t.sh.j2"
    template.write_text(
        "{{ spec.rdzv }} {{ spec.rdzv.value }} {{ spec.etcd_endpoints|join(',') }}"
        " {{ spec.etcd_sidecar }}{% if spec.etcd_user %} {{ spec.etcd_user }}{% endif %}\n"
    )
    rendered = render(JobSpec("t.py", template=str(template), rdzv=EtcdRdzv(sidecar=True)))
    assert rendered == "etcd etcd '' true"  # trim_blocks takes the newline after endif
    assert render(JobSpec("t.py", template=str(template))) == "c10d c10d '' false"
    endpoints = EtcdRdzv(endpoints=("e1:1", "e2:2"), user="u")
    assert render(JobSpec("t.py", template=str(template), rdzv=endpoints)) == (
        "etcd etcd e1:1,e2:2 false u"
    )
    etcd = JobSpec("t.py", rdzv=EtcdRdzv(endpoints=("e1:2379",), binary="/opt/etcd"))
    assert (str(etcd.rdzv), etcd.rdzv.value) == ("etcd", "etcd")
    assert etcd.etcd_endpoints == ("e1:2379",) and etcd.etcd_binary == "/opt/etcd"
    assert etcd.etcd_sidecar is False and etcd.etcd_user is None
    plain = JobSpec("t.py")
    assert plain.etcd_endpoints == () and plain.etcd_sidecar is False
    assert plain.etcd_password_file is None
    with pytest.raises(AttributeError):
        plain.etcd_user = "u"  # type: ignore[misc]


def test_invalid_entrypoints() -> None:
    with pytest.raises(SpecError, match="no training script"):
        JobSpec("")
    with pytest.raises(SpecError, match="not a Python module name"):
        JobSpec("pkg/train.py", entry_kind=EntryKind.MODULE)


def test_spec_is_frozen() -> None:
    job = JobSpec("train.py")
    with pytest.raises(AttributeError):
        job.nodes = NodeRange(2, 2)  # type: ignore[misc]
