"""Profiles: file lookup, precedence, merging, and errors that name file and key."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from hpclaunch.contract.rendezvous import C10dRdzv, EtcdRdzv
from hpclaunch.contract.values import NodeRange
from hpclaunch.errors import ConfigError, SpecError
from hpclaunch.job.profiles import Entry, build_spec, load_profile
from hpclaunch.job.spec import GpuDirective

ENTRY = Entry("train.py", ("--lr", "3e-4"))


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    cwd = tmp_path / "project"
    cwd.mkdir()
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    return cwd, env


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_profile_values_are_converted(dirs: tuple[Path, dict[str, str]]) -> None:
    cwd, env = dirs
    write(
        cwd / "hpclaunch.toml",
        """
        [profiles.big]
        nodes = "2:8"
        gpus_per_node = 8
        time = "1-00:00:00"
        mem = "0"
        rdzv = "c10d"
        gpu_directive = "gres"
        setup = ["module load cuda/12.4", "source ~/venv/bin/activate"]
        env = { NCCL_DEBUG = "INFO", OMP_NUM_THREADS = 4 }
        sbatch_options = { exclusive = true, mail-type = "END" }
        launcher = "hpclaunch"
        template = "tmpl/job.sh.j2"
        """.replace("        ", ""),
    )
    profile = load_profile("big", cwd, env)
    assert profile is not None
    job = build_spec(ENTRY, {}, profile)
    assert job.nodes == NodeRange(2, 8)
    assert job.time_limit == timedelta(days=1)
    assert job.gpu_directive is GpuDirective.GRES
    assert job.env == (("NCCL_DEBUG", "INFO"), ("OMP_NUM_THREADS", "4"))
    assert job.sbatch_options == (("exclusive", None), ("mail-type", "END"))
    assert job.setup == ("module load cuda/12.4", "source ~/venv/bin/activate")
    assert job.launcher == ("hpclaunch",)
    assert job.template == str(cwd / "tmpl" / "job.sh.j2")  # relative to the profile file
    assert job.rdzv == C10dRdzv()


def test_precedence_flags_over_profile_over_defaults(dirs: tuple[Path, dict[str, str]]) -> None:
    cwd, env = dirs
    write(
        cwd / "hpclaunch.toml",
        '[profiles.p]\nnodes = 4\npartition = "gpu"\nsetup = ["a"]\n'
        'env = { A = "profile", B = "profile" }\n',
    )
    flags = {
        "nodes": NodeRange(2, 2),
        "env": (("B", "flag"), ("C", "flag")),
        "setup": ("b",),
        "qos": None,
    }
    job = build_spec(ENTRY, flags, load_profile("p", cwd, env))
    assert job.nodes == NodeRange(2, 2)  # flag wins
    assert job.partition == "gpu"  # from the profile
    assert job.qos is None and job.max_restarts == 3  # defaults
    assert dict(job.env) == {"A": "profile", "B": "flag", "C": "flag"}
    assert job.setup == ("a", "b")


def test_project_file_wins_over_user_file(dirs: tuple[Path, dict[str, str]]) -> None:
    cwd, env = dirs
    write(
        Path(env["XDG_CONFIG_HOME"]) / "hpclaunch" / "config.toml",
        '[profiles.p]\npartition = "user"\n[profiles.only_user]\nqos = "high"\n',
    )
    write(cwd / "hpclaunch.toml", '[profiles.p]\npartition = "project"\n')
    assert build_spec(ENTRY, {}, load_profile("p", cwd, env)).partition == "project"
    assert build_spec(ENTRY, {}, load_profile("only_user", cwd, env)).qos == "high"


def test_user_file_defaults_to_dot_config(tmp_path: Path) -> None:
    write(
        tmp_path / "home" / ".config" / "hpclaunch" / "config.toml",
        '[profiles.p]\naccount = "acct"\n',
    )
    profile = load_profile("p", tmp_path, {"HOME": str(tmp_path / "home")})
    assert profile is not None and profile.values["account"] == "acct"


def test_default_profile_applies_without_flag(dirs: tuple[Path, dict[str, str]]) -> None:
    cwd, env = dirs
    assert load_profile(None, cwd, env) is None
    write(cwd / "hpclaunch.toml", '[profiles.default]\naccount = "team"\n')
    profile = load_profile(None, cwd, env)
    assert profile is not None and profile.name == "default"


def test_unknown_profile_lists_what_exists(dirs: tuple[Path, dict[str, str]]) -> None:
    cwd, env = dirs
    write(cwd / "hpclaunch.toml", "[profiles.gpu]\nnodes = 2\n")
    with pytest.raises(ConfigError) as info:
        load_profile("gpus", cwd, env)
    message = str(info.value)
    assert "unknown profile 'gpus'" in message
    assert "gpu (" in message and str(cwd / "hpclaunch.toml") in message


def test_unknown_key_names_file_profile_and_closest_key(dirs: tuple[Path, dict[str, str]]) -> None:
    cwd, env = dirs
    path = write(cwd / "hpclaunch.toml", "[profiles.p]\ngpus-per-node = 8\n")
    with pytest.raises(ConfigError) as info:
        load_profile("p", cwd, env)
    assert str(info.value) == (
        f"{path}, profile 'p': unknown key 'gpus-per-node'; did you mean 'gpus_per_node'?"
    )


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("nodes = true", "key 'nodes': True is not a number or a string like '2:4'"),
        ('nodes = "4:2"', "key 'nodes': node range 4:2 has MIN > MAX"),
        ('rdzv = "zookeeper"', "is not one of 'static', 'c10d', 'etcd'"),
        ('gpus_per_node = "8"', "'8' is not a whole number"),
        ("setup = [1]", "not a string or a list of strings"),
        ("env = { A = [1] }", "not a table of NAME = VALUE"),
        ('time = "4h"', "not a SLURM time limit"),
        ('max_failure_requeues = "2"', "key 'max_failure_requeues': '2' is not a whole number"),
    ],
)
def test_bad_values_name_the_key(dirs: tuple[Path, dict[str, str]], body: str, needle: str) -> None:
    cwd, env = dirs
    write(cwd / "hpclaunch.toml", f"[profiles.p]\n{body}\n")
    with pytest.raises(ConfigError, match="profile 'p'") as info:
        load_profile("p", cwd, env)
    assert needle in str(info.value)


def test_broken_toml_and_stray_keys(dirs: tuple[Path, dict[str, str]]) -> None:
    cwd, env = dirs
    path = write(cwd / "hpclaunch.toml", "[profiles.p\n")
    with pytest.raises(ConfigError, match="is not valid TOML") as info:
        load_profile("p", cwd, env)
    assert str(path) in str(info.value)
    write(cwd / "hpclaunch.toml", "nodes = 2\n")
    with pytest.raises(ConfigError, match="top-level key 'nodes'"):
        load_profile("p", cwd, env)


def test_spec_errors_say_where_the_value_came_from(dirs: tuple[Path, dict[str, str]]) -> None:
    cwd, env = dirs
    path = write(cwd / "hpclaunch.toml", "[profiles.p]\ngpus_per_node = -2\n")
    with pytest.raises(SpecError) as info:
        build_spec(ENTRY, {}, load_profile("p", cwd, env))
    assert str(info.value).startswith(f"{path}, profile 'p', key 'gpus_per_node': -2 is below")
    with pytest.raises(SpecError) as info:
        build_spec(ENTRY, {"max_requeues": -1}, None)
    assert str(info.value).startswith("--max-requeues: -1 is below the minimum of 0")
    with pytest.raises(
        SpecError, match=r"^--rdzv and --nodes: static rendezvous needs a fixed node count"
    ):
        build_spec(ENTRY, {"rdzv": "static", "nodes": NodeRange(1, 2)}, None)


def test_launcher_string_is_split_like_a_shell(dirs: tuple[Path, dict[str, str]]) -> None:
    cwd, env = dirs
    write(
        cwd / "hpclaunch.toml",
        "[profiles.p]\nlauncher = \"apptainer exec '/img/my image.sif' hpclaunch\"\n",
    )
    job = build_spec(ENTRY, {}, load_profile("p", cwd, env))
    assert job.launcher == ("apptainer", "exec", "/img/my image.sif", "hpclaunch")


def test_flat_rendezvous_keys_nest_into_the_spec(dirs: tuple[Path, dict[str, str]]) -> None:
    cwd, env = dirs
    write(
        cwd / "hpclaunch.toml",
        '[profiles.p]\nrdzv = "etcd"\netcd_endpoint = ["e1:2379", "e2:2379"]\n'
        'etcd_user = "trainer"\nmax_failure_requeues = 5\n',
    )
    job = build_spec(ENTRY, {"etcd_password_file": "/pw"}, load_profile("p", cwd, env))
    assert job.rdzv == EtcdRdzv(
        endpoints=("e1:2379", "e2:2379"), user="trainer", password_file="/pw"
    )
    assert job.max_failure_requeues == 5
    assert build_spec(ENTRY, {"max_failure_requeues": 0}, None).max_failure_requeues == 0
    with pytest.raises(SpecError) as info:
        build_spec(ENTRY, {"max_failure_requeues": -1}, None)
    assert str(info.value).startswith("--max-failure-requeues: -1 is below the minimum of 0")
    # A flag's backend wins over the profile's, and then the profile's etcd keys are an error
    # that names each of them where it came from.
    with pytest.raises(SpecError) as info:
        build_spec(ENTRY, {"rdzv": "c10d"}, load_profile("p", cwd, env))
    path = cwd / "hpclaunch.toml"
    assert str(info.value) == (
        f"--rdzv and {path}, profile 'p', key 'etcd_endpoint' and {path}, profile 'p', key "
        "'etcd_user': etcd settings are given but --rdzv is c10d; add --rdzv etcd"
    )
    with pytest.raises(SpecError) as info:
        build_spec(ENTRY, {"etcd_sidecar": True}, None)
    assert str(info.value) == (
        "--etcd-sidecar and the default --rdzv: etcd settings are given but --rdzv is c10d; "
        "add --rdzv etcd"
    )
    with pytest.raises(SpecError) as info:
        build_spec(ENTRY, {"rdzv": "etcd", "etcd_endpoint": ("h:70000",)}, None)
    assert str(info.value).startswith("--etcd-endpoint: 'h:70000' is not host:port")


def test_the_etcd_outage_timeout_comes_from_a_profile(dirs: tuple[Path, dict[str, str]]) -> None:
    cwd, env = dirs
    write(
        cwd / "hpclaunch.toml",
        '[profiles.p]\nrdzv = "etcd"\netcd_endpoint = ["e1:2379"]\netcd_outage_timeout = 45\n',
    )
    job = build_spec(ENTRY, {}, load_profile("p", cwd, env))
    assert job.rdzv == EtcdRdzv(endpoints=("e1:2379",), outage_timeout=45)
    assert job.etcd_outage_timeout == 45
    assert (
        build_spec(ENTRY, {"rdzv": "etcd", "etcd_endpoint": ("e:1",)}, None).etcd_outage_timeout
        is None
    )
