"""Rendering: directives, the launch line, quoting by default, user templates."""

from __future__ import annotations

import shlex
import stat
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

from hpclaunch.contract.agent import EntryKind
from hpclaunch.contract.rendezvous import EtcdRdzv
from hpclaunch.contract.values import NodeRange
from hpclaunch.errors import TemplateError
from hpclaunch.job.render import Shell, render, sbatch_quote, shell_quote, words
from hpclaunch.job.spec import GpuDirective, JobSpec


def sbatch_lines(script: str) -> list[str]:
    return [line[len("#SBATCH ") :] for line in script.splitlines() if line.startswith("#SBATCH ")]


def launch_words(script: str) -> list[str]:
    """The exec line (joined over its continuations) split as a shell would."""
    text = script[script.index("\nexec ") + 1 :].replace("\\\n", " ")
    return shlex.split(text.splitlines()[0])


def test_default_script_directives() -> None:
    job = JobSpec(
        "train.py",
        args=("--lr", "3e-4"),
        nodes=NodeRange(32, 32),
        gpus_per_node=8,
        time_limit=timedelta(hours=4),
        partition="gpu",
        account="proj",
        qos="high",
        constraint="a100&ib",
        exclude="n[1-3]",
        mem="0",
        cpus_per_task=64,
        sbatch_options=(("exclusive", None), ("mail-type", "END,FAIL")),
    )
    assert sbatch_lines(render(job)) == [
        "--job-name=train",
        "--nodes=32",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--cpus-per-task=64",
        "--mem=0",
        "--time=0-04:00:00",
        "--partition=gpu",
        "--account=proj",
        "--qos=high",
        '--constraint="a100&ib"',
        "--exclude=n[1-3]",
        "--requeue",
        "--open-mode=append",
        "--signal=B:USR1@120",
        "--output=hpclaunch-logs/%x-%j.out",
        "--exclusive",
        "--mail-type=END,FAIL",
    ]


