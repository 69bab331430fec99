"""SLURM's dead ends explained: a pending job that can never start (the fields are as
the sandbox's SLURM 22.05 printed them), SLURM without a configuration, a partition
that does not exist, a rank that does not exist. SLURM scripted by FakeRunner; the
real commands in tests/integration/test_dead_ends.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpclaunch.cli import CliContext, main
from hpclaunch.cli.format import render_status
from hpclaunch.errors import SlurmError
from hpclaunch.jobdir.layout import JobFolder, RankFile
from hpclaunch.ops import deadends, follow
from hpclaunch.ops.logs import LogSelection, compress_ranks, follow_logs, show
from hpclaunch.ops.status import JobNotFound, JobStatus, gather
from hpclaunch.slurm.commands import (
    CommandResult,
    FakeRunner,
    Slurm,
    config_problem,
    parse_partitions,
    parse_show_job,
)

JOB = 7
# `scontrol show job` of `sbatch -N 8` on the sandbox's 4-node partition (trimmed).
PENDING_8 = """JobId=7 JobName=train
   JobState=PENDING Reason=PartitionNodeLimit Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A
   Partition=low AllocNode:Sid=localhost:27513
   NodeList=
   NumNodes=8-8 NumCPUs=8 NumTasks=8 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   Features=(null) DelayBoot=00:00:00
"""
PARTITION = """PartitionName=low
   AllocNodes=ALL Default=YES QoS=N/A
   MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED
   Nodes=n[1-4]
   State=UP TotalCPUs=16 TotalNodes=4 SelectTypeParameters=NONE
"""
NEVER_DEPENDENCY = """JobId=7 JobName=wrap
   JobState=PENDING Reason=DependencyNeverSatisfied Dependency=afterok:4(failed)
   Partition=low NumNodes=1-1
