"""Free TCP ports on the loopback interface."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """Return a TCP port that nothing listens on at 127.0.0.1 right now.

    The port is only free at the moment of the call: a server started with it may still lose a
    race with another process, which is why servers retry with a new port when their bind fails.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def accepts_connections(port: int, *, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
