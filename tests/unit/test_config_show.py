"""`hpclaunch config show` and `hpclaunch init`: each value's source comes from the
resolution `sbatch` runs, and the profile `init` writes loads through the real loader."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from hpclaunch.cli import CliContext, main
from hpclaunch.job.profiles import (
    PROFILE_KEYS,
    Entry,
    build_spec,
    convert_profile,
    load_profile,
)
from hpclaunch.job.profiles import resolve as resolve_spec
from hpclaunch.ops import profile_file
from hpclaunch.slurm.commands import FakeRunner, Slurm

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

PROFILE = """
[profiles.default]
partition = "gpu"
gpus_per_node = 4
env = { NCCL_DEBUG = "WARN" }
setup = "module load cuda"

[profiles.small]
nodes = 2
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "hpclaunch.toml").write_text(PROFILE)
    return tmp_path


def invoke(project: Path, args: list[str], **env: str) -> Result:
    obj = CliContext(
        slurm=Slurm(FakeRunner({})), cwd=project, env={"HOME": str(project / "home"), **env}
    )
    return CliRunner().invoke(main, args, obj=obj)


def shown(project: Path, *args: str, **env: str) -> dict[str, Any]:
    result = invoke(project, ["config", "show", "--json", *args], **env)
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def test_each_value_names_its_source(project: Path) -> None:
    out = shown(project, "--time", "30", "--env", "A=1", "train.py")
    toml = project / "hpclaunch.toml"
    assert out["profile"] == {"name": "default", "path": str(toml)}
    got = out["settings"]
    source = f"{toml}, profile 'default', key 'partition'"
    assert got["partition"] == {"value": "gpu", "from": "profile", "source": source}
    assert got["time"] == {"value": "0-00:30:00", "from": "flag", "source": "--time"}
    assert got["env"]["value"] == {"NCCL_DEBUG": "WARN", "A": "1"}
    assert got["env"]["from"] == "profile and flag"
    assert got["env"]["source"].endswith("key 'env' and --env")
    assert got["max_restarts"] == {"value": 3, "from": "default", "source": "default"}
    # derived defaults say who decides
    assert got["nproc_per_node"]["value"] == 4
    assert got["nproc_per_node"]["source"] == "default: GPUs per node, or 1"
    assert got["job_name"]["value"] == "train"
    assert got["account"] == {
        "value": None,
        "from": "default",
        "source": "default: your default SLURM account",
    }
    assert "etcd_endpoint" not in got  # only under rdzv etcd


def test_a_flag_replaces_the_profile_and_other_profiles_are_not_read(project: Path) -> None:
    got = shown(project, "--profile", "small", "--partition", "debug")["settings"]
    assert got["partition"]["source"] == "--partition"
    assert got["nodes"]["from"] == "profile"
    assert got["gpus_per_node"]["from"] == "default"  # [profiles.default] is not merged in


def test_slurm_environment_overrides_are_shown_and_warned(project: Path) -> None:
    result = invoke(project, ["config", "show"], SBATCH_PARTITION="debug", SBATCH_GRES="gpu:1")
    assert result.exit_code == 0, result.output
    line = next(x for x in result.stdout.splitlines() if x.startswith("partition "))
    assert "debug" in line and "$SBATCH_PARTITION" in line
    assert "(instead of gpu: " in result.stdout
    assert "warning: $SBATCH_PARTITION=debug is set, so sbatch uses it instead of gpu" in (
        result.stderr
    )
    assert "$SBATCH_GRES=gpu:1 is set" in result.stderr
    got = shown(project, SBATCH_PARTITION="debug")["settings"]["partition"]
    assert got["from"] == "environment"
    assert got["overrides"]["value"] == "gpu"


def test_errors_are_sbatchs_own(project: Path) -> None:
    for args in (["--profile", "nope"], ["--nodes", "2:3", "--rdzv", "static"], ["missing.py"]):
        show = invoke(project, ["config", "show", *args])
        sbatch = invoke(project, ["sbatch", "--dry-run", *args, *(["x.py"] * (len(args) != 1))])
        assert show.exit_code == 2, show.output
        assert show.stderr.splitlines()[0].startswith("Error: ")
        if args[0] != "missing.py":
            assert show.stderr == sbatch.stderr