def test_directives_come_before_any_command() -> None:
    # sbatch stops reading #SBATCH lines at the first command.
    lines = render(JobSpec("train.py", setup=("module load x",))).splitlines()
    last_directive = max(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    first_command = min(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert lines[0] == "#!/bin/bash"
    assert last_directive < first_command


def test_gres_directive_and_cpu_job() -> None:
    assert "--gres=gpu:4" in sbatch_lines(
        render(JobSpec("t.py", gpus_per_node=4, gpu_directive=GpuDirective.GRES))
    )
    cpu = sbatch_lines(render(JobSpec("t.py")))
    assert not [d for d in cpu if d.startswith(("--gpus", "--gres"))]


def test_launch_line_supervisor_srun_agent_training() -> None:
    job = JobSpec(
        "train.py",
        args=("--lr", "3e-4"),
        nodes=NodeRange(2, 4),
        gpus_per_node=8,
        max_restarts=5,
        max_requeues=2,
        cpus_per_task=16,
        srun_options=(("container-image", "nvcr.io#nvidia/pytorch:24.05-py3"),),
    )
    argv = launch_words(render(job))
    assert argv[:9] == [
        "exec",
        "hpclaunch",
        "supervise",
        "--max-requeues",
        "2",
        "--grace-period",
        "120",
        "--job-dir",
        "$HPCLAUNCH_JOB_DIR",
    ]
    srun = argv[argv.index("srun") : argv.index("agent") - 1]
    assert "--ntasks-per-node=1" in srun and "--kill-on-bad-exit=1" in srun
    assert "--cpus-per-task=16" in srun
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in srun
    agent = argv[argv.index("agent") :]
    assert agent == [
        "agent",
        "--nnodes",
        "2:4",
        "--nproc-per-node",
        "8",
        "--rdzv",
        "c10d",
        "--max-restarts",
        "5",
        "--grace-period",
        "90",
        "--supervised",
        "--",
        "train.py",
        "--lr",
        "3e-4",
    ]
    assert "#SBATCH --nodes=2-4" in render(job)
    assert "--max-failure-requeues" not in argv  # the supervisor's default is the spec's


def test_failure_requeues_reach_the_supervisor() -> None:
    argv = launch_words(render(JobSpec("t.py", max_failure_requeues=0)))
    supervise = argv[: argv.index("srun")]
    assert supervise[supervise.index("--max-failure-requeues") + 1] == "0"
    assert supervise[-3:] == ["--job-dir", "$HPCLAUNCH_JOB_DIR", "--"]


@pytest.mark.parametrize(
    ("kind", "flag"), [(EntryKind.MODULE, "--module"), (EntryKind.EXECUTABLE, "--no-python")]
)
def test_entry_kinds_reach_the_agent(kind: EntryKind, flag: str) -> None:
    argv = launch_words(
        render(JobSpec("pkg.train" if kind is EntryKind.MODULE else "./run", entry_kind=kind))
    )
    assert argv[len(argv) - argv[::-1].index("--") - 2] == flag


def test_etcd_settings_reach_the_agent() -> None:
    job = JobSpec("t.py", rdzv=EtcdRdzv(endpoints=("e1:2379", "e2:2379")))
    argv = launch_words(render(job))
    assert argv[argv.index("--etcd-endpoint") + 1] == "e1:2379,e2:2379"
    sidecar = launch_words(render(JobSpec("t.py", rdzv=EtcdRdzv(sidecar=True))))
    assert "--etcd-sidecar" in sidecar
    secured = JobSpec(
        "t.py",
        rdzv=EtcdRdzv(
            endpoints=("e1:2379",),
            cacert="/etc/my ca.pem",
            user="trainer; rm -rf ~",
            password_file="$HOME/pw",
        ),
    )
    text = render(secured)
    argv = launch_words(text)
    assert argv[argv.index("--etcd-cacert") + 1] == "/etc/my ca.pem"
    assert argv[argv.index("--etcd-user") + 1] == "trainer; rm -rf ~"  # a word, not shell
    assert argv[argv.index("--etcd-password-file") + 1] == "$HOME/pw"  # not expanded either
    assert "password" not in text.replace("--etcd-password-file", "")


def test_the_agent_line_keeps_the_order_scripts_had() -> None:
    """Options in the order earlier versions wrote them (scripts users kept and diff
    against): the counts, then --node-multiple, then etcd's; --supervised last."""
    job = JobSpec(
        "t.py",
        nodes=NodeRange(2, 4),
        node_multiple=2,
        rdzv=EtcdRdzv(endpoints=("e1:2379",), cacert="/ca.pem", user="u", password_file="/pw"),
    )
    line = next(line for line in render(job).splitlines() if "hpclaunch agent " in line)
    assert line.strip() == (
        "hpclaunch agent --nnodes 2:4 --nproc-per-node 1 --rdzv etcd --max-restarts 3 "
        "--grace-period 90 --node-multiple 2 --etcd-endpoint e1:2379 --etcd-cacert /ca.pem "
        "--etcd-user u --etcd-password-file /pw --supervised -- \\"
    )


def test_no_kill_keeps_the_job_and_the_step_on_a_lost_node() -> None:
    text = render(JobSpec("t.py", nodes=NodeRange(2, 3), rdzv=EtcdRdzv(sidecar=True), no_kill=True))
    assert "#SBATCH --no-kill\n" in text
    assert "#SBATCH --ntasks-per-node" not in text  # a range: SLURM gives as many as it can
    argv = launch_words(text)
    assert "--no-kill" in argv and "--kill-on-bad-exit=0" in argv
    assert "--no-kill" not in launch_words(render(JobSpec("t.py")))
    multiple = launch_words(render(JobSpec("t.py", nodes=NodeRange(2, 8), node_multiple=4)))
    assert multiple[multiple.index("--node-multiple") + 1] == "4"
    assert "--node-multiple" not in launch_words(render(JobSpec("t.py")))
    assert "--kill-on-bad-exit=1" in launch_words(render(JobSpec("t.py")))


def test_launcher_prefix_replaces_hpclaunch_on_the_nodes() -> None:
    job = JobSpec("t.py", launcher=("apptainer", "exec", "--nv", "/img/my image.sif", "hpclaunch"))
    argv = launch_words(render(job))
    i = argv.index("apptainer")
    assert argv[i : i + 6] == [
        "apptainer",
        "exec",
        "--nv",
        "/img/my image.sif",
        "hpclaunch",
        "agent",
    ]
    assert argv[1:3] == ["hpclaunch", "supervise"]  # the supervisor runs on the batch host


def test_paths_relative_to_submit_dir_and_absolute() -> None:
    rel = render(JobSpec("t.py", log_dir="logs dir", checkpoint_dir="ckpt"))
    assert 'export HPCLAUNCH_JOB_DIR="$SLURM_SUBMIT_DIR"/\'logs dir\'/"$SLURM_JOB_ID"' in rel
    assert 'export HPCLAUNCH_CHECKPOINT_DIR="$SLURM_SUBMIT_DIR"/ckpt' in rel
    assert '#SBATCH --output="logs dir/%x-%j.out"' in rel
    absolute = render(JobSpec("t.py", log_dir="/scratch/logs/", checkpoint_dir="/ckpt"))
    assert 'export HPCLAUNCH_JOB_DIR=/scratch/logs/"$SLURM_JOB_ID"' in absolute
    assert "#SBATCH --output=/scratch/logs/%x-%j.out" in absolute
    assert "export HPCLAUNCH_CHECKPOINT_DIR=/ckpt" in absolute
    default = render(JobSpec("t.py"))
    assert 'export HPCLAUNCH_CHECKPOINT_DIR="$HPCLAUNCH_JOB_DIR"/checkpoints' in default


@pytest.mark.parametrize(
    ("share", "mode"), [("", 0o700), ("0", 0o700), ("1", 0o750), (" Yes\n", 0o750)]
)
def test_the_job_folder_is_made_the_owners_under_any_umask(
    tmp_path: Path, share: str, mode: int
) -> None:
    """The script's own lines, from the exports to the job folder's mkdir, run by bash
    under umask 000: no folder it makes is ever writable by others, not even before
    the supervisor sets the job folder's mode."""
    script = render(JobSpec("t.py", log_dir="logs"))
    start = script.index("export HPCLAUNCH_JOB_DIR=")
    end = script.index('mkdir -p -- "$HPCLAUNCH_JOB_DIR")\n') + len(
        'mkdir -p -- "$HPCLAUNCH_JOB_DIR")'
    )
    subprocess.run(
        ["bash", "-c", f"umask 000\n{script[start:end]}"],
        env={
            "PATH": "/usr/bin:/bin",
            "SLURM_SUBMIT_DIR": str(tmp_path),
            "SLURM_JOB_ID": "5",
            "HPCLAUNCH_SHARE_WITH_GROUP": share,  # from the submitting environment
        },
        check=True,
    )
    for folder in (tmp_path / "logs", tmp_path / "logs" / "5"):
        assert stat.S_IMODE(folder.stat().st_mode) == mode


def test_env_and_setup() -> None:
    script = render(
        JobSpec("t.py", env=(("MSG", "a b $HOME"),), setup=("module load cuda && echo $PATH",))
    )
    assert "export MSG='a b $HOME'\n" in script
    assert "\nmodule load cuda && echo $PATH\n" in script  # deliberate shell, as written


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("plain-name_1.2", "plain-name_1.2"),
        ("with space", '"with space"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("it's", '"it\'s"'),
        ("a#b", '"a#b"'),
        ("$(x)", '"$(x)"'),
        ("naïve", '"naïve"'),
    ],
)
def test_sbatch_quote(value: str, quoted: str) -> None:
    assert sbatch_quote(value) == quoted


