"""What runs inside torch's elastic agent: the ranked c10d and the etcd v3 rendezvous,
per-rank logs, failure records. Every module here but this one and ``backends`` (the
pure backend table) imports torch; only ``hpclaunch.node.agent.launch`` (and torch
itself, through the entry point below) imports them."""

from __future__ import annotations

from typing import Any


def etcd_handler() -> Any:
    """The ``torchrun.handlers`` entry point ``hpclaunch-etcd``: torch calls it while
    it loads its rendezvous registry, for the function that creates the handler."""
    from hpclaunch.rendezvous.etcd_rdzv import create_handler

    return create_handler
