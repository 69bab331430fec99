"""``hpclaunch sandbox ...``: commands over ``Sandbox``; library errors become
messages and exit codes here."""

from __future__ import annotations

import json
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from hpclaunch.cli.context import fail
from hpclaunch.errors import HpclaunchError

if TYPE_CHECKING:
    from hpclaunch.sandbox.cluster import Sandbox


@click.group()
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="HPCLAUNCH_SANDBOX_DIR",
    show_envvar=True,
    help="Folder holding the sandbox's state. [default: ~/.cache/hpclaunch/sandbox]",
)
@click.pass_context
def sandbox(ctx: click.Context, state_dir: Path | None) -> None:
    """A real SLURM cluster on this machine, for trying jobs and failures."""
    from hpclaunch.sandbox.cluster import Sandbox, default_state_dir

    ctx.obj = Sandbox((state_dir or default_state_dir()).absolute())


@sandbox.command()
@click.option(
    "--nodes",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="How many nodes (slurmd daemons) the cluster has.",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(0, 16),
    default=0,
    show_default=True,
    help="Fake GPUs (GRES) per node: CUDA_VISIBLE_DEVICES appears in jobs.",
)
@click.option(
    "--partitions",
    type=click.Choice(["default", "preempt"]),
    default="default",
    show_default=True,
    help="preempt: partitions low (default) and high, which preempts low by requeueing.",
)
@click.option(
    "--mode",
    type=click.Choice(["auto", "netns", "loopback"]),
    default="auto",
    show_default=True,
    help="netns: a network namespace per node; loopback: all slurmd on 127.0.0.1.",
)
@click.pass_obj
def up(box: Sandbox, nodes: int, gpus_per_node: int, partitions: str, mode: str) -> None:
    """Start the sandbox (or keep the one that is up) and print how to use it."""
    from hpclaunch.sandbox.cluster import check_prerequisites
    from hpclaunch.sandbox.conf import Mode, Partitions, SandboxSpec

    def interrupted(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)  # unwinds through up, which tears down what it started

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)
    try:
        check_prerequisites()
        spec = SandboxSpec(nodes, gpus_per_node, Partitions(partitions), Mode(mode))
        lay = box.up(spec)
    except HpclaunchError as exc:
        fail(exc)
    count = f"{len(lay.nodes)} node{'s' if len(lay.nodes) != 1 else ''}"
    click.echo(
        f"sandbox up: {count} ({lay.mode.value} mode); to use it:\n"
        f'  eval "$(hpclaunch sandbox --state-dir {shlex.quote(str(box.state_dir))} env)"',
        err=True,
    )


@sandbox.command()
@click.pass_obj
def down(box: Sandbox) -> None:
    """Stop every process of the sandbox; remove its namespaces and links."""
    try:
        left = box.down()
    except HpclaunchError as exc:
        fail(exc)
    if left:
        click.echo(f"Error: could not remove: {', '.join(left)}", err=True)
        sys.exit(1)


@sandbox.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.pass_obj
def status(box: Sandbox, as_json: bool) -> None:
    """Show the daemons and each node's state."""
    try:
        info: dict[str, Any] = box.status()
    except HpclaunchError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    elif "mode" not in info:
        click.echo(f"no sandbox in {info['state_dir']}")
    else:
        health = "up" if info["up"] else f"DEGRADED (not running: {', '.join(info['dead'])})"
        click.echo(f"sandbox {health} ({info['mode']} mode), {info['state_dir']}")
        for name, node in info["nodes"].items():
            flag = "" if node["responding"] else " (not responding)"
            click.echo(f"  {name:<4} {node['addr']:<15} {node['switch']:<6} {node['state']}{flag}")
    # 0: up and healthy; 1: no sandbox or a degraded one.
    sys.exit(0 if info["up"] else 1)


@sandbox.command()
@click.pass_obj
def env(box: Sandbox) -> None:
    """Print the export line that points SLURM's commands at the sandbox."""
    try:
        values = box.env()
    except HpclaunchError as exc:
        fail(exc)
    for key, value in values.items():
        click.echo(f"export {key}={shlex.quote(value)}")


def _node_command(name: str, doc: str, act: Callable[[Sandbox, str], None]) -> None:
    @sandbox.command(name=name, help=doc)
    @click.argument("node")
    @click.pass_obj
    def command(box: Sandbox, node: str) -> None:
        try:
            act(box, node)
        except HpclaunchError as exc:
            fail(exc)


def _scontrol(action: str) -> Callable[[Sandbox, str], None]:
    def act(box: Sandbox, node: str) -> None:
        from hpclaunch.sandbox.cluster import NodeAction

        box.set_node_state(node, NodeAction(action), f"hpclaunch sandbox {action.lower()}")

    return act


_node_command(
    "kill-node",
    "Kill NODE's slurmd and every process on it, as a crash would.",
    lambda box, node: box.kill_node(node),
)
_node_command(
    "start-node",
    "Start a killed NODE again; resume it if it was marked DOWN.",
    lambda box, node: box.start_node(node),
)
_node_command(
    "cut-node", "Cut NODE off the network (netns mode).", lambda box, node: box.cut_node(node)
)
_node_command("heal-node", "Reconnect a cut NODE.", lambda box, node: box.cut_node(node, heal=True))
_node_command(
    "down-node",
    "Mark NODE DOWN through scontrol (what SLURM does to a dead node).",
    _scontrol("DOWN"),
)
_node_command(
    "drain-node", "Drain NODE through scontrol: no new jobs start there.", _scontrol("DRAIN")
)
_node_command("resume-node", "Return a DOWN or drained NODE to service.", _scontrol("RESUME"))
_node_command(
    "restart-node",
    "Restart NODE's slurmd as an administrator does; the node's jobs go on running.",
    lambda box, node: box.restart_node(node),
)


@sandbox.command(name="stop-controller")
@click.pass_obj
def stop_controller(box: Sandbox) -> None:
    """Stop slurmctld, as for an upgrade: it saves its state first, jobs go on running,
    and SLURM's commands fail until start-controller."""
    try:
        box.stop_controller()
    except HpclaunchError as exc:
        fail(exc)


@sandbox.command(name="start-controller")
@click.pass_obj
def start_controller(box: Sandbox) -> None:
    """Start a stopped slurmctld with the jobs and queue it saved; return once it answers."""
    try:
        box.start_controller()
    except HpclaunchError as exc:
        fail(exc)