def test_words_quote_unless_shell() -> None:
    assert words("echo", Shell('"$HOME"'), ["a b", "c"]) == "echo \"$HOME\" 'a b' c"
    assert shell_quote("it's") == "'it'\"'\"'s'"


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_user_template_extends_builtin_and_quotes_by_default(tmp_path: Path) -> None:
    template = write(
        tmp_path / "mine.sh.j2",
        '{% extends "hpclaunch/sbatch.sh.j2" %}\n'
        "{% block setup %}\necho name {{ job_name }}\necho raw {{ 'x y' | shell }}\n"
        "echo joined {{ spec.args | shjoin }}\n{{ super() }}{% endblock %}\n",
    )
    job = JobSpec("t.py", args=("a b", "$c"), job_name="my job", template=template, setup=("true",))
    script = render(job)
    assert "echo name 'my job'\n" in script
    assert "echo raw x y\n" in script
    assert "echo joined 'a b' '$c'\n" in script
    assert "\ntrue\n" in script  # super() kept the built-in setup block
    assert "exec hpclaunch supervise" in script


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("{{ nonexistent }}", "undefined variable: 'nonexistent' is undefined"),
        ("{{ spec.no_such_field }}", "no_such_field"),
        ("{% if %}", "syntax error at"),
        ('{% extends "sbatch.sh.j2" %}', "built-in templates are named hpclaunch/NAME"),
        ("{{ spec.partition }}", "printed None"),
        ("ok\n{{ 1 / 0 }}", "bad.j2:2 failed: ZeroDivisionError"),
        ('{{ "%d" % "x" }}', "bad.j2:1 failed: TypeError"),
        ("{% for x in spec.nodes %}{% endfor %}", "failed: TypeError"),
        ("\n\n{{ nope }}", "bad.j2:3 uses an undefined variable"),
    ],
)
def test_bad_templates(tmp_path: Path, body: str, needle: str) -> None:
    template = write(tmp_path / "bad.j2", body + "\n")
    with pytest.raises(TemplateError) as info:
        render(JobSpec("t.py", template=template))
    assert needle in str(info.value)
    assert "bad.j2" in str(info.value)


