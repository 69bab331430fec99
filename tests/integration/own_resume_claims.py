"""What a job that checkpoints its own way really did, and whether what hpclaunch said
about its lost work is true: pure functions of the script's own step notes (the ground
truth) and of hpclaunch's outputs, so tests/unit can feed them recorded or made-up texts.

The ground truth is the ``steps.jsonl`` each script of test_own_resume.py writes from
global rank 0, one JSON object a line: ``{"run": R, "resumed": S, "params": [...]}``
when run R starts from the S steps its checkpoint held (0: a fresh start) with those
parameters; ``{"run": R, "step": N, "t": T, "params": [...]}`` when it completes its
N-th optimizer step in the job's count at time T; ``{"run": R, "done": N, "params":
[...]}`` at the end. A run is the job's ``SLURM_RESTART_COUNT``, hpclaunch's requeue
count.

The claims are judged against the contract the reporting side keeps:
``status --json``'s ``lost_work`` is a list of ``{"requeue", "steps", "resumed",
"resumed_by", "repeats", "text"}`` (``steps``: the run's steps done in the job's count
when it ended; ``resumed``: the step the next run resumed from; ``repeats``: the steps
done twice; null where unknown) and its ``goodput`` has ``lost_s`` and ``unknown_s``.
A ``lost work:`` line that gives a number of repeated steps says ``repeats N step(s)``
or ``repeated N step(s)``; one whose resume point is unknown says ``unknown``."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# Seconds a clock reading of hpclaunch's (a progress sample, an agent's note) may lie
# from the script's own ``time.time()`` around the same step: both are taken on the same
# machine, but each after its own scheduling delay on a loaded 2-core host.
CLOCK_SLACK_S = 0.5


@dataclass(frozen=True)
class Run:
    """One run of the job as the script saw it."""

    run: int
    resumed: int  # the steps its checkpoint held when it started (0: a fresh start)
    started: float  # when it noted its start (before its first step)
    steps: dict[int, float] = field(default_factory=dict)  # step N -> when it completed
    params: dict[int, list[float]] = field(default_factory=dict)  # step N -> after it
    done: int | None = None  # the steps done at its end; None: it did not end by itself
    world_size: int | None = None
    loaded: list[float] = field(default_factory=list)  # the parameters it started from

    @property
    def last(self) -> int:
        """The steps done (in the job's count) when it stopped: its last step's number,
        or where it resumed if it completed none."""
        return max(self.steps, default=self.resumed)


@dataclass(frozen=True)
class Truth:
    """Every run of a job, from its ``steps.jsonl``."""

    runs: dict[int, Run]

    @classmethod
    def parse(cls, text: str) -> Truth:
        """Raises ValueError for a line that is not one of the script's notes (a run's
        step before its start, a second start of a run, an unknown shape)."""
        runs: dict[int, Run] = {}
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            note = json.loads(line)
            run = int(note["run"])
            if "resumed" in note:
                if run in runs:
                    raise ValueError(f"line {number}: run {run} started twice (in place?)")
                size, loaded = note.get("world_size"), list(note.get("params", []))
                runs[run] = Run(
                    run, int(note["resumed"]), float(note["t"]), world_size=size, loaded=loaded
                )
                continue
            if run not in runs:
                raise ValueError(f"line {number}: run {run} noted a step before its start")
            if "step" in note:
                runs[run].steps[int(note["step"])] = float(note["t"])
                runs[run].params[int(note["step"])] = list(note.get("params", []))
            elif "done" in note:
                runs[run] = replace(runs[run], done=int(note["done"]))
            else:
                raise ValueError(f"line {number}: not a note of the script's: {line!r}")
        return cls(runs)

    def requeued(self) -> list[int]:
        """The runs that another run followed (those whose work may have been lost)."""
        return [r for r in sorted(self.runs) if r + 1 in self.runs]

    def resumed_after(self, run: int) -> int:
        """The step the run after ``run`` resumed from."""
        return self.runs[run + 1].resumed

    def repeats(self, run: int) -> int:
        """The steps ``run`` did that the next run did again."""
        return max(0, self.runs[run].last - self.resumed_after(run))

    def redone_s(self, run: int) -> float:
        """The time ``run`` spent on the steps the next run did again: from the end of
        the step the next run resumed from (or ``run``'s start, if that step is not
        ``run``'s) to the end of ``run``'s last step."""
        this = self.runs[run]
        if self.repeats(run) == 0:
            return 0.0
        since = this.steps.get(self.resumed_after(run), this.started)
        return this.steps[this.last] - since

    def step_s(self) -> float:
        """The median time between two steps of one run (the scripts' padding and work)."""
        gaps = sorted(
            t - run.steps[n - 1]
            for run in self.runs.values()
            for n, t in run.steps.items()
            if n - 1 in run.steps
        )
        return gaps[len(gaps) // 2] if gaps else 0.0


@dataclass(frozen=True)
class Said:
    """What hpclaunch said about the job."""

    status_json: Mapping[str, Any]  # hpclaunch status --json JOBID
    status_text: str  # hpclaunch status JOBID
    follow_text: str  # hpclaunch sbatch --follow's stderr
    batch_log: str  # LOG_DIR/NAME-JOBID.out


REPEATS = re.compile(r"\b(?:repeats|repeated) (\d+) steps?\b")
NOTHING_REPEATED = re.compile(r"\bnothing is repeated\b|\brepeats no steps?\b")
FROM_STEP = re.compile(r"\bfrom step (\d+)\b")
DID = re.compile(r"\bdid (\d+) steps?\b")
RUN = re.compile(r"\brun (\d+)\b")
# A line said before the next run resumed, that says its count is not known yet: true when
# said, so not a claim of a number; the same place must then say the number (below).
NOT_YET = re.compile(r"\bunknown until it resumes\b")
DURATION = r"((?:\d+ d )?(?:\d+ h )?(?:\d+ min )?\d+ s)"


def seconds(text: str) -> float:
    """``4 min 18 s`` (hpclaunch.record.goodput.duration's form) in seconds."""
    units = {"d": 86400, "h": 3600, "min": 60, "s": 1}
    return float(sum(int(n) * units[u] for n, u in re.findall(r"(\d+) (d|h|min|s)\b", text)))


def claim_lines(said: Said) -> list[tuple[str, str]]:
    """Every line that says something of lost work, as (where, the line): each
    ``lost work:`` line of status, ``--follow`` and the batch log, hpclaunch's
    ``warning:`` and ``note:`` lines there (the never-saved one says where a next run
    starts; the batch log's other lines are the script's), and the ``text`` of each
    ``--json`` entry and its ``notes``; each from ``lost work:``, ``warning:`` or
    ``note:`` on, its spaces made single."""
    found = []
    for where, text, prefix in (
        ("status", said.status_text, ""),
        ("--follow", said.follow_text, ""),
        ("batch log", said.batch_log, "supervisor: "),
    ):
        for line in text.splitlines():
            for mark, start in (
                ("lost work:", "lost work:"),
                (f"{prefix}warning:", "warning:"),
                (f"{prefix}note:", "note:"),
            ):
                if mark in line:  # from there on: the time and job prefixes are not claims
                    found.append((where, " ".join(line[line.index(start) :].split())))
                    break
    for entry in _entries(said):
        if isinstance(entry, Mapping) and isinstance(entry.get("text"), str):
            found.append(("status --json", f"lost work: {entry['text']}"))
    notes = said.status_json.get("notes")
    for note in notes if isinstance(notes, list) else []:
        found.append(("status --json", f"note: {note}"))
    return found


def _entries(said: Said) -> list[Any]:
    entries = said.status_json.get("lost_work")
    return entries if isinstance(entries, list) else []


def line_falsehoods(where: str, line: str, truth: Truth, *, visible: bool) -> list[str]:
    """What is false in one line about lost work. A line that names no run speaks of
    every requeued one. ``visible``: hpclaunch can see where each run resumed (so a
    ``lost work:`` line must give the true count); otherwise each says unknown and
    states no count and no resume step."""
    requeued = truth.requeued()
    lost = "lost work:" in line
    named = RUN.search(line)
    runs = [int(named.group(1))] if named else requeued
    wrong = [
        f"{where}: {line!r}: run {r} was not requeued" for r in runs if lost and r not in requeued
    ]
    runs = [r for r in runs if r in requeued]
    for run in runs:
        repeats, resumed, did = truth.repeats(run), truth.resumed_after(run), truth.runs[run].last
        said_repeats = [int(n) for n in REPEATS.findall(line)]
        said_repeats += [0] if NOTHING_REPEATED.search(line) else []
        for n in said_repeats:
            if n != repeats:
                wrong.append(f"{where}: {line!r}: run {run} repeated {repeats}, not {n}")
        for n in map(int, FROM_STEP.findall(line)):
            if n != resumed:
                wrong.append(f"{where}: {line!r}: the run after {run} resumed from {resumed}")
        for n in map(int, DID.findall(line)):
            if n != did:
                wrong.append(f"{where}: {line!r}: run {run} did {did} steps, not {n}")
        if lost and visible and repeats not in said_repeats and not NOT_YET.search(line):
            wrong.append(f"{where}: {line!r}: does not say the {repeats} repeated steps")
        if lost and not visible:
            if "unknown" not in line:
                wrong.append(f"{where}: {line!r}: the resume point is unknown; it does not say so")
            if said_repeats or FROM_STEP.search(line):
                wrong.append(f"{where}: {line!r}: states a number where it cannot know one")
    return wrong


def entry_falsehoods(said: Said, truth: Truth, *, visible: bool) -> list[str]:
    """What is false, or missing, in ``status --json``'s ``lost_work``: one entry per
    requeued run, each number null or true, null where hpclaunch cannot see it."""
    wrong = []
    entries = _entries(said)
    if not isinstance(said.status_json.get("lost_work"), list):
        wrong.append(f"status --json: no lost_work list: {said.status_json.get('lost_work')!r}")
    keys = {"requeue", "steps", "resumed", "resumed_by", "repeats", "text"}
    by_run: dict[int, list[Mapping[str, Any]]] = {}
    for entry in entries:
        if not isinstance(entry, Mapping) or not keys <= set(entry):
            wrong.append(f"status --json: lost_work entry {entry!r} lacks {sorted(keys)}")
            continue
        by_run.setdefault(entry["requeue"], []).append(entry)
    for run in sorted(by_run):
        if run not in truth.requeued():
            wrong.append(f"status --json: lost_work of run {run}, which was not requeued")
    for run in truth.requeued():
        told = by_run.get(run, [])
        if len(told) != 1:
            wrong.append(f"status --json: {len(told)} lost_work entries for run {run}, not 1")
            continue
        [entry] = told
        true = {
            "steps": truth.runs[run].last,
            "resumed": truth.resumed_after(run),
            "repeats": truth.repeats(run),
        }
        for key, value in true.items():
            if entry[key] is not None and entry[key] != value:
                wrong.append(f"status --json: run {run}'s {key} is {entry[key]!r}, not {value}")
        for key in ("resumed", "repeats"):
            if visible and entry[key] is None:
                wrong.append(f"status --json: run {run}'s {key} is null; it is {true[key]}")
            if not visible and entry[key] is not None:
                wrong.append(f"status --json: run {run}'s {key} is {entry[key]!r}: not seen")
        if (entry["resumed"] is None) != (entry["resumed_by"] is None):
            wrong.append(f"status --json: run {run}: resumed and resumed_by disagree: {entry}")
    return wrong


def goodput_falsehoods(said: Said, truth: Truth, *, visible: bool) -> list[str]:
    """What is false in goodput: the time of the steps done twice must be in ``lost``
    (``visible``) or ``unknown`` (not), not in productive training; ``lost`` must not
    exceed it by more than one step (the step SIGTERM cut short, also done in vain)
    plus CLOCK_SLACK_S. The same for the ``goodput:`` line of status."""
    wrong = []
    redone = sum(truth.redone_s(r) for r in truth.requeued())
    slack = truth.step_s() + CLOCK_SLACK_S
    most_lost = redone + slack if visible else slack
    found = said.status_json.get("goodput")
    split: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    for key in ("lost_s", "unknown_s"):
        if not isinstance(split.get(key), (int, float)):
            wrong.append(f"status --json: goodput has no {key}: {found!r}")
    lost, unknown = split.get("lost_s"), split.get("unknown_s")
    if isinstance(lost, (int, float)) and lost > most_lost:
        wrong.append(
            f"goodput: lost {lost:.1f} s where {redone:.1f} s of steps were redone"
            + ("" if visible else " and the resume point is unknown")
            + f" (allowed {most_lost:.1f} s)"
        )
    if isinstance(lost, (int, float)) and isinstance(unknown, (int, float)):
        kept = unknown if not visible else lost + unknown
        if kept < redone - CLOCK_SLACK_S:
            part = "unknown" if not visible else "lost + unknown"
            wrong.append(
                f"goodput: {part} is {kept:.1f} s: {redone:.1f} s of steps were redone, "
                "which the rest counts as kept"
            )
    lines = [line for line in said.status_text.splitlines() if "goodput:" in line]
    if not lines:
        wrong.append("status: no goodput: line")
    for line in lines:
        found = re.search(rf"\blost {DURATION}", line)
        # The line rounds to whole seconds and shows parts of 0.5 s or more.
        if found and seconds(found.group(1)) > most_lost + 0.5:
            wrong.append(f"status: {line.strip()!r}: lost is at most {most_lost:.1f} s")
        if not visible and redone >= 1 and "unknown" not in line:
            wrong.append(f"status: {line.strip()!r}: {redone:.1f} s redone are not unknown")
    return wrong


def falsehoods(truth: Truth, said: Said, *, visible: bool) -> list[str]:
    """Everything false or missing in what hpclaunch said of the job's lost work, each
    as a sentence naming where it was said; empty when all of it is true.

    ``visible``: hpclaunch can see where each run resumed (an Adam-family optimizer's
    restored step count, a framework's counter), so it must say the true count;
    otherwise (plain SGD restoring its own snapshot) every line says unknown."""
    wrong = entry_falsehoods(said, truth, visible=visible)
    lines = claim_lines(said)
    for where in ("status", "--follow", "batch log"):
        told = [line for w, line in lines if w == where and "lost work:" in line]
        if not told:
            wrong.append(f"{where}: no lost work: line")
        elif visible and all(NOT_YET.search(line) for line in told):
            wrong.append(f"{where}: only says the lost work is not known yet, never the count")
    for where, line in lines:
        wrong += line_falsehoods(where, line, truth, visible=visible)
    return wrong + goodput_falsehoods(said, truth, visible=visible)


def resume_problems(truth: Truth, *, steps: int, save_every: int, world_size: int) -> list[str]:
    """What shows that the script did not resume from its own checkpoint as it should:
    every run but the first resumed from a checkpoint of the one before (a multiple of
    ``save_every``, after step 0, at most its last step) and not from 0; each run did its
    steps in order from there; the last ended at ``steps``; each requeued run repeats at
    least one step (the requeue came between two checkpoints); it started from the
    parameters the run before had after that step; and each step done twice left the
    same parameters both times (the checkpoint restored everything the step depends on,
    so from there the run is the one nothing interrupted)."""
    problems = []
    runs = [truth.runs[r] for r in sorted(truth.runs)]
    if [r.run for r in runs] != list(range(len(runs))) or len(runs) < 2:
        problems.append(f"runs {[r.run for r in runs]}: not 0, 1, ...")
    for run in runs:
        if run.world_size != world_size:
            problems.append(f"run {run.run}: world size {run.world_size}, not {world_size}")
        if sorted(run.steps) != list(range(run.resumed + 1, run.last + 1)):
            problems.append(f"run {run.run}: steps {sorted(run.steps)} from {run.resumed}")
    if runs and runs[0].resumed != 0:
        problems.append(f"run 0 resumed from {runs[0].resumed}")
    for before, after in itertools.pairwise(runs):
        at = after.resumed
        if at <= 0 or at % save_every or at > before.last:
            problems.append(
                f"run {after.run} resumed from {at}: not a checkpoint of run {before.run}"
            )
        if truth.repeats(before.run) < 1:
            problems.append(f"run {before.run} ended on a checkpoint: nothing was redone")
        if at in before.params and _gap(before.params[at], after.loaded) > PARAMS_TOLERANCE:
            problems.append(f"run {after.run} did not start from run {before.run}'s step {at}")
        for step in sorted(set(before.steps) & set(after.steps)):
            gap = _gap(before.params[step], after.params[step])
            if gap > PARAMS_TOLERANCE:
                problems.append(f"step {step}: parameters differ by {gap} between runs")
    if runs and runs[-1].done != steps:
        problems.append(f"the last run ended at {runs[-1].done}, not {steps}")
    return problems


# DDP resumes are not always bit-exact (gradient buckets re-laid): what the same step
# left may differ by rounding. Here (2 ranks, tiny models) they have been identical.
PARAMS_TOLERANCE = 1e-6


def _gap(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) for x, y in zip(a, b, strict=True))