"""


def fields(text: str, **changes: str) -> dict[str, str]:
    return {**parse_show_job(text), **changes}


def test_more_nodes_than_the_partition_has_can_never_start() -> None:
    why = deadends.explain("PartitionNodeLimit", fields(PENDING_8), fields(PARTITION))
    assert why == (
        "it asks for 8 nodes and partition low has 4 (TotalNodes); "
        "submit again with --nodes within it"
    )


def test_more_nodes_than_the_partition_allows_can_never_start() -> None:
    job = fields(PENDING_8, NumNodes="3-3")
    why = deadends.explain("PartitionNodeLimit", job, fields(PARTITION, MaxNodes="2"))
    assert why is not None and "partition low allows 2 per job (MaxNodes)" in why
    why = deadends.explain(
        "PartitionNodeLimit", fields(PENDING_8, NumNodes="1"), fields(PARTITION, MinNodes="2")
    )
    assert why is not None and "needs 2 per job (MinNodes)" in why


def test_a_node_limit_within_the_partition_may_clear_later() -> None:
    # SLURM says PartitionNodeLimit too when enough of the partition's nodes are down.
    job = fields(PENDING_8, NumNodes="4-4")
    assert deadends.explain("PartitionNodeLimit", job, fields(PARTITION)) is None


@pytest.mark.parametrize(
    ("reason", "job", "part", "needle"),
    [
        (
            "DependencyNeverSatisfied",
            NEVER_DEPENDENCY,
            "",
            "dependency afterok:4(failed) can never",
        ),
        (
            "PartitionTimeLimit",
            PENDING_8.replace("TimeLimit=UNLIMITED", "TimeLimit=2-00:00:00"),
            PARTITION.replace("MaxTime=UNLIMITED", "MaxTime=1-00:00:00"),
            "over partition low's 1-00:00:00 (MaxTime); submit again with --time 1-00:00:00",
        ),
        (
            "BadConstraints",
            PENDING_8.replace("Features=(null)", "Features=h100"),
            "",
            "features it asks for (h100)",
        ),
        ("InvalidAccount", PENDING_8 + " Account=nope", "", "its account nope is not valid"),
        ("QOSMaxNodePerJobLimit", PENDING_8, "", "per-job limit of its QOS or association"),
    ],
)
def test_other_permanent_reasons_say_why(reason: str, job: str, part: str, needle: str) -> None:
    why = deadends.explain(reason, parse_show_job(job), parse_show_job(part))
    assert why is not None and needle in why


@pytest.mark.parametrize(
    "reason", ["Resources", "Priority", "Dependency", "ReqNodeNotAvail", "PartitionDown", None]
)
def test_reasons_that_may_clear_are_not_dead_ends(reason: str | None) -> None:
    assert deadends.explain(reason, fields(PENDING_8), fields(PARTITION)) is None
    fake = FakeRunner({})
    assert deadends.never_starts(JOB, reason, Slurm(fake)) is None
    assert fake.calls == []  # nothing asked of SLURM for them


def _pending_slurm() -> FakeRunner:
    def scontrol(argv: tuple[str, ...]) -> CommandResult:
        return CommandResult(argv, 0, PARTITION if argv[2] == "partition" else PENDING_8)

    return FakeRunner({"scontrol": scontrol})


def test_status_says_it_never_starts_and_why(tmp_path: Path) -> None:
    status = gather(JOB, Slurm(_pending_slurm()), {"HOME": str(tmp_path)}, tmp_path)
    assert status.pending_reason == "PartitionNodeLimit"
    assert status.never_starts is not None
    text = render_status(status)
    assert "  never starts:    it asks for 8 nodes and partition low has 4 (TotalNodes)" in text
    assert "cancel it: hpclaunch cancel 7" in text
    assert status.to_json()["never_starts"] == status.never_starts


def test_the_follow_loop_stops_on_a_job_that_never_starts() -> None:
    looks = 0

    def look() -> JobStatus:
        nonlocal looks
        looks += 1
        return JobStatus(JOB, state="PENDING", never_starts="it asks for 8 nodes")

    with pytest.raises(deadends.NeverStarts, match="job 7 can never start: it asks for 8"):
        follow.loop(look, lambda now: None, lambda s: None)
    assert looks == 1


def test_status_follow_exits_non_zero_with_the_reason(tmp_path: Path) -> None:
    obj = CliContext(slurm=Slurm(_pending_slurm()), cwd=tmp_path, env={"HOME": str(tmp_path)})
    result = CliRunner().invoke(
        main, ["status", "--follow", "--job-dir", str(tmp_path), "7"], obj=obj
    )
    assert result.exit_code == 1, result.output
    assert "state PENDING (PartitionNodeLimit)" in result.stderr  # the change line came first
    assert "Error: job 7 can never start: it asks for 8 nodes and partition low has 4" in (
        result.stderr
    )
    assert "hpclaunch cancel 7" in result.stderr


DNS_ERROR = """sinfo: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host
sinfo: error: fetch_config: DNS SRV lookup failed
sinfo: error: _establish_config_source: failed to fetch config
sinfo: fatal: Could not establish a configuration source
"""


def test_no_slurm_conf_says_which_variable_to_set() -> None:
    fake = FakeRunner({"sinfo": lambda a: CommandResult(a, 1, "", DNS_ERROR)})
    with pytest.raises(SlurmError) as caught:
        Slurm(fake, env={"PATH": "/usr/bin"}).node_states()
    message = str(caught.value)
    assert "SLURM_CONF is not set" in message and "set SLURM_CONF to the cluster's" in message
    assert "hpclaunch sandbox env" in message and "DNS SRV" not in message
    assert caught.value.stderr == DNS_ERROR  # kept for whoever wants SLURM's words


def test_a_slurm_conf_that_is_not_a_file_fails_at_once(tmp_path: Path) -> None:
    fake = FakeRunner({"sbatch": lambda a: CommandResult(a, 0, "1\n")})
    env = {"SLURM_CONF": str(tmp_path / "nope.conf")}
    with pytest.raises(SlurmError, match=r"SLURM_CONF=.*nope.conf is not a readable slurm.conf"):
        Slurm(fake, env=env).sbatch(tmp_path / "job.sbatch")
    assert fake.calls == []  # SLURM itself would retry it for a minute


def test_an_unparsable_slurm_conf_is_named() -> None:
    stderr = "sinfo: error: ClusterName needs to be specified\nsinfo: fatal: Unable to process configuration file\n"  # noqa: E501
    problem = config_problem(stderr, {"SLURM_CONF": "/etc/slurm/x.conf"})
    assert problem is not None and "SLURM_CONF=/etc/slurm/x.conf is not a readable" in problem
    assert config_problem("sbatch: error: Invalid partition name specified", {}) is None


def test_no_slurm_conf_is_one_clear_line_in_status(tmp_path: Path) -> None:
    fake = FakeRunner(
        {name: lambda a: CommandResult(a, 1, "", DNS_ERROR) for name in ("scontrol", "sacct")}
    )
    status = gather(JOB, Slurm(fake, env={}), {"HOME": str(tmp_path)}, tmp_path)
    assert (
        "scontrol: SLURM's commands found no configuration: SLURM_CONF is not set"
        in (status.notes[0])
    )


INVALID_PARTITION = (
    "sbatch: error: invalid partition specified: nope\n"
    "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
)


def test_an_invalid_partition_lists_the_ones_that_exist(tmp_path: Path) -> None:
    fake = FakeRunner(
        {
            "sbatch": lambda a: CommandResult(a, 1, "", INVALID_PARTITION),
            "sinfo": lambda a: CommandResult(a, 0, "low* 4 up\nhigh 4 up\ngpu 1 down\n"),
        }
    )
    with pytest.raises(SlurmError) as caught:
        Slurm(fake).sbatch(tmp_path / "job.sbatch")
    assert str(caught.value) == (
        "sbatch refused the partition 'nope': it does not exist (sbatch: error: invalid "
        "partition specified: nope). Partitions here: low (default, "
        "4 nodes), high (4 nodes), gpu (1 node, down); give one with --partition (or "
        "partition = in a profile), or leave it out for the default"
    )


def test_parse_partitions_of_nothing() -> None:
    assert parse_partitions("") == "none"


def _ranks(folder: Path, requeue: int, ranks: range) -> None:
    attempt = JobFolder(folder).attempt(requeue, "0", 0)
    attempt.path.mkdir(parents=True)
    for rank in ranks:
        attempt.rank_file(rank, RankFile.OUT).write_text(f"rank {rank}\n")


def test_a_rank_that_does_not_exist_lists_those_that_do(tmp_path: Path) -> None:
    _ranks(tmp_path, 0, range(4))
    _ranks(tmp_path, 1, range(2))
    status = JobStatus(JOB, state="RUNNING", job_dir=str(tmp_path))
    with pytest.raises(JobNotFound) as caught:
        show(LogSelection(rank=9), status, lambda parts: None)
    assert (
        str(caught.value)
        == "job 7 has no rank 9 (from --rank): its ranks are 0-3; give one of them"
    )
    written: list[str] = []
    show(LogSelection(rank=3), status, written.extend)
    assert "rank 3\n" in "".join(written)


def test_following_a_rank_the_job_does_not_have_stops_once_every_node_noted_its_own(
    tmp_path: Path,
) -> None:
    attempt = JobFolder(tmp_path).attempt(0, "0", 0)
    attempt.path.mkdir(parents=True)
    attempt.write_node_ranks("n1", [0, 1])
    running = JobStatus(JOB, state="RUNNING", job_dir=str(tmp_path), nodes=["n1", "n2"], requeues=0)
    looks = 0

    def look() -> JobStatus:
        nonlocal looks
        looks += 1
        if looks == 2:  # n2's agent starts: now every rank of the job is known
            attempt.write_node_ranks("n2", [2, 3])
        return running

    with pytest.raises(JobNotFound) as caught:
        follow_logs(
            LogSelection(rank=9), running, look, lambda parts: None, print, sleep=lambda s: None
        )
    assert looks == 2  # waited while n2's ranks were unknown, not after
    assert str(caught.value) == (
        "job 7 has no rank 9 (from --rank): its ranks are 0-3; give one of them"
    )
    assert LogSelection(rank=3).absent_rank(tmp_path, running) == []  # one it has
    assert LogSelection(rank=9, node="n1").absent_rank(tmp_path, running) == []


def test_a_rank_that_may_still_come_is_followed(tmp_path: Path) -> None:
    attempt = JobFolder(tmp_path).attempt(0, "0", 0)
    attempt.path.mkdir(parents=True)
    for node, ranks in {"n1": [0, 1], "n2": [2, 3], "n3": [4, 5]}.items():
        attempt.write_node_ranks(node, ranks)
    selection = LogSelection(rank=3)

    def running(nodes: list[str], requeues: int | None = 0) -> JobStatus:
        return JobStatus(
            JOB, state="RUNNING", job_dir=str(tmp_path), nodes=nodes, requeues=requeues
        )

    # a --no-kill job that lost n2 keeps rank 3's logs, and its next attempt has a rank 3
    assert selection.absent_rank(tmp_path, running(["n1", "n3"])) == []
    # a requeued run whose agents have not noted their ranks yet: the old run's don't count
    assert LogSelection(rank=7).absent_rank(tmp_path, running(["n1", "n2"], 1)) == []
    assert LogSelection(rank=7).absent_rank(tmp_path, running(["n1", "n2", "n3"], None)) == []
    assert LogSelection(rank=7).absent_rank(tmp_path, running(["n1", "n2", "n3"])) == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]


def test_a_followed_job_that_ended_without_the_log_asked_for_says_so(tmp_path: Path) -> None:
    ended = JobStatus(JOB, state="COMPLETED", job_dir=str(tmp_path))  # nodes unknown
    with pytest.raises(JobNotFound) as caught:
        follow_logs(
            LogSelection(rank=9),
            ended,
            lambda: ended,
            lambda parts: None,
            print,
            sleep=lambda s: None,
        )
    assert str(caught.value) == "job 7 has no log of that rank or node yet"


def test_compress_ranks() -> None:
    assert compress_ranks([0, 1, 2, 3, 6, 8, 9]) == "0-3, 6, 8-9"


def test_a_job_free_to_run_in_several_partitions_is_not_a_dead_end() -> None:
    """Only the first partition's limits would be checked: another may take the job."""

    def scontrol(argv: tuple[str, ...]) -> CommandResult:
        job = PENDING_8.replace("Partition=low", "Partition=low,big")
        return CommandResult(argv, 0, PARTITION if argv[2] == "partition" else job)

    assert (
        deadends.never_starts(JOB, "PartitionNodeLimit", Slurm(FakeRunner({"scontrol": scontrol})))
        is None
    )