def test_missing_template_file(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="is not a file"):
        render(JobSpec("t.py", template=str(tmp_path / "absent.j2")))


def test_super_renders_the_parent_block_as_shell(tmp_path: Path) -> None:
    template = write(
        tmp_path / "child.j2",
        '{% extends "hpclaunch/sbatch.sh.j2" %}\n'
        "{% block setup %}\n{{ super() }}echo after\n{% endblock %}\n",
    )
    script = render(JobSpec("t.py", setup=("module load a", "echo $X"), template=template))
    assert "\nmodule load a\necho $X\n\necho after\n" in script


def test_unlimited_time_is_written() -> None:
    from hpclaunch.job.values import parse_time

    assert "--time=UNLIMITED" in sbatch_lines(
        render(JobSpec("t.py", time_limit=parse_time("UNLIMITED")))
    )


def test_sbatch_quote_filter_refuses_line_breaks(tmp_path: Path) -> None:
    template = write(tmp_path / "t.j2", "#SBATCH --comment={{ spec.args[0] | sbatch_quote }}\n")
    with pytest.raises(TemplateError, match="line break"):
        render(JobSpec("t.py", args=("a\nb",), template=template))
    ok = write(tmp_path / "ok.j2", "#SBATCH --gpus={{ spec.gpus_per_node | sbatch_quote }}\n")
    assert render(JobSpec("t.py", gpus_per_node=2, template=ok)) == "#SBATCH --gpus=2\n"


def test_template_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "latin1.j2").write_bytes(b"caf\xe9\n")
    with pytest.raises(TemplateError, match="UnicodeDecodeError"):
        render(JobSpec("t.py", template=str(tmp_path / "latin1.j2")))


def test_percent_in_log_dir_is_not_a_slurm_pattern() -> None:
    script = render(JobSpec("t.py", log_dir="logs%j/"))
    assert "#SBATCH --output=logs%%j/%x-%j.out" in script
    assert 'export HPCLAUNCH_JOB_DIR="$SLURM_SUBMIT_DIR"/logs%j/"$SLURM_JOB_ID"' in script


def test_grace_periods_follow_the_signal_lead() -> None:
    argv = launch_words(render(JobSpec("t.py", signal_lead_s=40)))
    assert argv[argv.index("supervise") :].index("--grace-period") > 0
    supervisor_grace = argv[argv.index("--grace-period") + 1]
    agent = argv[argv.index("agent") :]
    assert (supervisor_grace, agent[agent.index("--grace-period") + 1]) == ("40", "30")
