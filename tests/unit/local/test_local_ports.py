"""Free ports and connection probes on 127.0.0.1."""

from __future__ import annotations

import socket

from shardflow.local.ports import accepts_connections, free_port


def test_free_port_can_be_bound_on_loopback() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_accepts_connections_tells_listening_from_closed() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert accepts_connections(port)
    assert not accepts_connections(port)
