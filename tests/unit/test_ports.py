"""A taken rendezvous port: recognised in torch's errors, its holder found in /proc."""

from __future__ import annotations

import os
import socket

from hpclaunch.node import ports


def test_the_cause_is_found_down_the_chain() -> None:
    bind = RuntimeError(
        "The server socket has failed to listen on any local network address. port: 15123, "
        "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    )
    try:
        try:
            raise bind
        except RuntimeError as exc:
            raise ValueError("The connection to the C10d store has failed.") from exc
    except ValueError as outer:
        assert ports.in_use(outer)
    assert not ports.in_use(ValueError("The connection to the C10d store has failed."))
    assert ports.in_use(OSError(98, "Address already in use"))


def test_the_listener_is_named() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        assert ports.listeners(port) == []  # bound, not listening yet
        held.listen()
        named = ports.listeners(port)
    assert len(named) == 1 and named[0].startswith(f"pid {os.getpid()} ("), named
    message = ports.taken(port, "n1", named)
    assert message.startswith(f"the rendezvous port {port} on n1 (the first node) is already")
    assert f"in use by {named[0]};" in message
    assert "--master-port PORT" in message
    assert "by another process" in ports.taken(port, "n1", [])
