"""Is a local server answering HTTP yet?"""

from __future__ import annotations

import http.client

from shardflow.local.ports import LOOPBACK


def answers_http(port: int, *, timeout: float = 1.0) -> bool:
    """Whether an HTTP server on 127.0.0.1:``port`` answers a ``GET /`` (any status counts).

    The emulators reply to ``/`` with 200, 403 or 404; any reply means requests are served.
    """
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        connection.request("GET", "/")
        connection.getresponse().read()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
    return True