def test_config_show_and_sbatch_agree_on_the_rendered_script(project: Path) -> None:
    args = ["--nodes", "3", "--time", "2:00:00", "--sbatch-option", "mail-type=END"]
    got = shown(project, *args, "train.py")["settings"]
    script = invoke(project, ["sbatch", "--dry-run", *args, "train.py"]).stdout
    assert f"#SBATCH --partition={got['partition']['value']}\n" in script
    assert f"#SBATCH --time={got['time']['value']}\n" in script
    assert f"#SBATCH --nodes={got['nodes']['value']}\n" in script
    assert f"#SBATCH --gpus-per-node={got['gpus_per_node']['value']}\n" in script
    assert "#SBATCH --mail-type=END\n" in script
    assert got["sbatch_options"]["source"] == "--sbatch-option"


def test_resolve_tracks_merged_and_replaced_values(project: Path) -> None:
    profile = load_profile(None, project, {"HOME": str(project)})
    done = resolve_spec(Entry("train.py"), {"setup": ("nvidia-smi",), "partition": "x"}, profile)
    assert done.spec == build_spec(
        Entry("train.py"), {"setup": ("nvidia-smi",), "partition": "x"}, profile
    )
    assert done.origins["setup"].flag == "--setup"
    assert done.origins["setup"].profile is not None
    assert done.origins["partition"].profile is None  # replaced, not merged
    assert "nodes" not in done.origins


# -- init -------------------------------------------------------------------------------

_LINE = re.compile(r"# ([a-z_]+) = (.*?)(    # an example)?\n")


def test_init_writes_every_key_and_refuses_to_overwrite(tmp_path: Path) -> None:
    result = invoke(tmp_path, ["init"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "hpclaunch.toml"
    assert f"wrote {path}" in result.stdout
    keys = [m.group(1) for m in _LINE.finditer(path.read_text())]
    assert keys == list(PROFILE_KEYS)  # every key the loader accepts, in its order
    again = invoke(tmp_path, ["init"])
    assert again.exit_code == 2
    assert "exists; give --force" in again.stderr
    path.write_text("mine")
    assert invoke(tmp_path, ["init", "--force"]).exit_code == 0
    assert path.read_text() != "mine"


def test_the_written_profile_gives_the_defaults(tmp_path: Path) -> None:
    assert invoke(tmp_path, ["init", "--profile", "site"]).exit_code == 0
    text = (tmp_path / "hpclaunch.toml").read_text()
    entry = Entry("train.py")
    default = build_spec(entry, {}, None)
    written = load_profile("site", tmp_path, {"HOME": str(tmp_path / "home")})
    assert written is not None and written.values == {}
    assert build_spec(entry, {}, written) == default
    # Uncommented, the default lines give the defaults; each example converts.
    defaults, examples = {}, {}
    for match in _LINE.finditer(text):
        key, value, example = match.groups()
        (examples if example else defaults)[key] = tomllib.loads(f"v = {value}")["v"]
    assert build_spec(entry, {}, convert_profile("p", tmp_path / "x", defaults)) == default
    for key, value in examples.items():
        convert_profile("p", tmp_path / "x", {key: value})
    assert set(defaults) | set(examples) == set(PROFILE_KEYS)
    assert {"partition", "time", "env"} <= set(examples)
    assert {"nodes", "max_restarts", "log_dir", "launcher"} <= set(defaults)


def test_init_refuses_a_profile_name_toml_cannot_hold(tmp_path: Path) -> None:
    result = invoke(tmp_path, ["init", "--profile", "a b"])
    assert result.exit_code == 2
    assert "profile name 'a b' (from --profile)" in result.stderr
    assert not (tmp_path / "hpclaunch.toml").exists()


def test_toml_values() -> None:
    assert profile_file.toml_value({"a-b": True, "c": "x"}) == '{ a-b = true, c = "x" }'
    assert profile_file.toml_value(["a", 1]) == '["a", 1]'
